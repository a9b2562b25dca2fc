//! Calls into `b` by an inline path.

pub fn f() -> u32 {
    crate::b::g()
}
