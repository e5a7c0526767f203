//! Container cgroups on the hierarchy that holds the `perf_event` controller.
//!
//! Per-container perf counters (`PERF_FLAG_PID_CGROUP`) take an fd of a directory in
//! that hierarchy, and the run-queue latency program keys its per-container histograms
//! by the kernfs id of the same directory (its inode number). On cgroup v1 hosts with a
//! `perf_event` mount that is `/sys/fs/cgroup/perf_event`; otherwise the controller is
//! on the v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts),
//! where it is implicitly enabled in every cgroup.
//!
//! The tree is walked each interval (bounded in depth and directories); a directory whose
//! path names a container (see [`crate::workload::cgroup`]) is one container and is not descended
//! into, since a cgroup's perf events also count its descendants.

use std::collections::VecDeque;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::workload::kube::Metadata;

/// Deepest directory looked at below the root (kubelet's systemd layout is 4 deep).
pub const MAX_DEPTH: usize = 8;

/// Most directories visited per scan, however large (or hostile) the tree is.
pub const MAX_DIRS: usize = 20_000;

/// One container's cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCgroup {
    /// The directory.
    pub dir: PathBuf,
    /// Its inode number: the kernfs id BPF reads from `cgroup->kn->id`.
    pub inode: u64,
    /// Container id (64 hex) from the path.
    pub container_id: String,
    /// Pod uid from the path, empty outside pods.
    pub pod_uid: String,
}

/// The directory where the `perf_event` controller's hierarchy is mounted, from the text
/// of `/proc/self/mountinfo`: a v1 `cgroup` mount whose options include `perf_event`, else
/// the `cgroup2` mount.
pub fn perf_event_root_from(mountinfo: &str) -> Option<PathBuf> {
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut r = right.split(' ');
        let (Some(fstype), Some(_source), Some(options)) = (r.next(), r.next(), r.next()) else {
            continue;
        };
        let mount_point = PathBuf::from(unescape(mount_point));
        match fstype {
            "cgroup" if options.split(',').any(|o| o == "perf_event") => return Some(mount_point),
            "cgroup2" if v2.is_none() => v2 = Some(mount_point),
            _ => {}
        }
    }
    v2
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// [`perf_event_root_from`] on this process's mount table.
pub fn perf_event_root() -> Option<PathBuf> {
    let text = crate::os::procfs::read_capped(Path::new("/proc/self/mountinfo"), 1 << 20).ok()?;
    perf_event_root_from(&text)
}

/// What a walk found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Containers, in walk order (outermost first).
    pub containers: Vec<ContainerCgroup>,
    /// Directories not visited because of [`MAX_DIRS`].
    pub truncated: bool,
}

/// Walks `root` breadth first for container cgroups.
pub fn scan(root: &Path) -> Scan {
    let mut out = Scan::default();
    let mut queue = VecDeque::from([(root.to_path_buf(), 0usize)]);
    let mut visited = 0usize;
    while let Some((dir, depth)) = queue.pop_front() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            visited += 1;
            if visited > MAX_DIRS {
                out.truncated = true;
                return out;
            }
            let path = e.path();
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let info =
                crate::workload::cgroup::parse_proc_cgroup(&format!("0::/{}\n", rel.display()));
            match info.container_id {
                Some(id) => {
                    if let Ok(meta) = e.metadata() {
                        out.containers.push(ContainerCgroup {
                            dir: path,
                            inode: meta.ino(),
                            container_id: id,
                            pod_uid: info.pod_uid.unwrap_or_default(),
                        });
                    }
                }
                None if depth + 1 < MAX_DEPTH => queue.push_back((path, depth + 1)),
                None => {}
            }
        }
    }
    out
}

/// `namespace`, `pod`, `container`, `container_id` labels of a container, the first three
/// from the pod watch when it knows the container (empty otherwise).
pub fn labels(c: &ContainerCgroup, meta: Option<&Metadata>) -> Vec<(&'static str, String)> {
    let pod = meta.and_then(|m| m.by_container_id(&c.container_id));
    let (ns, pod_name, container) = pod
        .map(|p| (p.namespace.clone(), p.pod.clone(), p.container.clone()))
        .unwrap_or_default();
    vec![
        ("namespace", ns),
        ("pod", pod_name),
        ("container", container),
        ("container_id", c.container_id.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 30 0:22 / /sys fs rw,nosuid - sysfs sysfs rw
30 1 254:1 / / rw,relatime - ext4 /dev/vda1 rw
33 24 0:27 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
34 33 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
36 33 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn perf_event_root_prefers_a_v1_mount_then_v2() {
        assert_eq!(
            perf_event_root_from(HYBRID),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let v1 = format!(
            "{HYBRID}40 33 0:33 / /sys/fs/cgroup/perf_event rw - cgroup cgroup rw,perf_event\n"
        );
        assert_eq!(
            perf_event_root_from(&v1),
            Some(PathBuf::from("/sys/fs/cgroup/perf_event"))
        );
        assert_eq!(perf_event_root_from("garbage\n\n- -\n"), None);
        assert_eq!(
            perf_event_root_from("1 2 0:1 / /a\\040b rw - cgroup2 none rw\n"),
            Some(PathBuf::from("/a b"))
        );
    }

    #[test]
    fn scan_finds_container_directories_and_not_their_children() {
        let root = tempfile::tempdir().unwrap();
        let id = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee01";
        let id2 = "beef0000beef0000beef0000beef0000beef0000beef0000beef0000beef0002";
        let uid = "11111111-2222-3333-4444-555555555555";
        let kubelet = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
            uid.replace('-', "_")
        );
        std::fs::create_dir_all(root.path().join(&kubelet).join("inner")).unwrap();
        std::fs::create_dir_all(root.path().join(format!("system.slice/docker-{id2}.scope")))
            .unwrap();
        std::fs::create_dir_all(root.path().join("system.slice/ssh.service")).unwrap();
        std::fs::create_dir_all(
            root.path()
                .join(format!("system.slice/crio-conmon-{id2}.scope")),
        )
        .unwrap();
        let s = scan(root.path());
        assert!(!s.truncated);
        let mut found: Vec<(String, String)> = s
            .containers
            .iter()
            .map(|c| (c.container_id.clone(), c.pod_uid.clone()))
            .collect();
        found.sort();
        assert_eq!(
            found,
            vec![
                (id2.to_owned(), String::new()),
                (id.to_owned(), uid.to_owned())
            ]
        );
        let c = s.containers.iter().find(|c| c.container_id == id).unwrap();
        assert_eq!(c.dir, root.path().join(&kubelet));
        assert_eq!(c.inode, std::fs::metadata(&c.dir).unwrap().ino());
        let l = labels(c, None);
        assert_eq!(l[3], ("container_id", id.to_owned()));
        assert_eq!(l[0], ("namespace", String::new()));
    }
}
