//! Shared by the flows.

pub fn rendered() -> String {
    let mut store = core_lib::model::Store::default();
    store.0.push(core_lib::make!("a"));
    core_lib::render::render(&store)
}
