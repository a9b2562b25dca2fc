//! Wire sizes; closes the cycle back into `codec`.

use super::{codec::encode, Frame};

pub fn len(n: usize) -> usize {
    n
}

pub fn size(f: &Frame) -> usize {
    encode(f)
}
