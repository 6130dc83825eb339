//! mounts
