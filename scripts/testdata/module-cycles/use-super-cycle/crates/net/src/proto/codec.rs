//! Encodes frames; reaches `frame` and `wire` through one nested brace tree.

pub use super::{
    frame::{Frame as F, MAX},
    wire::{self},
};

pub fn encode(f: &F) -> usize {
    wire::len(f.0) + MAX
}
