//! Builds the fixture workloads in `fixtures/` with clang into OUT_DIR and hands
//! their paths to the tests as `FIXTURE_<NAME>` (e.g. `FIXTURE_CPU_HOG`).
//!
//! clang, not gcc: gcc 12 drops the leaf's frame pointer even with
//! `-mno-omit-leaf-frame-pointer`, which loses the leaf's caller from stacks.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Fixture sources (without `.c`).
const FIXTURES: &[&str] = &["cpu_hog", "syscall_hog", "short_lived", "jit_hog"];

const CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pthread",
];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo")).join("fixtures");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-changed=fixtures/common.h");

    match Command::new(&clang).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => fail(&format!(
            "`{clang}` was not found or does not run: the test fixtures are C programs built with \
             clang. Install it with `make deps` (or `apt-get install clang`), or point CLANG at one."
        )),
    }

    for name in FIXTURES {
        let src = dir.join(format!("{name}.c"));
        println!("cargo:rerun-if-changed=fixtures/{name}.c");
        let bin = out.join(name);
        build(&clang, &src, &bin);
        println!(
            "cargo:rustc-env=FIXTURE_{}={}",
            name.to_uppercase(),
            bin.display()
        );
    }
}

fn build(clang: &str, src: &Path, bin: &Path) {
    let status = Command::new(clang)
        .args(CFLAGS)
        .arg("-o")
        .arg(bin)
        .arg(src)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("{clang} failed ({s}) building {}", src.display())),
        Err(e) => fail(&format!("could not run {clang} for {}: {e}", src.display())),
    }
}

fn fail(msg: &str) -> ! {
    // A build script's panic message is shown by cargo; make it the one sentence that matters.
    eprintln!("error: {msg}");
    panic!("{msg}");
}
