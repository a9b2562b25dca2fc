//! Compiles the snapshot protobuf schema with `protox` (pure Rust, no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/pilotfish/snapshot/v1/snapshot.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new()
        // Maps encode in key order: the snapshot's content hash depends on it.
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
