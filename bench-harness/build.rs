//! Build script: compiles the gRPC engine protocols `sim-engine --grpc` serves (the workspace's
//! `proto/smg/`, the same files kvgate's client is built from) into prost types; `protox`
//! parses them in Rust, so no `protoc` is needed.

fn main() {
    const PROTOS: [&str; 3] = [
        "smg/common.proto",
        "smg/sglang_scheduler.proto",
        "smg/vllm_engine.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=../proto/{proto}");
    }
    let descriptors = match protox::compile(PROTOS, ["../proto"]) {
        Ok(descriptors) => descriptors,
        Err(e) => panic!("../proto/: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(descriptors) {
        panic!("../proto/: prost-build: {e}");
    }
}
