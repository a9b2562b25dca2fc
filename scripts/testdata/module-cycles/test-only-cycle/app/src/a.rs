//! Production code that uses `b`.

pub fn f() -> u32 {
    crate::b::g() + 1
}

#[cfg(test)]
mod tests {
    #[test]
    fn via_testutil() {
        assert_eq!(crate::testutil::twice(), 4);
    }
}
