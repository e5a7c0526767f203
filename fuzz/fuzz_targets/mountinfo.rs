//! mountinfo parser and file system kinds: never panic, whatever the mount points, sources
//! and options a container chose; every mount parsed gets a kind.
#![no_main]

use ember_parse::mountinfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (mounts, bad) = mountinfo::parse(&text);
    assert!(mounts.len() + bad <= text.lines().count());
    let kinds = mountinfo::kinds(&mounts);
    for m in &mounts {
        assert!(kinds.contains_key(&m.id));
        for layer in mountinfo::overlay_layers(&m.super_opts) {
            assert!(layer.starts_with('/'));
        }
        let _ = mountinfo::kind_of_type(&m.fstype);
    }
});
