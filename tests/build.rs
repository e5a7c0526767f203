//! Builds the fixture workloads in `fixtures/` into OUT_DIR and hands their paths to
//! the tests as `FIXTURE_<NAME>` (e.g. `FIXTURE_CPU_HOG`, `FIXTURE_NOFP_QSORT`).
//!
//! Two kinds of fixtures:
//! - frame-pointer fixtures (`FIXTURES`, C, [`FP_CFLAGS`]): what ember's frame-pointer
//!   unwinder handles completely;
//! - no-frame-pointer fixtures (`NOFP_FIXTURES`: C and C++ with [`NOFP_CFLAGS`], and one
//!   Rust file built by rustc with its default codegen): only `.eh_frame` describes their
//!   frames, so a frame-pointer unwinder loses everything above the leaf (issue 11). They
//!   keep `-g` so that perf and ember can name their functions.
//!
//! clang, not gcc: gcc 12 drops the leaf's frame pointer even with
//! `-mno-omit-leaf-frame-pointer`, which loses the leaf's caller from stacks.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Frame-pointer fixture sources (without `.c`).
const FIXTURES: &[&str] = &[
    "cpu_hog",
    "syscall_hog",
    "short_lived",
    "jit_hog",
    "offcpu",
    "fuse_stall",
    "wakers",
];

const FP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pthread",
];

/// How a no-frame-pointer fixture is compiled.
enum Lang {
    /// clang, [`NOFP_CFLAGS`].
    C,
    /// clang, [`NOFP_CFLAGS`] plus `-static` (see burst_launcher.c for why).
    CStatic,
    /// clang++, [`NOFP_CFLAGS`].
    Cxx,
    /// rustc with its defaults for a release build (no frame pointers).
    Rust,
}

/// No-frame-pointer fixtures: (source file in `fixtures/`, binary name, language).
const NOFP_FIXTURES: &[(&str, &str, Lang)] = &[
    ("nofp_qsort.c", "nofp_qsort", Lang::C),
    ("nofp_signal.c", "nofp_signal", Lang::C),
    ("nofp_vdso.c", "nofp_vdso", Lang::C),
    ("nofp_burst.c", "nofp_burst", Lang::C),
    ("burst_launcher.c", "burst_launcher", Lang::CStatic),
    ("nofp_cxx.cc", "nofp_cxx", Lang::Cxx),
    ("nofp_rust.rs", "nofp_rust", Lang::Rust),
];

const NOFP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-Wall",
    "-Wextra",
    "-Werror",
];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo")).join("fixtures");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let clangxx = env::var("CLANGXX").unwrap_or_else(|_| format!("{clang}++"));
    // The rustc cargo runs (a toolchain override applies to it as well).
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=CLANGXX");
    println!("cargo:rerun-if-changed=fixtures/common.h");

    for cc in [&clang, &clangxx] {
        match Command::new(cc).arg("--version").output() {
            Ok(o) if o.status.success() => {}
            _ => fail(&format!(
                "`{cc}` was not found or does not run: the test fixtures are C and C++ programs \
                 built with clang. Install it with `make deps` (or `apt-get install clang`), or \
                 point CLANG (and CLANGXX) at one."
            )),
        }
    }

    for name in FIXTURES {
        let src = dir.join(format!("{name}.c"));
        println!("cargo:rerun-if-changed=fixtures/{name}.c");
        let bin = out.join(name);
        run(Command::new(&clang).args(FP_CFLAGS), &src, &bin);
        export(name, &bin);
    }

    for (file, name, lang) in NOFP_FIXTURES {
        let src = dir.join(file);
        println!("cargo:rerun-if-changed=fixtures/{file}");
        let bin = out.join(name);
        let mut cmd = match lang {
            Lang::C => {
                let mut c = Command::new(&clang);
                c.args(NOFP_CFLAGS);
                c
            }
            Lang::CStatic => {
                let mut c = Command::new(&clang);
                c.args(NOFP_CFLAGS).arg("-static");
                c
            }
            Lang::Cxx => {
                let mut c = Command::new(&clangxx);
                c.args(NOFP_CFLAGS);
                c
            }
            Lang::Rust => {
                let mut c = Command::new(&rustc);
                // rustc itself reads no RUSTFLAGS, but make sure nothing of the workspace's
                // build (which forces frame pointers) leaks into this one: the fixture is a
                // release build with rustc's default codegen, as users ship them.
                c.env_remove("RUSTFLAGS")
                    .env_remove("CARGO_ENCODED_RUSTFLAGS")
                    .env_remove("CARGO_BUILD_RUSTFLAGS")
                    .args([
                        "--edition",
                        "2021",
                        "-C",
                        "opt-level=3",
                        "-g",
                        "-D",
                        "warnings",
                    ]);
                c
            }
        };
        run(&mut cmd, &src, &bin);
        export(name, &bin);
    }
}

/// Tells the tests where a fixture is.
fn export(name: &str, bin: &Path) {
    println!(
        "cargo:rustc-env=FIXTURE_{}={}",
        name.to_uppercase(),
        bin.display()
    );
}

/// Runs `cmd -o BIN SRC` and fails the build with one clear sentence if it fails.
fn run(cmd: &mut Command, src: &Path, bin: &Path) {
    let prog = cmd.get_program().to_string_lossy().into_owned();
    match cmd.arg("-o").arg(bin).arg(src).status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("{prog} failed ({s}) building {}", src.display())),
        Err(e) => fail(&format!("could not run {prog} for {}: {e}", src.display())),
    }
}

fn fail(msg: &str) -> ! {
    // A build script's panic message is shown by cargo; make it the one sentence that matters.
    eprintln!("error: {msg}");
    panic!("{msg}");
}
