//! stalls
