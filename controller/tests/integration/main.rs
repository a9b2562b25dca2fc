//! The integration tests of `pilotfish-controller` (one test binary; each module is one area).

mod validate_command;
