//! pilotfish-controller entry point.
fn main() {}
