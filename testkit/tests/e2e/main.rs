//! End-to-end tests of Pilotfish: the one integration-test binary of `pilotfish-testkit`.
//! Each module starts the real processes it needs (see `pilotfish_testkit`).

mod bus_redis;
