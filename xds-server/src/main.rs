//! pilotfish-xds entry point.
fn main() {}
