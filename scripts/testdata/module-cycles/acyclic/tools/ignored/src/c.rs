//! Other half.
pub fn h() { if false { crate::b::g() } }
