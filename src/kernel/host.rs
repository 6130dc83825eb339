//! The host the agent runs on: kernel release and version, architecture and host name,
//! exported as `stallwatch_host_info` so a fleet's stalls can be grouped by kernel.
//!
//! node_exporter's uname collector asks the `uname` system call; the same strings are in
//! `/proc/sys/kernel/`, which this reads through [`Roots`] so the golden test can supply
//! them (and an agent in a container with the host's /proc mounted elsewhere reads the
//! host's hostname). Only `kernel/arch` is younger than the others (Linux 5.19): without
//! it the machine comes from `uname`.

use prometheus::{IntGaugeVec, Opts, Registry};

use crate::kernel::kernfs::{read_parse, ParseError, ReadError, Roots};

/// What `uname -r`, `uname -v`, `uname -m` and `uname -n` print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    pub kernel_release: String,
    pub kernel_version: String,
    pub machine: String,
    pub nodename: String,
}

/// One line of a `/proc/sys/kernel/` file, the newline cut; empty text is refused.
pub fn parse_line(what: &'static str, text: &str) -> Result<String, ParseError> {
    let line = text.strip_suffix('\n').unwrap_or(text);
    if line.is_empty() || line.contains('\n') {
        return Err(ParseError::new(what, "expected one non-empty line", text));
    }
    Ok(line.to_owned())
}

impl HostInfo {
    /// Reads `sys/kernel/{osrelease,version,arch,hostname}` under the procfs root.
    pub fn read(roots: &Roots) -> Result<HostInfo, ReadError> {
        let kernel = roots.proc_root.join("sys/kernel");
        let file = |name: &'static str| read_parse(&kernel.join(name), |t| parse_line(name, t));
        let machine = match file("arch") {
            Ok(m) => m,
            Err(e) if e.is_not_found() => rustix::system::uname()
                .machine()
                .to_string_lossy()
                .into_owned(),
            Err(e) => return Err(e),
        };
        Ok(HostInfo {
            kernel_release: file("osrelease")?,
            kernel_version: file("version")?,
            machine,
            nodename: file("hostname")?,
        })
    }

    /// Registers `stallwatch_host_info{kernel_release,kernel_version,machine,nodename} 1`.
    pub fn register(&self, r: &Registry) {
        let info = IntGaugeVec::new(
            Opts::new(
                "stallwatch_host_info",
                "The host's kernel (uname -r, -v), architecture (uname -m) and name (uname -n), read at start-up.",
            ),
            &["kernel_release", "kernel_version", "machine", "nodename"],
        )
        .expect("valid metric definition");
        info.with_label_values(&[
            &self.kernel_release,
            &self.kernel_version,
            &self.machine,
            &self.nodename,
        ])
        .set(1);
        r.register(Box::new(info)).expect("registered once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_line_cuts_the_newline() {
        assert_eq!(
            parse_line("osrelease", "6.1.0-18-amd64\n").unwrap(),
            "6.1.0-18-amd64"
        );
        assert_eq!(
            parse_line(
                "version",
                "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)\n"
            )
            .unwrap(),
            "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)"
        );
    }

    #[test]
    fn parse_line_refuses_empty_and_several_lines() {
        assert!(parse_line("osrelease", "").is_err());
        assert!(parse_line("osrelease", "\n").is_err());
        let e = parse_line("hostname", "a\nb\n").unwrap_err();
        assert_eq!(e.what, "hostname");
    }

    #[test]
    fn read_takes_the_files_under_the_procfs_root() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("sys/kernel");
        std::fs::create_dir_all(&kernel).unwrap();
        for (f, v) in [
            ("osrelease", "6.1.0-18-amd64\n"),
            ("version", "#1 SMP Debian\n"),
            ("arch", "aarch64\n"),
            ("hostname", "raid-host-1\n"),
        ] {
            std::fs::write(kernel.join(f), v).unwrap();
        }
        let roots = Roots {
            proc_root: dir.path().to_owned(),
            sys_root: dir.path().join("sys"),
        };
        let h = HostInfo::read(&roots).unwrap();
        assert_eq!(h.kernel_release, "6.1.0-18-amd64");
        assert_eq!(h.kernel_version, "#1 SMP Debian");
        assert_eq!(h.machine, "aarch64");
        assert_eq!(h.nodename, "raid-host-1");

        // Without kernel/arch (before Linux 5.19) the machine is uname's.
        std::fs::remove_file(kernel.join("arch")).unwrap();
        let h = HostInfo::read(&roots).unwrap();
        let uname = rustix::system::uname();
        assert_eq!(h.machine, uname.machine().to_string_lossy());

        // A missing release is an error naming the file.
        std::fs::remove_file(kernel.join("osrelease")).unwrap();
        let e = HostInfo::read(&roots).unwrap_err();
        assert!(e.path().ends_with("sys/kernel/osrelease"), "{e}");
    }
}
