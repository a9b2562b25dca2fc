//! An acyclic crate using every construct the checker reads: nested modules, a
//! `#[path]` module, an inline module with a file child, facade re-exports through
//! `self::`, `super::super::`, `pub(in crate::…)` and `$crate` in a macro.

pub mod model;
#[path = "platform_linux.rs"]
pub mod platform;
pub mod render;

pub mod util {
    //! Inline module; its `text` child lives in `util/text.rs`.
    pub mod text;

    pub fn id(s: &str) -> &str {
        s
    }
}

/// Builds an item wherever the macro is used.
#[macro_export]
macro_rules! make {
    ($name:expr) => {
        $crate::model::Item::new($name)
    };
}
