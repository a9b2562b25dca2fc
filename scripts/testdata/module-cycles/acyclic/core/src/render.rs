//! Renders items; depends on `model` and `platform`.

use crate::model::{self, item::Item};

pub fn render(store: &model::Store) -> String {
    let names: Vec<&str> = store.0.iter().map(|Item(n)| n.as_str()).collect();
    format!("{}: {}", crate::platform::NAME, names.join(","))
}
