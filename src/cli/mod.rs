//! The foreground commands besides the agent: `stallwatch probe`.

pub mod probe;
