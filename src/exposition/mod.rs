//! The exposition: the one registry a scrape encodes (`registry`) and the families
//! that write their own text with the text-format primitives (`family`).

pub mod family;
pub mod registry;
