//! Load that fills a device's queue: the fsync-tester's random buffered writer.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// How [`random_writer`] starts writeback of what it dirtied, without waiting for it.
#[derive(Clone, Copy, Debug)]
pub enum Kick {
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file.
    FadviseDontneed,
    /// `sync_file_range(SYNC_FILE_RANGE_WRITE)` over the whole file.
    SyncFileRange,
}

/// The fsync-tester load: random 4 KiB buffered writes into a 64 MiB file at `path`,
/// starting writeback (`kick`) every 2 MiB so the device queue stays full. Bounded:
/// at most `writes` writes and `limit` of time; stops early when `stop` is set.
pub fn random_writer(
    path: &Path,
    stop: Arc<AtomicBool>,
    writes: u64,
    limit: Duration,
    kick: Kick,
) -> thread::JoinHandle<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let path = path.to_owned();
    thread::spawn(move || {
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        let buf = vec![0x5au8; 4096];
        let t0 = Instant::now();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..writes {
            if stop.load(Ordering::Relaxed) || t0.elapsed() > limit {
                break;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (16384 - 1)) * 4096;
            f.write_at(&buf, off).unwrap();
            if i % 512 == 511 {
                match kick {
                    Kick::FadviseDontneed => {
                        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap()
                    }
                    // rustix has no sync_file_range.
                    // SAFETY: a plain syscall on a descriptor we own.
                    Kick::SyncFileRange => unsafe {
                        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
                    },
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
    })
}
