//! The exposition: the one registry a scrape encodes (`registry`) and the families
//! that write their own text with the text-format primitives (`family`), their
//! protobuf with the wire-format primitives (`protobuf`), the native buckets of the
//! histograms (`native`).

pub mod family;
pub mod native;
pub(crate) mod protobuf;
pub mod registry;
