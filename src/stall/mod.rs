//! Stalls: the in-flight slot in which a lane's call is seen blocked, wait-point
//! sampling and the cause table, the evidence read while a stall lasts and its worker,
//! the verdict, the log of stall events with `stallwatch_stalls_total`, the events' ids,
//! the stall record on disk.

pub mod causes;
pub mod event;
pub mod evidence;
pub mod id;
pub mod inflight;
pub mod log;
pub mod store;
pub mod verdict;
pub mod waits;
pub mod wake;
pub mod worker;
