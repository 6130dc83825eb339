//! The exposition: one registry into which each module registers the families it owns
//! (probe, stall log, sampler), plus the agent's own `stallwatch_build_info` and
//! `process_*`. Families are encoded in name order, whoever registered them.

use prometheus::{IntGaugeVec, Opts, Registry};

/// A registry holding the families that belong to no module: the build and the process.
pub fn registry() -> Registry {
    let r = Registry::new();
    let build = IntGaugeVec::new(
        Opts::new("stallwatch_build_info", "The running stallwatch version."),
        &["version"],
    )
    .expect("valid metric definition");
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    r.register(Box::new(build)).expect("registered once");
    let pc = prometheus::process_collector::ProcessCollector::for_self();
    r.register(Box::new(pc)).expect("registered once");
    r
}

/// Encodes every family of `r` in the text format.
pub fn encode(r: &Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&r.gather())
        .unwrap_or_default()
}
