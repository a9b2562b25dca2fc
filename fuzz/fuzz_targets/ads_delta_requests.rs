//! The delta ADS state machine (`pilotfish_xds::ads::DeltaStream`) fed
//! `DeltaDiscoveryRequest`s decoded from the input by the shared driver
//! (`pilotfish_fuzz::drive_ads_stream`): subscribe and unsubscribe lists, wildcard,
//! reconnect claims in `initial_resource_versions`, ACKs and NACKs, snapshot moves. Any
//! panic is a bug.
#![no_main]

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use libfuzzer_sys::fuzz_target;
use pilotfish_xds::ads::DeltaStream;

fuzz_target!(|data: &[u8]| {
    pilotfish_fuzz::drive_ads_stream::<DeltaStream>(data, |r: &mut DeltaDiscoveryRequest| {
        &mut r.response_nonce
    });
});
