//! A second crate with module names like `core`'s, edges the other way round: its
//! `model` uses its `render`. Crates must not be mixed up.

mod model;
mod render;

fn main() {
    println!("{}", model::describe());
}
