//! A crate whose `proto` children form a cycle through a nested brace `use`.

pub mod proto;
