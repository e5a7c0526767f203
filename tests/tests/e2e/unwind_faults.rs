//! Hostile objects against the unwind table loader (issue 25), with the real agent: a
//! sparse file whose headers claim a 1,000 MiB `.eh_frame` must cost a counted refusal,
//! not a gigabyte of resident memory.
//!
//! Every test here samples, so each holds [`sampling_lock`] and needs root.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use ember_tests::*;

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

/// A valid x86-64 ELF shared object of one page (header, one R+X `PT_LOAD`, section
/// headers: null, `.eh_frame`, `.shstrtab`) whose `.eh_frame` header claims `eh_size`
/// bytes from file offset 4096, written to `path` and extended to `len` bytes without
/// writing them: a sparse file using a few KB of disk.
fn sparse_object(path: &Path, len: u64, eh_size: u64) {
    const NAMES: &[u8] = b"\0.eh_frame\0.shstrtab\0";
    let names_at = 64 + 56;
    let sh_at = (names_at + NAMES.len()).next_multiple_of(8);
    let mut f = vec![0u8; 4096];
    put(&mut f, 0, b"\x7fELF\x02\x01\x01");
    put(&mut f, 16, &3u16.to_le_bytes()); // ET_DYN
    put(&mut f, 18, &62u16.to_le_bytes()); // EM_X86_64
    put(&mut f, 20, &1u32.to_le_bytes());
    put(&mut f, 32, &64u64.to_le_bytes()); // e_phoff
    put(&mut f, 40, &(sh_at as u64).to_le_bytes()); // e_shoff
    put(&mut f, 52, &64u16.to_le_bytes());
    put(&mut f, 54, &56u16.to_le_bytes());
    put(&mut f, 56, &1u16.to_le_bytes()); // e_phnum
    put(&mut f, 58, &64u16.to_le_bytes());
    put(&mut f, 60, &3u16.to_le_bytes()); // e_shnum
    put(&mut f, 62, &2u16.to_le_bytes()); // e_shstrndx
    put(&mut f, 64, &1u32.to_le_bytes()); // PT_LOAD
    put(&mut f, 68, &5u32.to_le_bytes()); // PF_R | PF_X
    put(&mut f, 64 + 32, &4096u64.to_le_bytes()); // p_filesz
    put(&mut f, 64 + 40, &4096u64.to_le_bytes()); // p_memsz
    put(&mut f, names_at, NAMES);
    let section = |f: &mut Vec<u8>, i: usize, name: u32, kind: u32, offset: u64, size: u64| {
        let at = sh_at + i * 64;
        put(f, at, &name.to_le_bytes());
        put(f, at + 4, &kind.to_le_bytes());
        put(f, at + 24, &offset.to_le_bytes());
        put(f, at + 32, &size.to_le_bytes());
    };
    section(&mut f, 1, 1, 1, 4096, eh_size); // .eh_frame, SHT_PROGBITS
    section(&mut f, 2, 11, 3, names_at as u64, NAMES.len() as u64); // .shstrtab
    let mut file = fs::File::create(path).expect("object");
    file.write_all(&f).expect("write");
    file.set_len(len).expect("extend");
}

/// A process maps a sparse 1,000 MiB object whose `.eh_frame` claims all of it but its
/// first and last pages: ember refuses its table before reading the section
/// (`unwind_tables_built_total{result="section_too_large"}`) and its peak RSS stays far
/// below the section's size. Before the fix the loader read the section into a buffer as
/// long as the file and the agent's peak RSS reached about 1 GB.
#[test]
fn a_sparse_object_claiming_1000_mib_of_cfi_is_refused_unread() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tmp");
    let object = tmp.path().join("sparse.so");
    let len = 1000u64 << 20;
    sparse_object(&object, len, len - 8192);
    let script = "import mmap, os, sys\n\
                  print('pid', os.getpid(), flush=True)\n\
                  f = open(sys.argv[1], 'rb')\n\
                  m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, \
                  prot=mmap.PROT_READ | mmap.PROT_EXEC)\n\
                  print('ready', flush=True)\n\
                  sys.stdin.readline()\n";
    let mut mapper = Fixture::spawn(
        "/usr/bin/python3",
        &["-c", script, object.to_str().expect("utf-8")],
    )
    .expect("python3 mapping the object");
    mapper
        .wait_for("ready", Duration::from_secs(10))
        .expect("mapped");

    let addr = format!("127.0.0.1:{}", free_port());
    let pid = mapper.pid.to_string();
    let data = tmp.path().join("data");
    let mut ember = EmberRun::run(tmp.path())
        .args([
            "--window",
            "1s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            addr.as_str(),
            "--pid",
            pid.as_str(),
        ])
        .try_spawn()
        .expect("starting ember run");
    if ember.wait_attached(Duration::from_secs(20)).is_none() && !ember.running() {
        panic!("ember run exited early\n--- stderr ---\n{}", ember.stderr());
    }
    let refused = "ember_unwind_tables_built_total{result=\"section_too_large\"}";
    // The loader reads the mapper's objects right after it attaches; generous for a slow
    // machine (the outcome is a count, not a time).
    let metrics = metrics_until(&addr, Duration::from_secs(30), |m| {
        series_value(m, refused) >= 1.0
    });
    let peak = peak_rss(ember.pid());
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(20));
    drop(mapper);
    println!("peak RSS {} MiB", peak >> 20);
    assert!(
        status.success(),
        "ember exited {status}\n{}",
        ember.stderr()
    );
    assert!(series_value(&metrics, refused) >= 1.0, "{metrics}");
    // Idle RSS is 22-35 MB; reading the section would be 1,000 MB.
    assert!(
        peak > 0 && peak < 200 << 20,
        "peak RSS {} MiB\n{metrics}",
        peak >> 20
    );
}
