//! Test helpers; a `#[cfg(test)] mod` file, so its paths do not count.

use crate::a;

pub fn twice() -> u32 {
    a::f() * 2
}
