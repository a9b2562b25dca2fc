//! Text helpers; the file child of the inline module `util`.

pub fn upper(s: &str) -> String {
    super::id(s).to_uppercase()
}
