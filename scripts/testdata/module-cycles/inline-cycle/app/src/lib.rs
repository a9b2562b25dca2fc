//! Two modules that call each other through inline paths only (no `use`).

pub mod a;
pub mod b;
