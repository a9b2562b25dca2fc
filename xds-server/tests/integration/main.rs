//! Integration tests of `pilotfish-xds`: the real ADS server on 127.0.0.1, driven by a
//! real tonic ADS client over a socket (and raw TCP for the listener's limits); the generators' golden files, checked by Envoy's
//! own validation rules; the generators' behaviour through the snapshot; and the bytes
//! one configuration change sends per sidecar (`push_bytes`).

mod ads_backpressure;
mod ads_delta;
mod ads_listener;
mod ads_sotw;
mod export_to;
mod generators;
mod golden;
mod harness;
mod incremental;
mod istio_fields;
mod push_bytes;
