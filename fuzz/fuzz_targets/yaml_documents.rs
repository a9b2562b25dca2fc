//! The folder source's YAML parser (`pilotfish_mesh::document::parse_text`) and what a
//! folder's objects go through next (`to_inputs`, the `PushContext` build with its
//! validation): a file anyone can drop into a config folder must never take the process
//! down.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pilotfish_mesh::document::{parse_text, to_inputs};
use pilotfish_mesh::push_context::{BuildInputs, build};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_text(std::path::Path::new("fuzz.yaml"), text);
    let inputs = to_inputs(
        &parsed.objects,
        BuildInputs {
            cluster_domain: "cluster.local".into(),
            ..Default::default()
        },
    );
    let _ = build(&inputs, None);
});
