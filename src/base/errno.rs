//! Errno values as the agent names and words them: the symbolic name (`EIO`) and a short
//! description (`I/O error`). The texts are those the agent has always printed (they
//! were nix's, for Linux), so logs and messages read the same; the `errno` label values
//! are [`crate::base::labels::errno_name`]'s bounded subset of these names.

use std::fmt;

pub use rustix::io::Errno;

/// The symbolic name and the description of `e`, or `None` for a number Linux does not
/// define.
pub fn lookup(e: Errno) -> Option<(&'static str, &'static str)> {
    Some(match e.raw_os_error() {
        libc::EPERM => ("EPERM", "Operation not permitted"),
        libc::ENOENT => ("ENOENT", "No such file or directory"),
        libc::ESRCH => ("ESRCH", "No such process"),
        libc::EINTR => ("EINTR", "Interrupted system call"),
        libc::EIO => ("EIO", "I/O error"),
        libc::ENXIO => ("ENXIO", "No such device or address"),
        libc::E2BIG => ("E2BIG", "Argument list too long"),
        libc::ENOEXEC => ("ENOEXEC", "Exec format error"),
        libc::EBADF => ("EBADF", "Bad file number"),
        libc::ECHILD => ("ECHILD", "No child processes"),
        libc::EAGAIN => ("EAGAIN", "Try again"),
        libc::ENOMEM => ("ENOMEM", "Out of memory"),
        libc::EACCES => ("EACCES", "Permission denied"),
        libc::EFAULT => ("EFAULT", "Bad address"),
        libc::ENOTBLK => ("ENOTBLK", "Block device required"),
        libc::EBUSY => ("EBUSY", "Device or resource busy"),
        libc::EEXIST => ("EEXIST", "File exists"),
        libc::EXDEV => ("EXDEV", "Cross-device link"),
        libc::ENODEV => ("ENODEV", "No such device"),
        libc::ENOTDIR => ("ENOTDIR", "Not a directory"),
        libc::EISDIR => ("EISDIR", "Is a directory"),
        libc::EINVAL => ("EINVAL", "Invalid argument"),
        libc::ENFILE => ("ENFILE", "File table overflow"),
        libc::EMFILE => ("EMFILE", "Too many open files"),
        libc::ENOTTY => ("ENOTTY", "Not a typewriter"),
        libc::ETXTBSY => ("ETXTBSY", "Text file busy"),
        libc::EFBIG => ("EFBIG", "File too large"),
        libc::ENOSPC => ("ENOSPC", "No space left on device"),
        libc::ESPIPE => ("ESPIPE", "Illegal seek"),
        libc::EROFS => ("EROFS", "Read-only file system"),
        libc::EMLINK => ("EMLINK", "Too many links"),
        libc::EPIPE => ("EPIPE", "Broken pipe"),
        libc::EDOM => ("EDOM", "Math argument out of domain of func"),
        libc::ERANGE => ("ERANGE", "Math result not representable"),
        libc::EDEADLK => ("EDEADLK", "Resource deadlock would occur"),
        libc::ENAMETOOLONG => ("ENAMETOOLONG", "File name too long"),
        libc::ENOLCK => ("ENOLCK", "No record locks available"),
        libc::ENOSYS => ("ENOSYS", "Function not implemented"),
        libc::ENOTEMPTY => ("ENOTEMPTY", "Directory not empty"),
        libc::ELOOP => ("ELOOP", "Too many symbolic links encountered"),
        libc::ENOMSG => ("ENOMSG", "No message of desired type"),
        libc::EIDRM => ("EIDRM", "Identifier removed"),
        libc::ECHRNG => ("ECHRNG", "Channel number out of range"),
        libc::EL2NSYNC => ("EL2NSYNC", "Level 2 not synchronized"),
        libc::EL3HLT => ("EL3HLT", "Level 3 halted"),
        libc::EL3RST => ("EL3RST", "Level 3 reset"),
        libc::ELNRNG => ("ELNRNG", "Link number out of range"),
        libc::EUNATCH => ("EUNATCH", "Protocol driver not attached"),
        libc::ENOCSI => ("ENOCSI", "No CSI structure available"),
        libc::EL2HLT => ("EL2HLT", "Level 2 halted"),
        libc::EBADE => ("EBADE", "Invalid exchange"),
        libc::EBADR => ("EBADR", "Invalid request descriptor"),
        libc::EXFULL => ("EXFULL", "Exchange full"),
        libc::ENOANO => ("ENOANO", "No anode"),
        libc::EBADRQC => ("EBADRQC", "Invalid request code"),
        libc::EBADSLT => ("EBADSLT", "Invalid slot"),
        libc::EBFONT => ("EBFONT", "Bad font file format"),
        libc::ENOSTR => ("ENOSTR", "Device not a stream"),
        libc::ENODATA => ("ENODATA", "No data available"),
        libc::ETIME => ("ETIME", "Timer expired"),
        libc::ENOSR => ("ENOSR", "Out of streams resources"),
        libc::ENONET => ("ENONET", "Machine is not on the network"),
        libc::ENOPKG => ("ENOPKG", "Package not installed"),
        libc::EREMOTE => ("EREMOTE", "Object is remote"),
        libc::ENOLINK => ("ENOLINK", "Link has been severed"),
        libc::EADV => ("EADV", "Advertise error"),
        libc::ESRMNT => ("ESRMNT", "Srmount error"),
        libc::ECOMM => ("ECOMM", "Communication error on send"),
        libc::EPROTO => ("EPROTO", "Protocol error"),
        libc::EMULTIHOP => ("EMULTIHOP", "Multihop attempted"),
        libc::EDOTDOT => ("EDOTDOT", "RFS specific error"),
        libc::EBADMSG => ("EBADMSG", "Not a data message"),
        libc::EOVERFLOW => ("EOVERFLOW", "Value too large for defined data type"),
        libc::ENOTUNIQ => ("ENOTUNIQ", "Name not unique on network"),
        libc::EBADFD => ("EBADFD", "File descriptor in bad state"),
        libc::EREMCHG => ("EREMCHG", "Remote address changed"),
        libc::ELIBACC => ("ELIBACC", "Can not access a needed shared library"),
        libc::ELIBBAD => ("ELIBBAD", "Accessing a corrupted shared library"),
        libc::ELIBSCN => ("ELIBSCN", ".lib section in a.out corrupted"),
        libc::ELIBMAX => ("ELIBMAX", "Attempting to link in too many shared libraries"),
        libc::ELIBEXEC => ("ELIBEXEC", "Cannot exec a shared library directly"),
        libc::EILSEQ => ("EILSEQ", "Illegal byte sequence"),
        libc::ERESTART => ("ERESTART", "Interrupted system call should be restarted"),
        libc::ESTRPIPE => ("ESTRPIPE", "Streams pipe error"),
        libc::EUSERS => ("EUSERS", "Too many users"),
        libc::ENOTSOCK => ("ENOTSOCK", "Socket operation on non-socket"),
        libc::EDESTADDRREQ => ("EDESTADDRREQ", "Destination address required"),
        libc::EMSGSIZE => ("EMSGSIZE", "Message too long"),
        libc::EPROTOTYPE => ("EPROTOTYPE", "Protocol wrong type for socket"),
        libc::ENOPROTOOPT => ("ENOPROTOOPT", "Protocol not available"),
        libc::EPROTONOSUPPORT => ("EPROTONOSUPPORT", "Protocol not supported"),
        libc::ESOCKTNOSUPPORT => ("ESOCKTNOSUPPORT", "Socket type not supported"),
        libc::EOPNOTSUPP => (
            "EOPNOTSUPP",
            "Operation not supported on transport endpoint",
        ),
        libc::EPFNOSUPPORT => ("EPFNOSUPPORT", "Protocol family not supported"),
        libc::EAFNOSUPPORT => ("EAFNOSUPPORT", "Address family not supported by protocol"),
        libc::EADDRINUSE => ("EADDRINUSE", "Address already in use"),
        libc::EADDRNOTAVAIL => ("EADDRNOTAVAIL", "Cannot assign requested address"),
        libc::ENETDOWN => ("ENETDOWN", "Network is down"),
        libc::ENETUNREACH => ("ENETUNREACH", "Network is unreachable"),
        libc::ENETRESET => ("ENETRESET", "Network dropped connection because of reset"),
        libc::ECONNABORTED => ("ECONNABORTED", "Software caused connection abort"),
        libc::ECONNRESET => ("ECONNRESET", "Connection reset by peer"),
        libc::ENOBUFS => ("ENOBUFS", "No buffer space available"),
        libc::EISCONN => ("EISCONN", "Transport endpoint is already connected"),
        libc::ENOTCONN => ("ENOTCONN", "Transport endpoint is not connected"),
        libc::ESHUTDOWN => ("ESHUTDOWN", "Cannot send after transport endpoint shutdown"),
        libc::ETOOMANYREFS => ("ETOOMANYREFS", "Too many references: cannot splice"),
        libc::ETIMEDOUT => ("ETIMEDOUT", "Connection timed out"),
        libc::ECONNREFUSED => ("ECONNREFUSED", "Connection refused"),
        libc::EHOSTDOWN => ("EHOSTDOWN", "Host is down"),
        libc::EHOSTUNREACH => ("EHOSTUNREACH", "No route to host"),
        libc::EALREADY => ("EALREADY", "Operation already in progress"),
        libc::EINPROGRESS => ("EINPROGRESS", "Operation now in progress"),
        libc::ESTALE => ("ESTALE", "Stale file handle"),
        libc::EUCLEAN => ("EUCLEAN", "Structure needs cleaning"),
        libc::ENOTNAM => ("ENOTNAM", "Not a XENIX named type file"),
        libc::ENAVAIL => ("ENAVAIL", "No XENIX semaphores available"),
        libc::EISNAM => ("EISNAM", "Is a named type file"),
        libc::EREMOTEIO => ("EREMOTEIO", "Remote I/O error"),
        libc::EDQUOT => ("EDQUOT", "Quota exceeded"),
        libc::ENOMEDIUM => ("ENOMEDIUM", "No medium found"),
        libc::EMEDIUMTYPE => ("EMEDIUMTYPE", "Wrong medium type"),
        libc::ECANCELED => ("ECANCELED", "Operation canceled"),
        libc::ENOKEY => ("ENOKEY", "Required key not available"),
        libc::EKEYEXPIRED => ("EKEYEXPIRED", "Key has expired"),
        libc::EKEYREVOKED => ("EKEYREVOKED", "Key has been revoked"),
        libc::EKEYREJECTED => ("EKEYREJECTED", "Key was rejected by service"),
        libc::EOWNERDEAD => ("EOWNERDEAD", "Owner died"),
        libc::ENOTRECOVERABLE => ("ENOTRECOVERABLE", "State not recoverable"),
        libc::ERFKILL => ("ERFKILL", "Operation not possible due to RF-kill"),
        libc::EHWPOISON => ("EHWPOISON", "Memory page has hardware error"),
        _ => return None,
    })
}

/// The symbolic name of `e` (`EIO`), `UnknownErrno` for a number Linux does not define.
pub fn name(e: Errno) -> &'static str {
    lookup(e).map_or("UnknownErrno", |(n, _)| n)
}

/// The description of `e` (`I/O error`).
pub fn desc(e: Errno) -> &'static str {
    lookup(e).map_or("Unknown errno", |(_, d)| d)
}

/// Shows an errno as `EIO: I/O error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named(pub Errno);

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", name(self.0), desc(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descriptions() {
        assert_eq!(name(Errno::IO), "EIO");
        assert_eq!(desc(Errno::IO), "I/O error");
        assert_eq!(name(Errno::AGAIN), "EAGAIN");
        assert_eq!(
            Named(Errno::NOTSOCK).to_string(),
            "ENOTSOCK: Socket operation on non-socket"
        );
        assert_eq!(
            Named(Errno::from_raw_os_error(4000)).to_string(),
            "UnknownErrno: Unknown errno"
        );
    }
}
