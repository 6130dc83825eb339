//! The lowest layer: the label types every layer may use and the poison-tolerant lock.

pub mod labels;
pub mod sync;
