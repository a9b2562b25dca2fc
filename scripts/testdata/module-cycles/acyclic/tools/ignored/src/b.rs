//! Half of a cycle.
pub fn g() { crate::c::h() }
