//! Builds the BPF skeleton and the protobuf types.
use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));

    let bpf_src = "bpf/ember.bpf.c";
    SkeletonBuilder::new()
        .source(bpf_src)
        .clang_args(["-I", "bpf", "-O2", "-g", "-Wall"])
        .build_and_generate(out.join("ember.skel.rs"))
        .expect("building the BPF program (is clang installed? `make deps`)");
    // Run-queue latency: a second program, loaded only when `counters.runqueue_latency` is on.
    SkeletonBuilder::new()
        .source("bpf/runqlat.bpf.c")
        .clang_args(["-I", "bpf", "-O2", "-g", "-Wall"])
        .build_and_generate(out.join("runqlat.skel.rs"))
        .expect("building the run-queue latency BPF program");
    // The whole directory: cargo rescans it, headers of every unit and contract/ included.
    println!("cargo:rerun-if-changed=bpf");

    let proto_dir = "../proto";
    let fds = protox::compile([format!("{proto_dir}/profile.proto")], [proto_dir])
        .expect("compiling proto/profile.proto");
    prost_build::Config::new()
        .compile_fds(fds)
        .expect("generating Rust for proto/profile.proto");
    println!("cargo:rerun-if-changed={proto_dir}/profile.proto");

    let fds = protox::compile([format!("{proto_dir}/push.proto")], [proto_dir])
        .expect("compiling proto/push.proto");
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(fds)
        .expect("generating Rust for proto/push.proto");
    println!("cargo:rerun-if-changed={proto_dir}/push.proto");
}
