//! Production code that uses `b`.

pub fn f() -> usize {
    crate::b::g().len()
}
