//! The evidence as words: the phrases the verdict sentence is built from, and the
//! number formats they use.

use super::window::Evidence;

/// A device busy less than this in every interval counts as idle.
const IDLE_UTILISATION: f64 = 0.05;

/// Evidence phrases for the verdict sentence, strongest first, and whether the backing
/// devices were idle through the window (`Some(true)`: the hold was above the block
/// layer; None when no device was measured over an interval).
pub fn phrases(e: &Evidence) -> (Vec<String>, Option<bool>) {
    let mut out = Vec::new();
    if let Some(d) = e.dirtiers.first() {
        let held = d.dirty_bytes.saturating_add(d.writeback_bytes);
        if held > 0 {
            out.push(format!("top dirtier {} {}", d.cgroup, binary_bytes(held)));
        } else if d.written_bytes > 0 {
            out.push(format!(
                "top writing cgroup {} {} written",
                d.cgroup,
                decimal_bytes(d.written_bytes as f64)
            ));
        }
    }
    if let Some(w) = e.writers.first() {
        let whose = w
            .cgroup
            .as_ref()
            .map_or(String::new(), |c| format!(" in {c}"));
        out.push(format!(
            "top writing process {} (pid {}{whose}) {} written",
            w.comm,
            w.pid,
            decimal_bytes(w.written_bytes as f64)
        ));
    }
    let mut idle = None;
    for d in &e.block_devices {
        let (Some(rate), Some(util), Some(peak)) = (
            d.write_bytes_per_second_avg,
            d.utilisation_avg,
            d.utilisation_max,
        ) else {
            continue;
        };
        let quiet = peak < IDLE_UTILISATION;
        idle = Some(idle.unwrap_or(true) && quiet);
        if quiet {
            out.push(format!("{} idle ({} % busy)", d.device, percent(peak)));
            continue;
        }
        let mut p = format!(
            "{} writing {}/s at {} % busy",
            d.device,
            decimal_bytes(rate),
            percent(util)
        );
        if let Some(lat) = d.write_latency_seconds_avg {
            p.push_str(&format!(", {} per write", duration(lat)));
        }
        out.push(p);
        if let Some(nr) = d.nr_requests {
            let inflight = d.inflight_reads_max + d.inflight_writes_max;
            if nr > 0 && inflight >= nr {
                out.push(format!(
                    "{} queue full ({inflight} of {nr} requests in flight)",
                    d.device
                ));
            }
        }
        if let (Some(n), Some(t)) = (d.flushes, d.flush_seconds_avg) {
            if n > 0 && t >= 0.1 {
                out.push(format!("{} {n} flushes at {} each", d.device, duration(t)));
            }
        }
    }
    if let Some(j) = &e.journal {
        if let Some(c) = j.end.commit_seconds_avg {
            let n = j.transactions;
            out.push(format!(
                "ext4 journal {}: {n} commit{} in the window, average commit {}",
                j.journal,
                if n == 1 { "" } else { "s" },
                duration(c)
            ));
        }
    }
    (out, idle)
}

/// `1.1 GiB`, `512.0 KiB`, `1023 B`: memory in binary units, one decimal from KiB up.
pub fn binary_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// `2.0 MB`, `850 kB`: device traffic in decimal units, as disks are rated.
pub fn decimal_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < UNITS.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

pub(super) fn percent(ratio: f64) -> String {
    format!("{:.0}", (ratio * 100.0).clamp(0.0, 100.0))
}

/// `850 ms`, `1.2 s`, `310 µs`.
pub fn duration(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.1} s")
    } else if s >= 0.001 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}
