//! Compiles `proto/onnx_subset.proto` with protox (a protobuf compiler written in
//! Rust) and prost-build, so building Tessera never needs a `protoc` binary.

fn main() {
    let proto = "proto/onnx_subset.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = match protox::compile([proto], ["proto"]) {
        Ok(set) => set,
        Err(e) => panic!("{proto} does not compile: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(descriptors) {
        panic!("prost-build failed on {proto}: {e}");
    }
}
