//! Integration tests of `pilotfish-xds`: the real ADS server on 127.0.0.1, driven by a
//! real tonic ADS client over a socket; the generators' golden files, checked by Envoy's
//! own validation rules; and the generators' behaviour through the snapshot.

mod ads_backpressure;
mod ads_delta;
mod ads_sotw;
mod generators;
mod golden;
mod harness;
