//! Facade over `item` and `store`; re-exports through `self::` do not count.

pub mod item;
pub mod store;

pub use self::item::Item;
pub use self::store::Store;
