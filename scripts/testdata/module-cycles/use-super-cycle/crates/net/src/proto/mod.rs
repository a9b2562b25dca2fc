//! Parent of `codec`, `frame` and `wire`.

pub mod codec;
pub mod frame;
pub mod wire;

pub use self::frame::Frame;
