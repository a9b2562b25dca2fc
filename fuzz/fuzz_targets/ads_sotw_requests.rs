//! The SotW ADS state machine (`pilotfish_xds::ads::SotwStream`) fed `DiscoveryRequest`s
//! (as the engine decodes them: `SotwRequest`)
//! decoded from the input by the shared driver (`pilotfish_fuzz::drive_ads_stream`: ACKs,
//! NACKs, subscription changes, snapshot moves). Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pilotfish_xds::ads::{SotwRequest, SotwStream};

fuzz_target!(|data: &[u8]| {
    pilotfish_fuzz::drive_ads_stream::<SotwStream>(data, |r: &mut SotwRequest| {
        &mut r.response_nonce
    });
});
