//! The open-file limit. Each probe lane keeps a descriptor of its own on
//! `/proc/self/mountinfo` (`kernel::mounts::MountWatch`) besides the files of its cycle, so
//! a host with hundreds of targets can pass the soft limit of 1024 that systemd and most
//! shells start a service with. As Go's runtime does for node_exporter, the agent raises
//! its soft limit to the hard one at start (no privilege needed; the hard limit is
//! systemd's 524288 unless the unit sets `LimitNOFILE=`).

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit before and
/// after (`None`: unlimited).
pub fn raise_limit() -> (Option<u64>, Option<u64>) {
    let before = getrlimit(Resource::Nofile);
    if before.current != before.maximum {
        let raised = Rlimit {
            current: before.maximum,
            maximum: before.maximum,
        };
        // Refused only under a seccomp or LSM policy: the agent then runs with the soft
        // limit it was given, as before.
        let _ = setrlimit(Resource::Nofile, raised);
    }
    (before.current, getrlimit(Resource::Nofile).current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_becomes_the_hard_one() {
        let Rlimit {
            current,
            maximum: hard,
        } = getrlimit(Resource::Nofile);
        // One below what the test process has (other tests run beside this one), so the
        // soft limit differs from the hard one whatever the test was started with.
        let below = current.or(hard).map_or(1 << 20, |c| c - 1);
        let lowered = Rlimit {
            current: Some(below),
            maximum: hard,
        };
        setrlimit(Resource::Nofile, lowered).unwrap();
        let (before, after) = raise_limit();
        assert_eq!(before, Some(below));
        assert_eq!(after, hard);
        assert_eq!(getrlimit(Resource::Nofile).current, hard);
    }
}
