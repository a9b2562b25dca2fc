//! Calls back into `a` by an inline path inside a type and an expression.

pub fn g() -> u32 {
    1
}

pub fn h() -> Option<fn() -> u32> {
    let f: fn() -> u32 = crate::a::f;
    Some(f)
}
