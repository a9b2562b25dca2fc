//! A binary crate with its own module tree.

mod args;

fn main() {
    let mut store = core_lib::model::Store::default();
    store.add(args::first());
    println!("{}", core_lib::render::render(&store));
}
