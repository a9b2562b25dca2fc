//! `a` uses `b`; every path back from `b` (or via `testutil`) to `a` is test code.

pub mod a;
pub mod b;
#[cfg(test)]
mod testutil;
