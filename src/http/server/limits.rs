//! What one client may hold: the `Limits` of the accept loop, the request-concurrency
//! limit (tower's, 503 at once), the exporter-toolkit `rate_limit` (429) and the cap on
//! open connections, which closes the oldest idle one rather than refuse a fresh scrape.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::Notify;
use tower::util::BoxCloneService;
use tower::{BoxError, Service, ServiceBuilder};
use tracing::warn;

use super::reply::plain;
use crate::base::sync::lock;

/// `--web.max-requests` default, as node_exporter's.
pub const DEFAULT_MAX_REQUESTS: usize = 40;

/// What one client may hold. The defaults suit an agent scraped every few seconds by a
/// handful of Prometheus servers.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests served at once; beyond this a request gets 503 at once, never queued
    /// (a queued scrape would only time out later). 0: no limit.
    pub max_requests: usize,
    /// Open connections. At the cap, the oldest connection with no request in flight
    /// (idle, half-sent or still in its TLS handshake) is closed for the new one, so
    /// piling up connections cannot lock out a fresh scrape.
    pub max_connections: usize,
    /// Time allowed for a TLS handshake and for each request head, counted from the
    /// moment the server waits for it: against slowloris, and the keep-alive idle
    /// timeout as well (hyper waits for the next head under the same timer).
    pub header_read_timeout: Duration,
    /// Request line plus headers; larger gets 431.
    pub max_header_bytes: usize,
    /// After the listener is closed, how long open connections may finish.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_requests: DEFAULT_MAX_REQUESTS,
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

/// A request as the server's stack handles it; the error is never: every refusal is an answer.
pub(super) type Requests<B = Incoming> = BoxCloneService<Request<B>, Response<Body>, Infallible>;

/// `inner` behind at most `max` requests in flight (0: no limit). Beyond it a request is
/// answered 503 at once, never queued: a queued scrape would only time out later. The
/// permit is held until `inner`'s response is ready, not while a slow client reads the
/// body: the limit bounds the work of producing answers, and a slow reader must not lock
/// out others.
pub(super) fn limit_requests<B, S>(max: usize, inner: S) -> Requests<B>
where
    B: Send + 'static,
    S: Service<Request<B>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    if max == 0 {
        return BoxCloneService::new(inner);
    }
    // load_shed turns "not ready" (no permit left) into an error at once, and that error
    // into the 503 here; it can be nothing else, as `inner` never fails.
    let refuse = move |_: BoxError| async move {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("limit of concurrent requests reached ({max}), try again later\n"),
        )
    };
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(refuse))
            .load_shed()
            .concurrency_limit(max)
            .service(inner),
    )
}

/// The toolkit's `rate_limit`: a token bucket of `burst` requests refilled one per
/// `interval`, over all clients. Beyond it: 429.
pub(super) struct RateLimiter {
    per_token: Duration,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(burst: u32, interval: Duration) -> RateLimiter {
        let burst = f64::from(burst);
        RateLimiter {
            per_token: interval,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    pub fn allow(&self) -> bool {
        let mut st = lock(&self.state);
        let now = Instant::now();
        let refill = now.duration_since(st.1).as_secs_f64() / self.per_token.as_secs_f64();
        st.0 = (st.0 + refill).min(self.burst);
        st.1 = now;
        if st.0 >= 1.0 {
            st.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The open connections, oldest first, with whether each is serving a request.
#[derive(Default)]
pub(super) struct Conns {
    table: Arc<Mutex<ConnTable>>,
}

#[derive(Default)]
struct ConnTable {
    next_id: u64,
    open: BTreeMap<u64, Arc<ConnState>>,
    last_warning: Option<Instant>,
}

#[derive(Default)]
pub(super) struct ConnState {
    /// Requests being answered on this connection (0 or 1 without pipelining).
    busy: AtomicUsize,
    pub evict: Notify,
}

/// Keeps a connection in the table; dropped when the connection ends.
pub(super) struct ConnGuard {
    table: Arc<Mutex<ConnTable>>,
    id: u64,
    pub state: Arc<ConnState>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        lock(&self.table).open.remove(&self.id);
    }
}

/// Marks a connection as answering a request, so that it is not evicted meanwhile.
pub(super) struct Busy(Arc<ConnState>);

impl Busy {
    pub fn new(s: Arc<ConnState>) -> Busy {
        s.busy.fetch_add(1, Ordering::Relaxed);
        Busy(s)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnTable {
    /// Closes the oldest connection that is not answering a request; false if none.
    fn evict_oldest_idle(&mut self) -> bool {
        let victim = self
            .open
            .iter()
            .find(|(_, s)| s.busy.load(Ordering::Relaxed) == 0)
            .map(|(id, _)| *id);
        match victim.and_then(|id| self.open.remove(&id)) {
            Some(s) => {
                s.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn warn_throttled(&mut self, msg: &str) {
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10))
        {
            self.last_warning = Some(now);
            warn!("{msg}");
        }
    }
}

impl Conns {
    /// Registers a new connection, first closing the oldest idle one at the cap. None
    /// (refuse the newcomer) only when every open connection is answering a request.
    pub fn open(&self, cap: usize) -> Option<ConnGuard> {
        let mut t = lock(&self.table);
        if t.open.len() >= cap {
            if !t.evict_oldest_idle() {
                t.warn_throttled(
                    "connection limit reached and every connection is busy; refusing a new one",
                );
                return None;
            }
            t.warn_throttled(&format!(
                "connection limit ({cap}) reached; closing the oldest idle connections for new ones"
            ));
        }
        let id = t.next_id;
        t.next_id += 1;
        let state = Arc::new(ConnState::default());
        t.open.insert(id, Arc::clone(&state));
        Some(ConnGuard {
            table: Arc::clone(&self.table),
            id,
            state,
        })
    }

    pub fn evict_oldest_idle(&self) {
        lock(&self.table).evict_oldest_idle();
    }

    pub fn warn_throttled(&self, msg: &str) {
        lock(&self.table).warn_throttled(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;
    use tower::ServiceExt as _;

    #[test]
    fn beyond_max_requests_503_at_once_until_a_permit_is_free() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let gate = Arc::new(tokio::sync::Semaphore::new(0));
            let g = Arc::clone(&gate);
            let svc = limit_requests(
                1,
                tower::service_fn(move |_req: Request<Body>| {
                    let g = Arc::clone(&g);
                    async move {
                        let _ = g.acquire().await;
                        Ok::<_, Infallible>(Response::new(Body::empty()))
                    }
                }),
            );
            let first = tokio::spawn(svc.clone().oneshot(Request::new(Body::empty())));
            tokio::task::yield_now().await;
            let busy = svc
                .clone()
                .oneshot(Request::new(Body::empty()))
                .await
                .unwrap();
            assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(
                busy.headers()[header::CONTENT_TYPE],
                "text/plain; charset=utf-8"
            );
            let body = axum::body::to_bytes(busy.into_body(), 1024).await.unwrap();
            assert_eq!(
                &body[..],
                b"limit of concurrent requests reached (1), try again later\n"
            );
            gate.add_permits(2);
            assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
            let next = svc.oneshot(Request::new(Body::empty())).await.unwrap();
            assert_eq!(next.status(), StatusCode::OK, "the permit came back");
        });
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let conns = Conns::default();
        let a = conns.open(2).unwrap();
        let b = conns.open(2).unwrap();
        let _busy = Busy::new(Arc::clone(&a.state));
        let c = conns.open(2).unwrap();
        // `a` is busy, so `b` (the oldest idle) went.
        let open: Vec<u64> = lock(&conns.table).open.keys().copied().collect();
        assert_eq!(open, vec![a.id, c.id]);
        let _busy_c = Busy::new(Arc::clone(&c.state));
        assert!(conns.open(2).is_none(), "all busy: the newcomer is refused");
        drop(b);
        drop((a, c));
        assert!(lock(&conns.table).open.is_empty());
    }
}
