//! `/proc/PID/mountinfo`, and which file systems ember may read from at all.
//!
//! A request to a FUSE file system goes to a daemon that a pod may run, and one to a network
//! file system to a server that may be gone: either can leave the thread that sent it waiting
//! forever (`O_NONBLOCK` means nothing to them, and once the daemon has read a request not
//! even `SIGKILL` ends the wait). So ember sorts every mount into [`FsKind`] by its type, and
//! reads only from [`FsKind::Local`] ones (see the agent's `normalize::fs`).
//!
//! The parser is strict and total: a malformed line is skipped and counted, never a panic.
//! The strings in a line (mount points, sources, options) can be chosen by a container; the
//! kernel escapes whitespace and backslashes in them as `\ooo`.

use std::collections::HashMap;

/// What kind of file system a mount is, for the question "may ember read from it".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FsKind {
    /// Served by the kernel from local storage or memory (ext4, xfs, btrfs, tmpfs, overlay
    /// over those, ...): read.
    Local,
    /// A network or cluster file system (NFS, CIFS/SMB, 9p, Ceph, AFS, Lustre, GFS2, autofs,
    /// ...): a request waits for a server. Never read.
    Network,
    /// FUSE (`fuse`, `fuse.*`, `fuseblk`): a request waits for a userspace daemon, which a
    /// pod may run. Never read.
    Fuse,
}

/// Types (the part before any `.subtype`) whose requests go to a server or a userspace
/// daemon other than FUSE. `virtiofs` is not among them: it speaks FUSE to the host's own
/// daemon (`virtiofsd`), no tenant's, and is the root file system of VM-based nodes (Kata).
const NETWORK: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "ceph",
    "afs",
    "coda",
    "ncpfs",
    "lustre",
    "gfs2",
    "ocfs2",
    "glusterfs",
    "beegfs",
    "gpfs",
    "orangefs",
    "pvfs2",
    "vboxsf",
    "autofs",
    "davfs",
];

/// The kind of a file system type as mountinfo names it (`ext4`, `fuse.sshfs`, `nfs4`).
pub fn kind_of_type(fstype: &str) -> FsKind {
    let base = fstype.split('.').next().unwrap_or(fstype);
    match base {
        "fuse" | "fuseblk" => FsKind::Fuse,
        _ if NETWORK.contains(&base) => FsKind::Network,
        _ => FsKind::Local,
    }
}

/// One line of `/proc/PID/mountinfo`, the fields ember uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Mount id (field 1): unique among the mounts alive now (a freed id is reused).
    pub id: u32,
    /// Device of the file system (major, minor): what `/proc/PID/maps` shows for its files.
    pub dev: (u32, u32),
    /// Where it is mounted, relative to the process's root, unescaped.
    pub mount_point: String,
    /// File system type, with its subtype (`fuse.sshfs`).
    pub fstype: String,
    /// Super block options (`rw,lowerdir=...` for overlays), as the kernel wrote them.
    pub super_opts: String,
}

/// Parses mountinfo text; malformed lines are skipped and counted in the second value.
pub fn parse(text: &str) -> (Vec<Mount>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines().filter(|l| !l.is_empty()) {
        match parse_line(line) {
            Some(m) => out.push(m),
            None => bad += 1,
        }
    }
    (out, bad)
}

fn parse_line(line: &str) -> Option<Mount> {
    // id parent major:minor root mount_point options [optional fields...] - type source super
    let (head, tail) = line.split_once(" - ")?;
    let mut h = head.split(' ');
    let id = h.next()?.parse().ok()?;
    let _parent: u32 = h.next()?.parse().ok()?;
    let (major, minor) = h.next()?.split_once(':')?;
    let dev = (major.parse().ok()?, minor.parse().ok()?);
    let _root = h.next()?;
    let mount_point = unescape(h.next()?)?;
    let _options = h.next()?;
    let mut t = tail.splitn(3, ' ');
    let fstype = unescape(t.next()?)?;
    let _source = t.next()?;
    let super_opts = t.next().unwrap_or("").to_owned();
    if fstype.is_empty() || !mount_point.starts_with('/') {
        return None;
    }
    Some(Mount {
        id,
        dev,
        mount_point,
        fstype,
        super_opts,
    })
}

/// Undoes the kernel's `\ooo` escapes (space, tab, newline, backslash and any other byte it
/// chose to escape); `None` for a backslash not followed by three octal digits.
fn unescape(s: &str) -> Option<String> {
    if !s.contains('\\') {
        return Some(s.to_owned());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            let digits = b.get(i + 1..i + 4)?;
            if !digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                return None;
            }
            let v = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(v).ok()?);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The layer directories of an overlay (`lowerdir`, `upperdir`, `workdir`, `lowerdir+`,
/// `datadir+`), absolute paths only: a runtime that mounted with paths relative to its own
/// working directory (Docker's `l/…` links) left nothing ember could resolve.
pub fn overlay_layers(super_opts: &str) -> Vec<String> {
    let mut out = Vec::new();
    for opt in super_opts.split(',') {
        let Some((key, value)) = opt.split_once('=') else {
            continue;
        };
        if !matches!(
            key,
            "lowerdir" | "upperdir" | "workdir" | "lowerdir+" | "datadir+"
        ) {
            continue;
        }
        // Layers are separated by `:` (`::` before data-only layers); a `:` inside a path
        // is escaped, as `\:` or `\072`.
        for part in split_unescaped(value, ':') {
            if let Some(p) = unescape(&part.replace("\\:", "\\072")) {
                if p.starts_with('/') {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// Splits `s` at each `sep` not preceded by a backslash.
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if c == sep && !escaped {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
        escaped = c == '\\' && !escaped;
    }
    parts.push(cur);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// The kind of every mount, by mount id: its type's kind, and for an overlay the worst of
/// that and of the mounts its layer directories lie on (the mounts on the longest mount
/// point above each layer, not the overlay itself), so an overlay over a FUSE directory is
/// FUSE too. Nested overlays are followed a few levels deep. Linear in the layers and their
/// path depth (a container can make thousands of mounts).
pub fn kinds(mounts: &[Mount]) -> HashMap<u32, FsKind> {
    let mut at: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, m) in mounts.iter().enumerate() {
        at.entry(m.mount_point.as_str()).or_default().push(i);
    }
    // For each overlay, the mounts under its layers (found once).
    let mut below: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        if m.fstype != "overlay" {
            continue;
        }
        let mut under = Vec::new();
        for layer in overlay_layers(&m.super_opts) {
            let mut point = layer.as_str();
            loop {
                if let Some(js) = at.get(point) {
                    let others: Vec<usize> = js.iter().copied().filter(|&j| j != i).collect();
                    if !others.is_empty() {
                        under.extend(others);
                        break;
                    }
                }
                if point == "/" {
                    break;
                }
                point = match point.rfind('/') {
                    Some(0) => "/",
                    Some(n) => &point[..n],
                    None => break,
                };
            }
        }
        below.push((i, under));
    }
    let mut kind: Vec<FsKind> = mounts.iter().map(|m| kind_of_type(&m.fstype)).collect();
    for _ in 0..4 {
        for (i, under) in &below {
            let worst = under
                .iter()
                .map(|&j| kind[j])
                .max()
                .unwrap_or(FsKind::Local);
            kind[*i] = kind[*i].max(worst);
        }
    }
    let mut out = HashMap::with_capacity(mounts.len());
    for (m, k) in mounts.iter().zip(kind) {
        out.entry(m.id)
            .and_modify(|old: &mut FsKind| *old = (*old).max(k))
            .or_insert(k);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
42 22 0:39 / /tmp/fz/mnt rw,nosuid,nodev,relatime - fuse.ember_stall ember_stall rw,user_id=0,group_id=0
43 22 0:40 / /mnt/with\\040space rw - nfs4 server:/export rw,vers=4.2
44 22 0:41 / /srv/ov rw,relatime - overlay overlay rw,lowerdir=/tmp/fz/mnt/lower:/data/l2,upperdir=/data/up,workdir=/data/work
45 22 0:42 / /srv/ok rw,relatime - overlay overlay rw,lowerdir=/data/lower,upperdir=/data/up,workdir=/data/work
46 22 0:43 / /run/kata rw - virtiofs kataShared rw
47 22 0:44 / /docker rw - overlay overlay rw,lowerdir=l/AAA:l/BBB,upperdir=/data/up
garbage line
";

    #[test]
    fn parses_and_unescapes() {
        let (mounts, bad) = parse(TEXT);
        assert_eq!(bad, 1);
        assert_eq!(mounts.len(), 7);
        assert_eq!(mounts[0].dev, (254, 0));
        assert_eq!(mounts[1].fstype, "fuse.ember_stall");
        assert_eq!(mounts[2].mount_point, "/mnt/with space");
        assert!(mounts[3].super_opts.contains("lowerdir="));
    }

    #[test]
    fn sorts_mounts_by_kind() {
        let (mounts, _) = parse(TEXT);
        let k = kinds(&mounts);
        assert_eq!(k[&22], FsKind::Local);
        assert_eq!(k[&42], FsKind::Fuse);
        assert_eq!(k[&43], FsKind::Network);
        assert_eq!(k[&44], FsKind::Fuse, "an overlay over a FUSE layer");
        assert_eq!(k[&45], FsKind::Local);
        assert_eq!(k[&46], FsKind::Local, "virtiofs: the host's daemon");
        assert_eq!(k[&47], FsKind::Local, "relative layers are not resolved");
        for (t, want) in [
            ("fuseblk", FsKind::Fuse),
            ("fuse", FsKind::Fuse),
            ("fusectl", FsKind::Local),
            ("cifs", FsKind::Network),
            ("9p", FsKind::Network),
            ("autofs", FsKind::Network),
            ("tmpfs", FsKind::Local),
        ] {
            assert_eq!(kind_of_type(t), want, "{t}");
        }
    }

    #[test]
    fn layers_split_at_unescaped_colons() {
        assert_eq!(
            overlay_layers("rw,lowerdir=/a\\:b:/c::/d,upperdir=/u,workdir=w,uuid=on"),
            vec!["/a:b", "/c", "/d", "/u"]
        );
        assert_eq!(overlay_layers("lowerdir+=/x,datadir+=/y"), vec!["/x", "/y"]);
    }

    #[test]
    fn hostile_lines_do_not_panic() {
        for line in [
            "",
            " - ",
            "1 2 3:4 / /a b - ",
            "1 2 x:y / / rw - ext4 s o",
            "1 2 3:4 / /\\0 rw - ext4 s o",
            "1 2 3:4 / /\\777 rw - ext4 s o",
            "1 2 3:4 / relative rw - ext4 s o",
            "\u{0}\u{0} - \u{0}",
        ] {
            let _ = parse(line);
        }
    }
}
