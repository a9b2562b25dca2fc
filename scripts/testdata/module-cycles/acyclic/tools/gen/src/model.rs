//! Uses `render`.

pub fn describe() -> String {
    crate::render::title("gen")
}
