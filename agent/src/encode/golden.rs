//! Golden tests of the encoders: one fixed symbolized window (kernel, object, region,
//! unknown and JIT frames; host, container and pod workloads) encoded as pprof, as
//! Pyroscope push and ingest requests, and as an OTLP export request, compared byte for
//! byte with files under `agent/src/encode/testdata/`. A refactor that changes no behaviour
//! leaves every file identical; `EMBER_BLESS=1 cargo test golden` rewrites them after a
//! deliberate change (and the diff shows it in review).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use prost::Message;

use crate::aggregate::{Frame, Stack, Window};
use crate::encode::Encoded;
use crate::model::{Func, JitSource, Labels};
use crate::process::jit::JitFrame;
use crate::process::object::Object;
use crate::process::table::UserAddr;
use crate::push_proto::PushRequest;
use crate::symbolize::{assemble, FrameKey, Resolved};

fn func(name: &str, file: Option<&str>, line: u32) -> Func {
    Func {
        name: Arc::from(name),
        file: file.map(Arc::from),
        line,
    }
}

fn named(funcs: Vec<Func>) -> Resolved {
    Resolved {
        funcs: funcs.into(),
        named: true,
    }
}

fn object(path: &str, build_id: Option<Vec<u8>>) -> Arc<Object> {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut o = Object::open_local(&here).expect("open Cargo.toml as an object");
    o.path = path.to_owned();
    o.build_id = build_id;
    Arc::new(o)
}

/// The fixed input: three workloads, every kind of frame, inlined functions, shared frames.
fn fixture() -> (Window, HashMap<FrameKey, Resolved>) {
    let app = object("/usr/bin/app", Some(vec![0xde, 0xad, 0xbe, 0xef, 0x01]));
    let libc = object("/usr/lib/x86_64-linux-gnu/libc.so.6", None);
    let host = Arc::new(Labels {
        cgroup: "/system.slice/cron.service".into(),
        systemd_unit: "cron.service".into(),
        ..Labels::default()
    });
    let pod = Arc::new(Labels {
        container_id: "a".repeat(64),
        pod_uid: "0f1e2d3c-0000-4000-8000-000000000001".into(),
        namespace: "shop".into(),
        pod: "cart-7d9f-abcde".into(),
        container: "cart".into(),
        service_name: "shop/cart".into(),
        pod_labels: BTreeMap::from([("app".into(), "cart".into())]),
        ..Labels::default()
    });
    let bare = Arc::new(Labels {
        container_id: "b".repeat(64),
        ..Labels::default()
    });
    let jit = |name: &str, file: Option<&str>, line, addr, source| {
        Frame::User(UserAddr::Jit(Arc::new(JitFrame {
            source,
            name: Arc::from(name),
            file: file.map(Arc::from),
            line,
            addr,
        })))
    };
    let obj = |o: &Arc<Object>, off| Frame::User(UserAddr::Object(o.clone(), off));
    let stack = |pid, tid, comm: &str, process: &str, labels: &Arc<Labels>, frames, count| Stack {
        pid,
        tid,
        comm: comm.into(),
        process: Arc::from(process),
        labels: labels.clone(),
        frames,
        count,
        off_cpu: None,
        runtime: None,
    };
    let stacks = vec![
        stack(
            100,
            100,
            "app",
            "app",
            &host,
            vec![
                Frame::Kernel(0xffff_ffff_8100_1000),
                Frame::Kernel(0xffff_ffff_8100_2000),
                obj(&libc, 0x9_1000),
                obj(&app, 0x1200),
                obj(&app, 0x1100),
            ],
            40,
        ),
        stack(
            100,
            101,
            "app-worker",
            "app",
            &host,
            vec![obj(&app, 0x1300), obj(&app, 0x1100)],
            25,
        ),
        stack(
            200,
            201,
            "node",
            "node",
            &pod,
            vec![
                jit(
                    "LazyCompile:*hot /srv/a.js:3",
                    None,
                    0,
                    0x7f00_0000_1000,
                    JitSource::PerfMap,
                ),
                jit(
                    "hotB",
                    Some("/srv/b.js"),
                    12,
                    0x7f00_0000_2000,
                    JitSource::JitDump,
                ),
                Frame::User(UserAddr::Region(Arc::from("[anon]"), 0x7f00_0000_3000)),
                obj(&libc, 0x2_7000),
            ],
            17,
        ),
        stack(
            300,
            300,
            "sh",
            "sh",
            &bare,
            vec![
                Frame::Kernel(0xffff_ffff_8100_1000),
                Frame::User(UserAddr::Region(Arc::from("[vdso]"), 0x9c0)),
                Frame::User(UserAddr::Unknown(0x5555_0000_0042)),
            ],
            3,
        ),
        stack(
            301,
            301,
            "sh",
            "sh",
            &bare,
            vec![obj(&libc, 0x9_1000), obj(&libc, 0x5_5000)],
            1,
        ),
    ];
    let window = Window {
        start: UNIX_EPOCH + Duration::from_secs(1_790_000_000),
        duration: Duration::from_secs(10),
        period_ns: 10_101_010,
        kind: Default::default(),
        stacks,
    };
    let mut symbols = HashMap::new();
    symbols.insert(
        FrameKey::Kernel(0xffff_ffff_8100_1000),
        named(vec![func("do_syscall_64", None, 0)]),
    );
    // 0xffff_ffff_8100_2000 has no symbol: named as the symbolizer names it, by its
    // offset from the kernel's text start, never by its address.
    // (`Kallsyms::unnamed`, with `_text` at 0xffff_ffff_8100_0000; its own test checks it).
    symbols.insert(
        FrameKey::Kernel(0xffff_ffff_8100_2000),
        Resolved {
            funcs: vec![func("[kernel.kallsyms]+0x2000", None, 0)].into(),
            named: false,
        },
    );
    symbols.insert(
        FrameKey::Object(libc.id, 0x9_1000),
        named(vec![func("qsort_r", None, 0)]),
    );
    symbols.insert(
        FrameKey::Object(app.id, 0x1200),
        named(vec![
            func("compare", Some("app.c"), 14),
            func("sort_all", Some("app.c"), 30),
        ]),
    );
    symbols.insert(
        FrameKey::Object(app.id, 0x1100),
        named(vec![func("main", Some("app.c"), 50)]),
    );
    symbols.insert(
        FrameKey::Object(app.id, 0x1300),
        named(vec![func("worker", Some("app.c"), 70)]),
    );
    symbols.insert(
        FrameKey::Object(libc.id, 0x2_7000),
        named(vec![func("__libc_start_call_main", None, 0)]),
    );
    (window, symbols)
}

/// The fixture, named as the symbolizer names a window, and encoded as the output thread does.
fn encoded() -> Encoded {
    let (window, symbols) = fixture();
    Encoded::new(assemble(window, &symbols), &mut super::pprof::Gzip::new()).expect("encode")
}

/// Compares `bytes` with the golden file `name` (or writes it under `EMBER_BLESS=1`).
fn golden(name: &str, bytes: &[u8]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/encode/testdata")
        .join(name);
    if std::env::var_os("EMBER_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, bytes).expect("write golden file");
        return;
    }
    let want = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (EMBER_BLESS=1 writes it)", path.display()));
    assert!(
        want == bytes,
        "{} differs from the encoder's output ({} vs {} bytes)",
        path.display(),
        want.len(),
        bytes.len()
    );
}

#[test]
fn pprof_bytes_are_golden() {
    let e = encoded();
    assert_eq!(e.samples, 86);
    assert_eq!((e.frames.named, e.frames.unnamed, e.frames.jit), (9, 5, 2));
    golden("cpu.pb", &e.profile.encode_to_vec());
    golden("cpu.pb.gz", &e.gz);
}

#[test]
fn pyroscope_requests_are_golden() {
    let e = encoded();
    let cfg: crate::config::PyroscopeSink = serde_yaml::from_str(
        "{enabled: true, labels: {cluster: c1}, sample_labels: [process, thread, comm]}",
    )
    .expect("pyroscope config");
    let push = crate::export::pyroscope::Encoder::new(&cfg, Default::default())
        .requests(&e.window)
        .expect("push requests");
    assert_eq!(push.len(), 1);
    let mut body = Vec::new();
    flate2::read::GzDecoder::new(&push[0].body[..])
        .read_to_end(&mut body)
        .expect("gunzip the push body");
    let mut req = PushRequest::decode(&body[..]).expect("decode the push body");
    // Profile ids are random UUIDs.
    for s in req.series.iter_mut().flat_map(|s| &mut s.samples) {
        assert_eq!(s.id.len(), 36);
        s.id.clear();
    }
    golden("pyroscope-push.pb", &req.encode_to_vec());

    let cfg: crate::config::PyroscopeSink =
        serde_yaml::from_str("{enabled: true, api: ingest}").expect("ingest config");
    let ingest = crate::export::pyroscope::Encoder::new(&cfg, Default::default())
        .requests(&e.window)
        .expect("ingest requests");
    let mut text = String::new();
    for r in &ingest {
        text.push_str(&format!("{} {} {}\n", r.path, r.content_type, r.gzip));
    }
    golden("pyroscope-ingest.txt", text.as_bytes());
    let bodies: Vec<u8> = ingest.iter().flat_map(|r| r.body.to_vec()).collect();
    golden("pyroscope-ingest.bodies", &bodies);
}

#[test]
fn otlp_requests_are_golden() {
    let e = encoded();
    for (per, name) in [
        ("container", "otlp-container.pb"),
        ("process", "otlp-process.pb"),
    ] {
        let cfg: crate::config::OtlpSink =
            serde_yaml::from_str(&format!("{{enabled: true, resource_per: {per}}}"))
                .expect("otlp config");
        let req = crate::export::otlp::Encoder::new(&cfg, "node-1").request(&e.window);
        golden(name, &req.encode_to_vec());
    }
}

/// Any 64-bit kernel address (`0xffff8…` and up) in `text`, hex with or without `0x`, or
/// decimal (20 digits from `18446…`).
fn kernel_address_in(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let b = lower.as_bytes();
    (0..b.len()).find_map(|i| {
        if i > 0 && b[i - 1].is_ascii_alphanumeric() {
            return None;
        }
        let hex = b[i..].iter().take_while(|c| c.is_ascii_hexdigit()).count();
        let dec = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        ((hex == 16 && lower[i..].starts_with("ffff"))
            || (dec == 20 && lower[i..].starts_with("1844")))
        .then(|| lower[i..i + hex.max(dec)].to_string())
    })
}

/// A pprof profile: no location address, mapping bound or string is a kernel address.
fn assert_no_kernel_address(what: &str, p: &crate::proto::Profile) {
    const KERNEL: u64 = 0xffff_8000_0000_0000;
    assert!(
        p.location.iter().all(|l| l.address < KERNEL),
        "{what}: a location"
    );
    assert!(
        p.mapping
            .iter()
            .all(|m| m.memory_start < KERNEL && m.memory_limit < KERNEL),
        "{what}: a mapping's bounds"
    );
    let strings = p.string_table.join("\n");
    assert_eq!(kernel_address_in(&strings), None, "{what}: a string");
}

/// Issue 58: no kernel address in any encoding of a window with kernel frames (pprof,
/// Pyroscope push and ingest, OTLP, folded, SVG); the named frame keeps its name, the
/// unnamed one is an offset from the text start.
#[test]
fn no_kernel_address_in_any_encoding() {
    let e = encoded();
    assert_no_kernel_address("pprof", &e.profile);
    let names = &e.profile.string_table;
    assert!(names.iter().any(|n| n == "do_syscall_64"));
    assert!(
        names.iter().any(|n| n == "[kernel.kallsyms]+0x2000"),
        "{names:?}"
    );
    let folded = crate::encode::flamegraph::folded(&e.profile).join("\n");
    assert_eq!(kernel_address_in(&folded), None, "folded");
    assert!(folded.contains("do_syscall_64") && folded.contains("[kernel.kallsyms]+0x2000"));
    let svg = crate::encode::flamegraph::svg(&e.profile, "t").expect("svg");
    assert_eq!(
        kernel_address_in(&String::from_utf8_lossy(&svg)),
        None,
        "svg"
    );
    for api in ["push", "ingest"] {
        let cfg: crate::config::PyroscopeSink =
            serde_yaml::from_str(&format!("{{enabled: true, api: {api}}}")).expect("config");
        for r in crate::export::pyroscope::Encoder::new(&cfg, Default::default())
            .requests(&e.window)
            .expect("requests")
        {
            let mut body = r.body.to_vec();
            if r.gzip {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(&body[..])
                    .read_to_end(&mut out)
                    .expect("gunzip");
                body = out;
            }
            let profiles: Vec<crate::proto::Profile> = match PushRequest::decode(&body[..]) {
                Ok(push) if api == "push" => push
                    .series
                    .iter()
                    .flat_map(|s| &s.samples)
                    .map(|s| {
                        crate::encode::flamegraph::decode_gz(&s.raw_profile)
                            .or_else(|_| {
                                crate::proto::Profile::decode(&s.raw_profile[..])
                                    .map_err(super::flamegraph::FlameGraphError::from)
                            })
                            .expect("pprof")
                    })
                    .collect(),
                _ => vec![crate::encode::flamegraph::decode_gz(&body)
                    .or_else(|_| {
                        crate::proto::Profile::decode(&body[..])
                            .map_err(super::flamegraph::FlameGraphError::from)
                    })
                    .expect("ingest pprof")],
            };
            assert!(!profiles.is_empty(), "{api}");
            for p in &profiles {
                assert_no_kernel_address(api, p);
            }
        }
    }
    let cfg: crate::config::OtlpSink =
        serde_yaml::from_str("{enabled: true, resource_per: process}").expect("otlp config");
    let req = crate::export::otlp::Encoder::new(&cfg, "node-1").request(&e.window);
    let dict = req.dictionary.as_ref().expect("dictionary");
    const KERNEL: u64 = 0xffff_8000_0000_0000;
    assert!(
        dict.location_table.iter().all(|l| l.address < KERNEL),
        "otlp location"
    );
    assert!(
        dict.mapping_table
            .iter()
            .all(|m| m.memory_start < KERNEL && m.memory_limit < KERNEL),
        "otlp mapping"
    );
    assert_eq!(
        kernel_address_in(&dict.string_table.join("\n")),
        None,
        "otlp strings"
    );
}
