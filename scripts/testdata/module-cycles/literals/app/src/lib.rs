//! `a` uses `b`; `b` mentions `crate::a` only in comments and literals.

pub mod a;
pub mod b;
