//! Production code that needs nothing from `a`; its tests do.

#[cfg(test)]
use crate::a::f as a_f;

pub fn g() -> u32 {
    1
}

#[cfg(all(test, not(miri)))]
pub fn from_a() -> u32 {
    a_f()
}

#[cfg(test)]
mod tests {
    use crate::a::f;

    #[test]
    fn f_adds_one() {
        assert_eq!(f(), super::g() + 1);
        assert_eq!(super::from_a(), 2);
    }
}
