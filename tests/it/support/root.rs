//! The gate of tests that need root: they fail loudly without it, never pass silently.

/// Environment variable that turns "needs root" from a failure into an explicit skip.
pub const SKIP_ROOT_ENV: &str = "STALLWATCH_SKIP_ROOT_TESTS";

/// The effective uid of this process.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Returns true when the test may go on as root. Without root it panics, unless
/// `STALLWATCH_SKIP_ROOT_TESTS=1` is set: then it prints a loud SKIPPED line and returns
/// false (the test must then `return`). Root tests never pass silently.
///
/// ```ignore
/// if !require_root("freeze_blocks_create") { return; }
/// ```
pub fn require_root(test: &str) -> bool {
    if euid() == 0 {
        return true;
    }
    if std::env::var(SKIP_ROOT_ENV).as_deref() == Ok("1") {
        eprintln!("**************************************************************");
        eprintln!("SKIPPED (needs root): {test}");
        eprintln!("**************************************************************");
        return false;
    }
    panic!(
        "test `{test}` needs root (loop devices, mount, fsfreeze, blkio throttling); \
         run it as root, or set {SKIP_ROOT_ENV}=1 to skip root tests explicitly"
    );
}
