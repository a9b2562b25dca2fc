//! Excluded from the workspace: its cycle must not be reported.

pub mod a {
    //! Half of a cycle.
    pub fn f() {}
}
mod b;
mod c;
