//! Uses the helpers.

#[test]
fn renders() {
    assert_eq!(crate::helpers::rendered(), "linux: A");
}
