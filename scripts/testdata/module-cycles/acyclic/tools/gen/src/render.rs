//! A leaf.

pub fn title(s: &str) -> String {
    format!("# {s}")
}
