//! The kinds this crate ships, built on the runtime like any user's kind: the core never imports
//! them (the layering test checks it).

pub mod etl;
