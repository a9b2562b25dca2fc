//! An item; uses the inline `util` module's file child two levels up.

use super::super::util::text::upper;

#[derive(Debug, Clone, PartialEq)]
pub struct Item(pub String);

impl Item {
    pub fn new(name: &str) -> Self {
        Item(upper(name))
    }
}
