//! The one walker of the cgroup hierarchies: which directories are containers' cgroups.
//!
//! In: the hierarchies the readings sources ask for each interval ([`Request`]: a root and
//! the [`Rules`] the source reads it with). Out: one [`Inventory`] per interval, from which
//! each source takes its [`Scan`], so the USE container readings, the perf counters and
//! run-queue latency all see the containers of one walk. A hierarchy several sources ask
//! for (the v2 mount holds the USE readings' PSI and, on v2 and hybrid hosts, `perf_event`)
//! is walked once.
//!
//! A walk goes breadth first (shallowest first), never follows a symlink, and is bounded by
//! its rules in depth and in directories looked at; a directory whose path names a container
//! (see [`crate::workload::cgroup`]) is that container's cgroup. The two rule sets, the only
//! place these caps live:
//!
//! - [`RESOURCES`] (USE readings): 16 deep, 100 000 directories; a container's directory is
//!   walked into too (a nested container, kind or docker-in-docker seen from the host, is one
//!   of its own), and the reader keeps the shallowest directory of each container id;
//! - [`COUNTERS`] (perf counters, run-queue latency): 8 deep, 20 000 directories; a
//!   container's directory is not descended into, since a cgroup's perf events also count its
//!   descendants.
//!
//! Per-container perf counters (`PERF_FLAG_PID_CGROUP`) take an fd of a directory in the
//! hierarchy that holds the `perf_event` controller, and the run-queue latency program keys
//! its per-container histograms by the kernfs id of the same directory (its inode number). On
//! cgroup v1 hosts with a `perf_event` mount that is `/sys/fs/cgroup/perf_event`; otherwise
//! the controller is on the v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid
//! hosts), where it is implicitly enabled in every cgroup ([`perf_event_root`]).

use std::collections::VecDeque;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How a source looks at a hierarchy: how deep, how many directories, and whether it walks
/// into a container's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Deepest directory looked at (the root's children are at depth 1).
    pub max_depth: usize,
    /// Most directories looked at per walk, however large (or hostile) the tree is; the rest
    /// are reported in [`Scan::dropped_dirs`].
    pub max_dirs: usize,
    /// Whether a container's sub-cgroups (and containers nested in it) are walked too.
    pub descend: bool,
}

/// The USE container readings' rules (kubelet's systemd layout is 4 deep).
pub const RESOURCES: Rules = Rules {
    max_depth: 16,
    max_dirs: 100_000,
    descend: true,
};

/// The perf counters' and run-queue latency's rules.
pub const COUNTERS: Rules = Rules {
    max_depth: 8,
    max_dirs: 20_000,
    descend: false,
};

/// A hierarchy a source wants walked this interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The hierarchy's root directory.
    pub root: PathBuf,
    /// How the source looks at it.
    pub rules: Rules,
}

impl Request {
    /// What the per-container counters and run-queue latency ask for: the `perf_event`
    /// hierarchy at `root` (when there is one), with the [`COUNTERS`] rules.
    pub fn counters(root: Option<&PathBuf>) -> Vec<Request> {
        root.map(|root| Request {
            root: root.clone(),
            rules: COUNTERS,
        })
        .into_iter()
        .collect()
    }
}

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

/// What one source sees of one hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Containers, in walk order (shallowest first).
    pub containers: Vec<ContainerCgroup>,
    /// Directories not looked at because of the rules' `max_dirs`: the one over the cap and
    /// those whose contents would have been looked at next. 0 when the whole tree was seen.
    pub dropped_dirs: u64,
}

/// The container cgroups of one readings interval: each requested hierarchy walked once.
#[derive(Debug, Default)]
pub struct Inventory {
    walks: Vec<Walk>,
    /// Each requested root and the walk that covers it.
    roots: Vec<(PathBuf, usize)>,
}

/// One hierarchy's walk, serving every rule set asked of it.
#[derive(Debug)]
struct Walk {
    /// The directory walked (the first request's root); `Found::rel` is relative to it.
    root: PathBuf,
    /// The root with symlinks resolved, so two names of one hierarchy share a walk.
    key: PathBuf,
    /// At most [`MAX_RULES`] rule sets; bit `i` of a mask stands for `rules[i]`.
    rules: Vec<Rules>,
    found: Vec<Found>,
    /// Per rule set, as in [`Scan::dropped_dirs`].
    dropped: Vec<u64>,
}

/// A container directory and which rule sets saw it (a bit mask over [`Walk::rules`]).
#[derive(Debug)]
struct Found {
    rel: PathBuf,
    inode: u64,
    container_id: String,
    pod_uid: String,
    seen_by: u64,
}

/// Distinct rule sets one walk serves (bits of a mask); more are not walked.
const MAX_RULES: usize = 64;

impl Inventory {
    /// Walks every hierarchy in `requests` once, for all the rule sets asked of it.
    pub fn walk(requests: &[Request]) -> Self {
        let mut inv = Inventory::default();
        for r in requests {
            let key = std::fs::canonicalize(&r.root).unwrap_or_else(|_| r.root.clone());
            let w = match inv.walks.iter().position(|w| w.key == key) {
                Some(w) => w,
                None => {
                    inv.walks.push(Walk {
                        root: r.root.clone(),
                        key,
                        rules: Vec::new(),
                        found: Vec::new(),
                        dropped: Vec::new(),
                    });
                    inv.walks.len() - 1
                }
            };
            let walk = &mut inv.walks[w];
            if !walk.rules.contains(&r.rules) && walk.rules.len() < MAX_RULES {
                walk.rules.push(r.rules);
            }
            if !inv.roots.iter().any(|(root, _)| *root == r.root) {
                inv.roots.push((r.root.clone(), w));
            }
        }
        for w in &mut inv.walks {
            (w.found, w.dropped) = walk(&w.root, &w.rules);
        }
        inv
    }

    /// What `rules` saw below `root`, directories named under `root`; `None` if that was
    /// not requested.
    pub fn scan(&self, root: &Path, rules: Rules) -> Option<Scan> {
        let &(_, w) = self.roots.iter().find(|(r, _)| r == root)?;
        let walk = &self.walks[w];
        let bit = 1u64 << walk.rules.iter().position(|r| *r == rules)?;
        Some(Scan {
            containers: walk
                .found
                .iter()
                .filter(|f| f.seen_by & bit != 0)
                .map(|f| ContainerCgroup {
                    dir: root.join(&f.rel),
                    inode: f.inode,
                    container_id: f.container_id.clone(),
                    pod_uid: f.pod_uid.clone(),
                })
                .collect(),
            dropped_dirs: walk.dropped[bit.trailing_zeros() as usize],
        })
    }

    /// How many hierarchies were walked.
    pub fn walks(&self) -> usize {
        self.walks.len()
    }
}

/// The rule sets of `rules` (a mask) for which `keep` holds.
fn select(rules: &[Rules], mask: u64, keep: impl Fn(&Rules) -> bool) -> u64 {
    rules
        .iter()
        .enumerate()
        .filter(|&(i, r)| mask & (1 << i) != 0 && keep(r))
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// Walks `root` breadth first for every rule set in `rules` at once. Each queued directory
/// carries the mask of rule sets that look at its contents; a rule set that reaches its
/// `max_dirs` stops looking, and the walk ends when none looks any more.
fn walk(root: &Path, rules: &[Rules]) -> (Vec<Found>, Vec<u64>) {
    let mut found = Vec::new();
    let mut looked = vec![0usize; rules.len()];
    let mut dropped = vec![0u64; rules.len()];
    let mut open = select(rules, u64::MAX, |_| true);
    let mut queue = VecDeque::from([(
        root.to_path_buf(),
        0usize,
        select(rules, open, |r| r.max_depth > 0),
    )]);
    while let Some((dir, depth, reads)) = queue.pop_front() {
        if reads & open == 0 {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            // file_type does not follow symlinks: a link is never walked.
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let mut sees = reads & open;
            for (i, r) in rules.iter().enumerate() {
                if sees & (1 << i) == 0 {
                    continue;
                }
                looked[i] += 1;
                if looked[i] > r.max_dirs {
                    open &= !(1 << i);
                    sees &= !(1 << i);
                    let queued = queue.iter().filter(|q| q.2 & (1 << i) != 0).count();
                    dropped[i] = 1 + queued as u64;
                }
            }
            if open == 0 {
                return (found, dropped);
            }
            if sees == 0 {
                continue;
            }
            let path = e.path();
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let info = super::cgroup::of_dir(rel);
            let container = info.container_id.is_some();
            if let Some(id) = info.container_id {
                if let Ok(meta) = e.metadata() {
                    found.push(Found {
                        rel: rel.to_path_buf(),
                        inode: meta.ino(),
                        container_id: id,
                        pod_uid: info.pod_uid.unwrap_or_default(),
                        seen_by: sees,
                    });
                }
            }
            let next = select(rules, sees, |r| {
                depth + 1 < r.max_depth && (r.descend || !container)
            });
            if next != 0 {
                queue.push_back((path, depth + 1, next));
            }
        }
    }
    (found, dropped)
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

    /// A walk of `root` for `rules` alone.
    fn scan(root: &Path, rules: Rules) -> Scan {
        let inv = Inventory::walk(&[Request {
            root: root.to_path_buf(),
            rules,
        }]);
        inv.scan(root, rules).expect("requested")
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
        let s = scan(root.path(), COUNTERS);
        assert_eq!(s.dropped_dirs, 0);
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
        let l = crate::workload::labels::container_labels(&c.container_id, None, None);
        assert_eq!(l[3], ("container_id", id.to_owned()));
        assert_eq!(l[0], ("namespace", String::new()));
    }

    const OUTER: &str = "0000000000000000000000000000000000000000000000000000000000000001";
    const INNER: &str = "0000000000000000000000000000000000000000000000000000000000000002";
    const DEEP: &str = "0000000000000000000000000000000000000000000000000000000000000003";

    /// A host running kind (a container holding a pod's container), a container with a
    /// sub-cgroup, and a container 10 directories deep.
    fn nested_tree(root: &Path) {
        let kind = format!(
            "system.slice/docker-{OUTER}.scope/kubelet.slice/kubelet-kubepods.slice/cri-containerd-{INNER}.scope"
        );
        std::fs::create_dir_all(root.join(kind).join("sub")).expect("mkdir");
        let deep = format!("{}docker-{DEEP}.scope", "d/".repeat(9));
        std::fs::create_dir_all(root.join(deep)).expect("mkdir");
    }

    fn ids(s: &Scan) -> Vec<&str> {
        s.containers
            .iter()
            .map(|c| c.container_id.as_str())
            .collect()
    }

    #[test]
    fn each_rule_set_keeps_its_depth_and_descent() {
        let root = tempfile::tempdir().expect("tempdir");
        nested_tree(root.path());
        // The counters stop at a container and at depth 8.
        assert_eq!(ids(&scan(root.path(), COUNTERS)), [OUTER]);
        // The USE readings walk on: the kind node's sub-cgroups (same id, deeper: the
        // reader keeps the first, shallowest), the nested container and its sub-cgroup, and
        // the deep container.
        assert_eq!(
            ids(&scan(root.path(), RESOURCES)),
            [OUTER, OUTER, OUTER, INNER, INNER, DEEP]
        );
    }

    #[test]
    fn one_walk_serves_every_rule_set_as_if_walked_alone() {
        let root = tempfile::tempdir().expect("tempdir");
        nested_tree(root.path());
        std::fs::create_dir_all(root.path().join("a/b/c/e/f")).expect("mkdir");
        let small = Rules {
            max_depth: 8,
            max_dirs: 3,
            descend: false,
        };
        let all = [RESOURCES, COUNTERS, small];
        let requests: Vec<Request> = all
            .iter()
            .map(|&rules| Request {
                root: root.path().to_path_buf(),
                rules,
            })
            .collect();
        let inv = Inventory::walk(&requests);
        assert_eq!(inv.walks(), 1);
        for rules in all {
            assert_eq!(
                inv.scan(root.path(), rules),
                Some(scan(root.path(), rules)),
                "{rules:?}"
            );
        }
        // Three directories at depth 1 (system.slice, d, a), then the cap.
        let capped = inv.scan(root.path(), small).expect("requested");
        assert!(capped.containers.is_empty());
        assert!(capped.dropped_dirs > 0);
        assert_eq!(inv.scan(Path::new("/elsewhere"), COUNTERS), None);
    }

    #[test]
    fn two_names_of_one_hierarchy_are_walked_once() {
        let root = tempfile::tempdir().expect("tempdir");
        nested_tree(root.path());
        let link = root.path().join("link");
        std::os::unix::fs::symlink(root.path().join("system.slice"), &link).expect("symlink");
        let inv = Inventory::walk(&[
            Request {
                root: root.path().join("system.slice"),
                rules: COUNTERS,
            },
            Request {
                root: link.clone(),
                rules: COUNTERS,
            },
        ]);
        assert_eq!(inv.walks(), 1);
        let c = &inv.scan(&link, COUNTERS).expect("requested").containers[0];
        assert_eq!(c.dir, link.join(format!("docker-{OUTER}.scope")));
    }
}
