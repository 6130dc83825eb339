//! The accept loop and each connection: TLS handshake, HTTP/1.1 under the header limits,
//! the request pipeline (concurrency limit, rate limit, authentication, router, configured
//! headers) and the shutdown: listener closed at once, open connections given a grace.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{self, HeaderName, HeaderValue};
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt as _;
use tracing::{debug, info};

use super::auth::BasicAuth;
use super::config::WebConfig;
use super::limits::{self, Busy, ConnGuard, ConnState, Conns, Limits, RateLimiter, Requests};
use super::reply::plain;

/// What every connection shares.
struct Server {
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The web config's extra headers, set on every answer.
    headers: Vec<(HeaderName, HeaderValue)>,
    limits: Limits,
    http: hyper::server::conn::http1::Builder,
    conns: Conns,
}

/// A request past the concurrency limit: the rate limit, then authentication, then the router.
struct Gate {
    rate_limit: Option<RateLimiter>,
    auth: Option<Arc<BasicAuth>>,
    router: Router,
}

/// Serves `app` on `listeners` (one bound address, or the sockets systemd passed) until
/// `shutdown` completes; then closes the listeners at once, lets open connections finish for up to `limits.shutdown_grace`, and returns.
/// Connections still open then are dropped with the runtime.
pub async fn serve(
    listeners: Vec<TcpListener>,
    app: Router,
    web: WebConfig,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    if web.tls_enabled() {
        info!("TLS is enabled");
    }
    if web.auth_enabled() {
        info!("basic authentication is enabled");
    }
    let WebConfig {
        tls,
        auth,
        headers,
        rate_limit,
    } = web;
    // Certificate files are watched for as long as this server runs, not longer.
    let _cert_watch = tls.as_ref().and_then(|t| t.watch_certificates());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        // Bounds a head that never completes, too: past this it is 431 as well.
        .max_buf_size((2 * limits.max_header_bytes).max(8192))
        .keep_alive(true);
    let gate = Arc::new(Gate {
        rate_limit,
        auth,
        router: app,
    });
    let requests = limits::limit_requests(
        limits.max_requests,
        tower::service_fn(move |req| {
            let gate = Arc::clone(&gate);
            async move { Ok::<_, Infallible>(gate.answer(req).await) }
        }),
    );
    let srv = Arc::new(Server {
        tls: tls.map(|t| tokio_rustls::TlsAcceptor::from(t.config)),
        headers,
        limits,
        http,
        conns: Conns::default(),
    });
    let graceful = GracefulShutdown::new();
    // GracefulShutdown can only watch hyper connections: a TLS handshake still under way
    // at the signal is abandoned through this flag instead.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    let mut next_listener = 0;
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            accepted = accept_any(&listeners, &mut next_listener) => match accepted {
                Ok((tcp, _peer)) => {
                    let _ = tcp.set_nodelay(true);
                    if let Some(guard) = srv.conns.open(srv.limits.max_connections) {
                        let conn = Conn {
                            srv: Arc::clone(&srv),
                            guard,
                            requests: requests.clone(),
                            // Taken here, before any signal, so that none can be missed.
                            watcher: graceful.watcher(),
                            stop: stop_rx.clone(),
                        };
                        tokio::spawn(conn.run(tcp));
                    }
                }
                Err(e) => {
                    // Out of descriptors: free one and pause, rather than spin on accept.
                    let errno = e.raw_os_error();
                    if errno == Some(libc::EMFILE) || errno == Some(libc::ENFILE) {
                        srv.conns.evict_oldest_idle();
                        srv.conns.warn_throttled("accept: out of file descriptors; closed the oldest idle connection");
                    } else {
                        debug!(error = %e, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
    drop(listeners);
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(srv.limits.shutdown_grace, graceful.shutdown()).await;
}

/// The next connection on any of `listeners`. Polling starts one listener further each
/// time, so a busy listener cannot starve the others; a poll that finds nothing
/// registers for the wake-up.
async fn accept_any(
    listeners: &[TcpListener],
    next: &mut usize,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    std::future::poll_fn(|cx| {
        let n = listeners.len();
        for i in 0..n {
            let k = (*next + i) % n;
            if let Poll::Ready(r) = listeners[k].poll_accept(cx) {
                *next = (k + 1) % n;
                return Poll::Ready(r);
            }
        }
        Poll::Pending
    })
    .await
}

impl Gate {
    async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        if let Some(rl) = &self.rate_limit {
            if !rl.allow() {
                return plain(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n".into());
            }
        }
        if let Some(auth) = &self.auth {
            if !auth.check(req.headers()).await {
                let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized\n".into());
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
                return r;
            }
        }
        match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }
}

/// One accepted connection and what it holds of the server.
struct Conn {
    srv: Arc<Server>,
    guard: ConnGuard,
    requests: Requests,
    watcher: Watcher,
    stop: watch::Receiver<bool>,
}

impl Conn {
    /// From TLS handshake to close; ends early when evicted.
    async fn run(self, tcp: TcpStream) {
        let Conn {
            srv,
            guard,
            requests,
            watcher,
            mut stop,
        } = self;
        let state = Arc::clone(&guard.state);
        let evicted = state.evict.notified();
        tokio::pin!(evicted);
        tokio::select! {
            _ = &mut evicted => debug!("connection closed to make room for a new one"),
            _ = async {
                match &srv.tls {
                    None => serve_http(tcp, &srv, &state, requests, watcher, stop).await,
                    Some(acceptor) => {
                        let handshake = tokio::time::timeout(
                            srv.limits.header_read_timeout,
                            acceptor.accept(tcp),
                        );
                        let tls = tokio::select! {
                            r = handshake => match r {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    debug!(error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    debug!("TLS handshake timed out");
                                    return;
                                }
                            },
                            _ = stop.wait_for(|s| *s) => return,
                        };
                        serve_http(tls, &srv, &state, requests, watcher, stop).await
                    }
                }
            } => {}
        }
        drop(guard);
    }
}

/// HTTP/1.1 on an open (and, with TLS, handshaken) connection, shut down gracefully on
/// the signal: an idle connection closes at once, a request under way is answered first.
async fn serve_http<I>(
    io: I,
    srv: &Arc<Server>,
    state: &Arc<ConnState>,
    requests: Requests,
    watcher: Watcher,
    stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (srv2, state2) = (Arc::clone(srv), Arc::clone(state));
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = Busy::new(Arc::clone(&state2));
        let answer = requests.clone().oneshot(req);
        let srv = Arc::clone(&srv2);
        async move {
            let mut resp = match answer.await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            for (k, v) in &srv.headers {
                resp.headers_mut().insert(k.clone(), v.clone());
            }
            drop(busy);
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = srv.http.serve_connection(TokioIo::new(io), svc);
    let ended = watcher.watch(conn).await;
    // An error while closing for the shutdown is expected, not worth a line.
    if let Err(e) = ended {
        if !*stop.borrow() {
            debug!(error = %e, "HTTP connection ended with an error");
        }
    }
}
