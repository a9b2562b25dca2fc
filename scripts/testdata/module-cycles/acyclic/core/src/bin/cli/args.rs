//! Arguments of the binary.

pub fn first() -> &'static str {
    "a"
}
