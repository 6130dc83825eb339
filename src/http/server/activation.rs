//! `--web.systemd-socket`: the listening sockets systemd passes (socket activation), with
//! `sd_listen_fds(3)`'s semantics: `LISTEN_PID` must be this process, `LISTEN_FDS` counts
//! descriptors from 3 on; the variables are removed afterwards (so a child never takes
//! them for its own) and the descriptors marked close-on-exec. Only listening TCP sockets
//! are taken: the agent serves HTTP over TCP (the unit allows AF_INET and AF_INET6 only).
//! exporter-toolkit's flag, same meaning: the sockets replace the listen address.

use std::net::TcpListener;
use std::os::fd::{FromRawFd as _, RawFd};

use rustix::io::FdFlags;
use rustix::net::{sockopt, AddressFamily, SocketType};

use crate::base::errno::Named;

/// First passed descriptor (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// Why the passed sockets cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("--web.systemd-socket: no socket activation file descriptors found (LISTEN_FDS/LISTEN_PID not set for this process: start it from a .socket unit, or with systemd-socket-activate)")]
    NoSockets,
    #[error("--web.systemd-socket: {var}={value:?} is not a number")]
    BadVariable { var: &'static str, value: String },
    #[error("--web.systemd-socket: descriptor {fd} is {what}, not a listening TCP socket")]
    NotTcpListener { fd: RawFd, what: String },
}

/// What the environment says was passed: `None` when the variables are absent or meant
/// for another process (`LISTEN_PID` is not ours), else the descriptor count.
pub fn listen_fds(
    pid_var: Option<&str>,
    fds_var: Option<&str>,
    own_pid: u32,
) -> Result<Option<u32>, ActivationError> {
    let (Some(pid), Some(fds)) = (pid_var, fds_var) else {
        return Ok(None);
    };
    let pid: u32 = pid
        .trim()
        .parse()
        .map_err(|_| ActivationError::BadVariable {
            var: "LISTEN_PID",
            value: pid.to_owned(),
        })?;
    if pid != own_pid {
        return Ok(None);
    }
    let n: u32 = fds
        .trim()
        .parse()
        .map_err(|_| ActivationError::BadVariable {
            var: "LISTEN_FDS",
            value: fds.to_owned(),
        })?;
    Ok(Some(n))
}

/// Takes the sockets systemd passed. Call before any thread is started: it removes
/// `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` from the environment.
pub fn systemd_listeners() -> Result<Vec<TcpListener>, ActivationError> {
    let pid_var = std::env::var("LISTEN_PID").ok();
    let fds_var = std::env::var("LISTEN_FDS").ok();
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(v);
    }
    let n = listen_fds(pid_var.as_deref(), fds_var.as_deref(), std::process::id())?
        .filter(|n| *n > 0)
        .ok_or(ActivationError::NoSockets)?;
    (LISTEN_FDS_START..LISTEN_FDS_START + n as RawFd)
        .map(take_listener)
        .collect()
}

fn take_listener(fd: RawFd) -> Result<TcpListener, ActivationError> {
    let not = |what: String| ActivationError::NotTcpListener { fd, what };
    // SAFETY: systemd passed this descriptor to us (LISTEN_PID is ours); nothing else in
    // this process owns it. Borrowed only for the checks, owned below once they pass.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let flags =
        rustix::io::fcntl_getfd(borrowed).map_err(|e| not(format!("not open ({})", Named(e))))?;
    rustix::io::fcntl_setfd(borrowed, flags | FdFlags::CLOEXEC)
        .map_err(|e| not(format!("unusable ({})", Named(e))))?;
    let ty =
        sockopt::socket_type(borrowed).map_err(|e| not(format!("not a socket ({})", Named(e))))?;
    if ty != SocketType::STREAM {
        return Err(not(format!("a {} socket", type_name(ty))));
    }
    if !sockopt::socket_acceptconn(borrowed).unwrap_or(false) {
        return Err(not("a socket that is not listening".into()));
    }
    let family = rustix::net::getsockname(borrowed)
        .ok()
        .map(|a| a.address_family());
    if !matches!(family, Some(AddressFamily::INET | AddressFamily::INET6)) {
        return Err(not(format!("a {} socket", family_name(family))));
    }
    // SAFETY: as above; from here on the listener owns (and eventually closes) it.
    Ok(unsafe { TcpListener::from_raw_fd(fd) })
}

/// A socket type as the refusal names it (`Datagram`).
fn type_name(ty: SocketType) -> String {
    match ty {
        SocketType::STREAM => "Stream".into(),
        SocketType::DGRAM => "Datagram".into(),
        SocketType::SEQPACKET => "SeqPacket".into(),
        SocketType::RAW => "Raw".into(),
        SocketType::RDM => "Rdm".into(),
        other => format!("type {}", other.as_raw()),
    }
}

/// An address family as the refusal names it (`Some(Unix)`, `None` when unknown).
fn family_name(family: Option<AddressFamily>) -> String {
    let name = match family {
        None => return "None".into(),
        Some(AddressFamily::UNIX) => "Unix",
        Some(AddressFamily::INET) => "Inet",
        Some(AddressFamily::INET6) => "Inet6",
        Some(AddressFamily::NETLINK) => "Netlink",
        Some(AddressFamily::PACKET) => "Packet",
        Some(AddressFamily::VSOCK) => "Vsock",
        Some(other) => return format!("Some(family {})", other.as_raw()),
    };
    format!("Some({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_fds_semantics() {
        assert_eq!(listen_fds(None, None, 42).unwrap(), None);
        assert_eq!(listen_fds(Some("42"), None, 42).unwrap(), None);
        assert_eq!(listen_fds(Some("42"), Some("2"), 42).unwrap(), Some(2));
        assert_eq!(listen_fds(Some(" 42\n"), Some("1"), 42).unwrap(), Some(1));
        // Meant for another process (e.g. inherited from a parent): not ours.
        assert_eq!(listen_fds(Some("41"), Some("1"), 42).unwrap(), None);
        assert!(matches!(
            listen_fds(Some("x"), Some("1"), 42),
            Err(ActivationError::BadVariable {
                var: "LISTEN_PID",
                ..
            })
        ));
        assert!(matches!(
            listen_fds(Some("42"), Some("one"), 42),
            Err(ActivationError::BadVariable {
                var: "LISTEN_FDS",
                ..
            })
        ));
    }
}
