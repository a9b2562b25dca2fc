//! The integration-test crate: `flows` uses `helpers`.

mod flows;
mod helpers;
