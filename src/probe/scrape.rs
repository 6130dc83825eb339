//! The probe families computed at scrape time from the lanes' in-flight slots:
//! `stallwatch_probe_inflight_seconds` and `stallwatch_probe_blocked_cause`.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::target::Targets;
use crate::base::labels::Op;
use crate::exposition::family::{header, labels_into, sample, Dialect, Family};
use crate::exposition::protobuf as pb;
use crate::exposition::registry::Registry;
use crate::stall::waits::sampling_point;

/// Registers `stallwatch_probe_inflight_seconds` and `stallwatch_probe_blocked_cause`,
/// computed from the targets probed at each scrape; and, before each scrape, the
/// recording of the calls the lanes hold (`pending.rs`).
pub fn register_inflight(r: &Registry, targets: Arc<Targets>) {
    let lanes = Arc::clone(&targets);
    r.before_encode(move || lanes.fold_pending());
    r.register_family(Arc::new(Inflight {
        targets: Arc::clone(&targets),
    }));
    r.register(Box::new(BlockedCause::new(targets)))
        .expect("registered once");
}

fn label(name: &str, value: &str) -> prometheus::proto::LabelPair {
    let mut l = prometheus::proto::LabelPair::default();
    l.set_name(name.to_owned());
    l.set_value(value.to_owned());
    l
}

/// The description of a scrape-time collector's one family, with these variable labels.
fn desc(name: &str, help: &str, labels: &[&str]) -> Desc {
    let labels = labels.iter().map(|l| l.to_string()).collect();
    Desc::new(name.into(), help.into(), labels, Default::default()).expect("valid desc")
}

/// One gauge sample; `labels` sorted by name, as the encoder expects.
fn gauge(value: f64, labels: Vec<prometheus::proto::LabelPair>) -> prometheus::proto::Metric {
    let mut g = prometheus::proto::Gauge::default();
    g.set_value(value);
    let mut m = prometheus::proto::Metric::default();
    m.set_label(labels);
    m.set_gauge(g);
    m
}

/// A gauge family built at scrape time.
fn gauge_family(name: &str, help: &str, metrics: Vec<prometheus::proto::Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_owned());
    family.set_help(help.to_owned());
    family.set_field_type(prometheus::proto::MetricType::GAUGE);
    family.set_metric(metrics);
    family
}

/// `stallwatch_probe_blocked_cause`: 1 for each call blocked past its sampling point
/// right now, labelled with the cause its wait-point samples give so far; no series
/// while nothing is blocked. Computed at scrape time from the lanes.
struct BlockedCause {
    targets: Arc<Targets>,
    desc: Desc,
}

impl BlockedCause {
    const NAME: &'static str = "stallwatch_probe_blocked_cause";
    const HELP: &'static str = "1 for a probe call blocked past its sampling point (a quarter \
        of the stall threshold) right now, labelled with where the kernel holds it as sampled \
        so far (unknown before the first sample); absent while no call is blocked.";

    fn new(targets: Arc<Targets>) -> BlockedCause {
        let desc = desc(Self::NAME, Self::HELP, &["target", "mode", "op", "cause"]);
        BlockedCause { targets, desc }
    }
}

impl Collector for BlockedCause {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut metrics = Vec::new();
        for t in self.targets.current().iter() {
            let from = sampling_point(t.target.stall_threshold);
            for lane in &t.lanes {
                let Some(op) = lane.inflight.current().filter(|op| op.age >= from) else {
                    continue;
                };
                metrics.push(gauge(
                    1.0,
                    vec![
                        label("cause", lane.waits.cause_of(op.seq).as_str()),
                        label("mode", op.mode.as_str()),
                        label("op", op.op.as_str()),
                        label("target", &t.target.name),
                    ],
                ));
            }
        }
        vec![gauge_family(Self::NAME, Self::HELP, metrics)]
    }
}

/// `stallwatch_probe_inflight_seconds`, computed at scrape time from each target's
/// in-flight slot, so the age grows live while the call is blocked in the kernel.
/// Written straight into the exposition (7 series a target: 448 with 64 targets).
struct Inflight {
    targets: Arc<Targets>,
}

impl Inflight {
    const NAME: &'static str = "stallwatch_probe_inflight_seconds";
    const HELP: &'static str = "Age of the probe operation in flight right now, 0 when none; \
        computed at scrape time, so it grows while the call is blocked in the kernel.";
}

impl Family for Inflight {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn encode(&self, out: &mut String, d: Dialect) {
        let rows = self.rows();
        if rows.is_empty() {
            return;
        }
        header(out, Self::NAME, Self::HELP, "gauge", d);
        let mut labels = String::new();
        for (mode, op, target, age) in rows {
            labels.clear();
            labels_into(
                &mut labels,
                &[("mode", mode), ("op", op), ("target", &target)],
            );
            sample(out, Self::NAME, "", &labels, None, age, 0);
        }
    }

    fn encode_protobuf(&self, out: &mut Vec<u8>) {
        let rows = self.rows();
        if rows.is_empty() {
            return;
        }
        let mut labels = Vec::new();
        pb::family(out, Self::NAME, Self::HELP, pb::GAUGE, |f| {
            for (mode, op, target, age) in rows {
                labels.clear();
                pb::label_pair(&mut labels, 1, "mode", mode);
                pb::label_pair(&mut labels, 1, "op", op);
                pb::label_pair(&mut labels, 1, "target", &target);
                pb::scalar_metric(f, &labels, pb::GAUGE, age);
            }
        });
    }
}

impl Inflight {
    /// (mode, op, target, age) of every series, in the order of the label values.
    fn rows(&self) -> Vec<(&'static str, &'static str, String, f64)> {
        let current = self.targets.current();
        let mut rows = Vec::new();
        for t in current.iter() {
            let now = t.in_flight();
            // Set-up (op="prepare") can block too: show it, so a stuck probe is never
            // invisible.
            let prepare = t.target.modes.iter().map(|&m| (m, Op::Prepare));
            for (mode, op) in t.ops.iter().copied().chain(prepare) {
                let age = now
                    .iter()
                    .find(|c| c.mode == mode && c.op == op)
                    .map_or(0.0, |c| c.age.as_secs_f64());
                rows.push((mode.as_str(), op.as_str(), t.target.name.clone(), age));
            }
        }
        // In the order of the label values, labels in name order: as gather() sorts.
        rows.sort_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
        rows
    }
}
