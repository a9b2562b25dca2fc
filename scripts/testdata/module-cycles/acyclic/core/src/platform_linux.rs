//! Loaded through `#[path]`.

pub const NAME: &str = "linux";
