//! Items by name; a child using its parent's re-export.

use super::Item;

#[derive(Default)]
pub struct Store(pub Vec<Item>);

impl Store {
    pub(in crate::model) fn push(&mut self, item: Item) {
        self.0.push(item);
    }

    pub fn add(&mut self, name: &str) {
        self.push(crate::model::item::Item::new(name));
    }
}
