//! A frame; depends on nothing but the standard library.

pub const MAX: usize = 16;

pub struct Frame(pub usize);
