//! The lowest layer: the label types every layer may use, errno names and the
//! poison-tolerant lock.

pub mod errno;
pub mod labels;
pub mod sync;
