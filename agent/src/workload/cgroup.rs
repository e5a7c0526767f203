//! `/proc/PID/cgroup`, read and parsed in one place: which container, pod and systemd unit a
//! process belongs to, and which cgroup file counts its CPU time.
//!
//! In: a pid ([`Cgroup::read`], the one reader of the file) or the file's text. Out: a
//! [`Cgroup`]: the [`CgroupInfo`] parsed from the paths, the CPU usage file, and the v2 id
//! (filled in by the process table from what BPF reports). No cache: the process table keeps
//! the answer for the life of a process. The cgroup walker ([`super::walk`]) names the
//! directories it finds with the same parser.
//!
//! A path is read component by component, outermost first, and the innermost thing of each
//! kind wins, so nested set-ups (kind, k3d, docker-in-docker) name the inner container:
//!
//! - a pod (`kubepods-burstable-pod<uid>.slice`, `pod<uid>`) forgets any container or unit
//!   seen above it (above a pod there is only the node, which may itself be a container);
//! - a container (`cri-containerd-<id>.scope`, `crio-<id>`, `docker-<id>.scope`,
//!   `libpod-<id>.scope`, a bare id, v1 `slice:prefix:<id>`) forgets any unit above it (that
//!   is the runtime's or the host's unit, not the process's);
//! - a systemd unit (`*.service`, `*.scope` that is not a container) is kept, so a host
//!   service, a session and a service run by systemd inside a container are all named.
//!
//! Monitors are not containers: CRI-O's `crio-conmon-<id>.scope` and podman's
//! `libpod-conmon-<id>.scope` hold conmon, which the runtime runs beside the container. Their
//! CPU is attributed to the pod (if any) and to that unit, never to the container it watches,
//! so a container's profile shows only the container's own processes.
//!
//! Ids must be lowercase, as every runtime writes them: a component in uppercase hex was not
//! made by a runtime, so it is not taken as an id (nor normalized into one).

use std::path::{Path, PathBuf};

/// Most bytes read from one `/proc/PID/cgroup`: real files are well under 2 KiB, and the cap
/// bounds memory however deep a (hostile) cgroup tree is.
pub const MAX_CGROUP_FILE_BYTES: u64 = 64 * 1024;

/// The container runtime that made a container's cgroup, as far as its name tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// containerd's CRI plugin (`cri-containerd-<id>.scope`, v1 `:cri-containerd:<id>`).
    Containerd,
    /// CRI-O (`crio-<id>.scope`, `crio-<id>`).
    CriO,
    /// Docker (`docker-<id>.scope`, `/docker/<id>`).
    Docker,
    /// Podman (`libpod-<id>.scope`).
    Podman,
    /// A bare id (kubelet's cgroupfs driver, ECS, CI runners): the runtime is not in the path.
    Unknown,
}

impl Runtime {
    /// Lowercase name, as in the scheme of a pod status container id (`cri-o` for CRI-O).
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Unknown => "unknown",
        }
    }
}

/// Kubernetes quality-of-service class of a pod, from the kubepods cgroup it sits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Qos {
    /// Directly under `kubepods` (requests equal limits).
    Guaranteed,
    /// Under `kubepods/burstable` or `kubepods-burstable.slice`.
    Burstable,
    /// Under `kubepods/besteffort` or `kubepods-besteffort.slice`.
    BestEffort,
}

impl Qos {
    /// The class as Kubernetes spells it in `status.qosClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        }
    }
}

/// What `/proc/PID/cgroup` says about a process.
///
/// `runtime` is `Some` exactly when `container_id` is; `qos` only comes with `pod_uid`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupInfo {
    /// The most informative cgroup path (see [`parse_proc_cgroup`]), without a trailing
    /// ` (deleted)`; empty when the file had no valid line. Relative to the reader's cgroup
    /// namespace, so it may start with `/..` when ember runs in its own.
    pub path: String,
    /// Innermost container id: 64 lowercase hex, or `<32 hex>-<digits>` (ECS Fargate).
    pub container_id: Option<String>,
    /// Innermost pod uid, dashed (`8-4-4-4-12`); static pods have a 32-hex uid (kubelet's
    /// config hash, the mirror pod's `kubernetes.io/config.hash` annotation), kept as is.
    pub pod_uid: Option<String>,
    /// Runtime that made the container's cgroup.
    pub runtime: Option<Runtime>,
    /// QoS class of the pod, when its parent cgroup says (standard kubelet layouts do).
    pub qos: Option<Qos>,
    /// Innermost systemd unit below any container, e.g. `ssh.service`, `session-3.scope`,
    /// `crio-conmon-<id>.scope`, or `nginx.service` run by systemd inside a container.
    pub systemd_unit: Option<String>,
    /// The cgroup v2 (`0::`) path, when the file has one: the cgroup whose id
    /// `bpf_get_current_cgroup_id()` reports (just `/` on hybrid hosts, which have no v2 split).
    pub v2_path: Option<String>,
    /// Lines skipped as malformed (blank lines are ignored, not counted); a file cut at
    /// [`MAX_CGROUP_FILE_BYTES`] counts its partial last line here too.
    pub malformed_lines: usize,
}

/// Parses the text of `/proc/PID/cgroup` (v1, v2 or hybrid). Never panics.
///
/// Every line is analysed; the chosen path is the one carrying the most, compared in this
/// order: a container id, a pod, a systemd unit, not being the root `/`. Ties go to the
/// v2 line, then to v1 `cpu`, `cpuacct`, `memory`, `pids`, `name=systemd`, then to the other
/// controllers in file order. All the other fields come from the chosen path alone.
pub fn parse_proc_cgroup(text: &str) -> CgroupInfo {
    parse(text, None)
}

/// The `(controllers, path)` fields of a line with three `:`-separated fields, as the CPU
/// usage file is looked up from them (before [`parse_line`]'s checks).
type RawLine<'a> = (&'a str, &'a str);

/// [`parse_proc_cgroup`]'s one pass over the text, also collecting every line's raw fields
/// into `raw` when asked (for [`cpu_usage_file`]).
fn parse<'a>(text: &'a str, mut raw: Option<&mut Vec<RawLine<'a>>>) -> CgroupInfo {
    let mut malformed_lines = 0;
    let mut v2_path = None;
    // (score, (rank, line index), path, found): higher score wins, then lower key.
    let mut best: Option<(Score, (u8, usize), &str, Found<'_>)> = None;
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.splitn(3, ':');
        let fields = (fields.next(), fields.next(), fields.next());
        if let (Some(raw), (Some(_), Some(controllers), Some(path))) = (raw.as_deref_mut(), fields)
        {
            raw.push((controllers, path));
        }
        let Some((rank, path)) = parse_line(fields) else {
            malformed_lines += 1;
            continue;
        };
        if rank == V2_RANK && v2_path.is_none() {
            v2_path = Some(path.to_owned());
        }
        let found = analyze(path);
        let score = found.score(path);
        let key = (rank, index);
        let better = match &best {
            None => true,
            Some((s, k, _, _)) => score > *s || (score == *s && key < *k),
        };
        if better {
            best = Some((score, key, path, found));
        }
    }
    let mut info = CgroupInfo {
        v2_path,
        malformed_lines,
        ..CgroupInfo::default()
    };
    if let Some((_, _, path, found)) = best {
        info.path = path.to_owned();
        if let Some((id, runtime)) = found.container {
            info.container_id = Some(id.to_owned());
            info.runtime = Some(runtime);
        }
        if let Some((uid, qos)) = found.pod {
            info.pod_uid = Some(uid.replace('_', "-"));
            info.qos = qos;
        }
        info.systemd_unit = found.unit.map(str::to_owned);
    }
    info
}

/// What a cgroup directory's path (relative to its hierarchy's root) names, parsed as the
/// v2 line of a `/proc/PID/cgroup` would be: how the walker tells a container's directory.
pub fn of_dir(rel: &Path) -> CgroupInfo {
    parse_proc_cgroup(&format!("0::/{}\n", rel.display()))
}

/// Removes a pod status container id's runtime scheme (`containerd://`, `docker://`,
/// `cri-o://`, any `<scheme>://`), leaving the id as it appears in cgroup paths.
pub fn strip_runtime_prefix(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

/// Where a process runs, as read from `/proc/PID/cgroup` when it was first seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cgroup {
    /// Container, pod and unit parsed from the cgroup paths.
    pub info: CgroupInfo,
    /// The cgroup file that counts this process's cgroup's CPU time: v1 `cpuacct.usage`
    /// (nanoseconds) or v2 `cpu.stat` (`usage_usec`). Its directory is the process's own
    /// cgroup, which the filter watches to allow a denied container again once it is gone
    /// (a container's CPU is read by the USE readings, at the container's directory).
    pub cpu_usage_file: Option<PathBuf>,
    /// The v2 cgroup id as BPF sees it (0 when unknown); non-root ids can be filtered in BPF.
    /// The file does not say it: the process table sets it from the sample that made it
    /// read the process.
    pub v2_id: u64,
}

impl Cgroup {
    /// Reads `/proc/<pid>/cgroup`, at most [`MAX_CGROUP_FILE_BYTES`] of it, and parses it
    /// once; cgroup files are looked up under `/sys/fs/cgroup`. The one reader of the file:
    /// an error (the process is gone) is counted by the caller.
    pub fn read(pid: u32) -> std::io::Result<Self> {
        read_path(
            Path::new(&format!("/proc/{pid}/cgroup")),
            MAX_CGROUP_FILE_BYTES,
            Path::new("/sys/fs/cgroup"),
        )
    }

    /// Parses the text of a `/proc/PID/cgroup` file, resolving files under `root`.
    pub fn from_text(text: &str, root: &Path) -> Self {
        let mut raw = Vec::new();
        let info = parse(text, Some(&mut raw));
        Self {
            cpu_usage_file: cpu_usage_file(&raw, root, &info.path),
            info,
            v2_id: 0,
        }
    }
}

fn read_path(path: &Path, cap: u64, root: &Path) -> std::io::Result<Cgroup> {
    // One byte over the cap tells a file cut at the cap from one that just fits.
    let text = crate::os::procfs::read_capped(path, cap + 1)?;
    let truncated = text.len() as u64 > cap;
    let whole = if truncated {
        // Keep whole lines only: a path cut short would name an ancestor cgroup.
        let cut = &text.as_bytes()[..cap as usize];
        &text[..cut.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)]
    } else {
        &text
    };
    let mut cg = Cgroup::from_text(whole, root);
    cg.info.malformed_lines += usize::from(truncated);
    Ok(cg)
}

/// The file counting the CPU time of a process's own cgroup: v1 `cpuacct.usage` or v2
/// `cpu.stat`. Only a cgroup below the root counts (the root's file is the whole host's), and
/// the one at the path that names the container (`chosen`) is preferred; between v1 and v2,
/// cpuacct wins, since hybrid hosts account CPU in v1 and leave v2's `usage_usec` at 0.
fn cpu_usage_file(lines: &[RawLine<'_>], root: &Path, chosen: &str) -> Option<PathBuf> {
    let mut best: Option<(u8, PathBuf)> = None;
    for &(controllers, path) in lines {
        let path = path.trim_end_matches(" (deleted)");
        let rel = path.trim_start_matches('/');
        if rel.is_empty() || rel.split('/').any(|c| c == "..") {
            continue;
        }
        let candidates: Vec<PathBuf> = if controllers.split(',').any(|c| c == "cpuacct") {
            [controllers, "cpuacct", "cpu,cpuacct"]
                .iter()
                .map(|m| root.join(m).join(rel).join("cpuacct.usage"))
                .collect()
        } else if controllers.is_empty() {
            [root.to_path_buf(), root.join("unified")]
                .iter()
                .filter(|base| base.join("cgroup.controllers").exists())
                .map(|base| base.join(rel).join("cpu.stat"))
                .collect()
        } else {
            continue;
        };
        let score = 2 * u8::from(path == chosen) + u8::from(!controllers.is_empty());
        if let Some(file) = candidates.into_iter().find(|f| f.exists()) {
            if best.as_ref().is_none_or(|(s, _)| score > *s) {
                best = Some((score, file));
            }
        }
    }
    best.map(|(_, f)| f)
}

/// Rank of the v2 line: it wins ties, since it is the hierarchy BPF's cgroup id refers to.
const V2_RANK: u8 = 0;

/// Checks the fields of `N:controllers:/path` and gives (rank, path); `None` if malformed.
fn parse_line<'a>(
    (hierarchy, controllers, path): (Option<&str>, Option<&str>, Option<&'a str>),
) -> Option<(u8, &'a str)> {
    let hierarchy: u32 = hierarchy?.parse().ok()?;
    let controllers = controllers?;
    let path = path?;
    if !path.starts_with('/') {
        return None;
    }
    // A process whose cgroup was removed (a zombie) shows the old path with this suffix.
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let rank = if hierarchy == 0 && controllers.is_empty() {
        V2_RANK
    } else {
        controllers
            .split(',')
            .map(controller_rank)
            .min()
            .unwrap_or(6)
    };
    Some((rank, path))
}

/// v1 controllers whose hierarchy every runtime and kubelet populate, best first.
fn controller_rank(controller: &str) -> u8 {
    match controller {
        "cpu" => 1,
        "cpuacct" => 2,
        "memory" => 3,
        "pids" => 4,
        "name=systemd" => 5,
        _ => 6,
    }
}

/// (has container, has pod, has unit, not root), compared lexicographically.
type Score = (bool, bool, bool, bool);

/// What one path names, borrowed from it.
#[derive(Default)]
struct Found<'a> {
    container: Option<(&'a str, Runtime)>,
    /// Uid as in the path (maybe with underscores), QoS if the layout says.
    pod: Option<(&'a str, Option<Qos>)>,
    unit: Option<&'a str>,
}

impl Found<'_> {
    fn score(&self, path: &str) -> Score {
        (
            self.container.is_some(),
            self.pod.is_some(),
            self.unit.is_some(),
            path != "/",
        )
    }
}

/// Walks a path outermost first; see the module docs for what forgets what.
fn analyze(path: &str) -> Found<'_> {
    let mut found = Found::default();
    let mut parent = "";
    for comp in path.split('/') {
        if comp.is_empty() || comp == "." || comp == ".." {
            continue;
        }
        if let Some((slice, rest)) = comp.split_once(':') {
            // cgroup v1 with the systemd driver: `<pod slice>:<runtime prefix>:<id>`.
            if let Some(pod) = pod_component(slice, parent) {
                found = Found {
                    pod: Some(pod),
                    ..Found::default()
                };
            }
            if let Some((prefix, id)) = rest.split_once(':') {
                if is_container_id(id) {
                    let runtime = prefixed_runtime(prefix).unwrap_or(Runtime::Unknown);
                    found.container = Some((id, runtime));
                    found.unit = None;
                }
            }
        } else if let Some(pod) = pod_component(comp, parent) {
            found = Found {
                pod: Some(pod),
                ..Found::default()
            };
        } else if let Some(container) = container_component(comp, parent) {
            found.container = Some(container);
            found.unit = None;
        } else if comp.ends_with(".service") || comp.ends_with(".scope") {
            found.unit = Some(comp);
        }
        parent = comp;
    }
    found
}

/// Runtime of a v1 systemd-style prefix (`cri-containerd`, `crio`, `docker`, `libpod`).
fn prefixed_runtime(prefix: &str) -> Option<Runtime> {
    match prefix {
        "cri-containerd" => Some(Runtime::Containerd),
        "crio" => Some(Runtime::CriO),
        "docker" => Some(Runtime::Docker),
        "libpod" => Some(Runtime::Podman),
        _ => None,
    }
}

/// `cri-containerd-<id>.scope`, `crio-<id>[.scope]`, `docker-<id>.scope`, `libpod-<id>.scope`
/// or a bare `<id>` (Docker's under a `docker` parent). `crio-conmon-<id>` is no match.
fn container_component<'a>(comp: &'a str, parent: &str) -> Option<(&'a str, Runtime)> {
    let name = comp.strip_suffix(".scope").unwrap_or(comp);
    if is_container_id(name) {
        let runtime = if parent == "docker" {
            Runtime::Docker
        } else {
            Runtime::Unknown
        };
        return Some((name, runtime));
    }
    const PREFIXES: [(&str, Runtime); 4] = [
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
        ("docker-", Runtime::Docker),
        ("libpod-", Runtime::Podman),
    ];
    PREFIXES.iter().find_map(|&(prefix, runtime)| {
        let id = name.strip_prefix(prefix).filter(|id| is_container_id(id))?;
        Some((id, runtime))
    })
}

/// `kubepods[-<qos>]-pod<uid>.slice` (systemd driver, maybe `kubelet-` prefixed as in kind)
/// or `pod<uid>` (cgroupfs driver, QoS from the parent directory).
fn pod_component<'a>(comp: &'a str, parent: &str) -> Option<(&'a str, Option<Qos>)> {
    if let Some(slice) = comp.strip_suffix(".slice") {
        let (head, uid) = slice.rsplit_once("-pod")?;
        if !head.contains("kubepods") || !is_pod_uid(uid) {
            return None;
        }
        let qos = if head.ends_with("-burstable") {
            Some(Qos::Burstable)
        } else if head.ends_with("-besteffort") {
            Some(Qos::BestEffort)
        } else if head.ends_with("kubepods") {
            Some(Qos::Guaranteed)
        } else {
            None
        };
        return Some((uid, qos));
    }
    let uid = comp.strip_prefix("pod").filter(|uid| is_pod_uid(uid))?;
    let qos = match parent {
        "burstable" => Some(Qos::Burstable),
        "besteffort" => Some(Qos::BestEffort),
        "kubepods" => Some(Qos::Guaranteed),
        _ => None,
    };
    Some((uid, qos))
}

fn is_lower_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// 64 lowercase hex, or `<32 lowercase hex>-<1 to 20 digits>` (ECS Fargate's form).
fn is_container_id(s: &str) -> bool {
    if s.len() == 64 {
        return is_lower_hex(s);
    }
    match s.split_once('-') {
        Some((hex, n)) => {
            hex.len() == 32
                && is_lower_hex(hex)
                && (1..=20).contains(&n.len())
                && n.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// `8-4-4-4-12` lowercase hex with `-` or `_` separators, or 32 hex (a static pod).
fn is_pod_uid(s: &str) -> bool {
    if s.len() == 32 {
        return is_lower_hex(s);
    }
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-' || b == b'_',
            _ => matches!(b, b'0'..=b'9' | b'a'..=b'f'),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb";
    const OUTER: &str = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d";
    const UID: &str = "07218590-4cca-4889-bf59-21e5edf551ce";
    const UID_: &str = "07218590_4cca_4889_bf59_21e5edf551ce";

    /// The usual v1 controller set of a hybrid/v1 host, every line at `path`, `name=systemd`
    /// at `systemd_path` and an empty v2 root (as on hybrid hosts) when `hybrid`.
    fn v1(path: &str, systemd_path: &str, hybrid: bool) -> String {
        let mut s = format!(
            "12:rdma:/\n11:perf_event:{path}\n10:cpuset:{path}\n9:hugetlb:{path}\n\
8:net_cls,net_prio:{path}\n7:memory:{path}\n6:devices:{path}\n5:freezer:{path}\n\
4:blkio:{path}\n3:pids:{path}\n2:cpu,cpuacct:{path}\n1:name=systemd:{systemd_path}\n"
        );
        if hybrid {
            s.push_str("0::/\n");
        }
        s
    }

    fn v2(path: &str) -> String {
        format!("0::{path}\n")
    }

    /// Expected info for a path with nothing in it; struct update fills in the rest.
    fn plain(path: &str, v2_path: Option<&str>) -> CgroupInfo {
        CgroupInfo {
            path: path.to_owned(),
            v2_path: v2_path.map(str::to_owned),
            ..CgroupInfo::default()
        }
    }

    fn container(path: &str, id: &str, runtime: Runtime, v2_path: Option<&str>) -> CgroupInfo {
        CgroupInfo {
            container_id: Some(id.to_owned()),
            runtime: Some(runtime),
            ..plain(path, v2_path)
        }
    }

    fn pod(path: &str, id: &str, runtime: Runtime, qos: Qos, v2_path: Option<&str>) -> CgroupInfo {
        CgroupInfo {
            pod_uid: Some(UID.to_owned()),
            qos: Some(qos),
            ..container(path, id, runtime, v2_path)
        }
    }

    #[test]
    fn systemd_driver_containerd_burstable_v2() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::Containerd, Qos::Burstable, Some(&p))
        );
    }

    #[test]
    fn systemd_driver_guaranteed_and_besteffort() {
        let p = format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::Containerd, Qos::Guaranteed, Some(&p))
        );
        let p = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::Containerd, Qos::BestEffort, Some(&p))
        );
    }

    #[test]
    fn cgroupfs_driver_v1_many_controllers() {
        let p = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(
            parse_proc_cgroup(&v1(&p, &p, false)),
            pod(&p, ID, Runtime::Unknown, Qos::BestEffort, None)
        );
    }

    #[test]
    fn cgroupfs_driver_guaranteed_and_burstable_v2() {
        let p = format!("/kubepods/pod{UID}/{ID}");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::Unknown, Qos::Guaranteed, Some(&p))
        );
        let p = format!("/kubepods/burstable/pod{UID}/{ID}");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::Unknown, Qos::Burstable, Some(&p))
        );
    }

    #[test]
    fn crio_systemd_and_cgroupfs() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::CriO, Qos::Burstable, Some(&p))
        );
        let p = format!("/kubepods/burstable/pod{UID}/crio-{ID}");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::CriO, Qos::Burstable, Some(&p))
        );
    }

    #[test]
    fn crio_conmon_is_the_pod_not_the_container() {
        let unit = format!("crio-conmon-{ID}.scope");
        let p = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/{unit}"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            CgroupInfo {
                pod_uid: Some(UID.to_owned()),
                qos: Some(Qos::BestEffort),
                systemd_unit: Some(unit),
                ..plain(&p, Some(&p))
            }
        );
    }

    #[test]
    fn docker_systemd_scope_v2() {
        let p = format!("/system.slice/docker-{ID}.scope");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            container(&p, ID, Runtime::Docker, Some(&p))
        );
    }

    #[test]
    fn docker_cgroupfs_v1_hybrid() {
        let p = format!("/docker/{ID}");
        assert_eq!(
            parse_proc_cgroup(&v1(&p, &p, true)),
            container(&p, ID, Runtime::Docker, Some("/"))
        );
    }

    #[test]
    fn v1_systemd_style_cri_containerd_hybrid() {
        let p = format!(
            "/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{ID}"
        );
        assert_eq!(
            parse_proc_cgroup(&v1(&p, &p, true)),
            pod(&p, ID, Runtime::Containerd, Qos::Burstable, Some("/"))
        );
    }

    #[test]
    fn podman_rootless_and_its_conmon() {
        let p = format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            container(&p, ID, Runtime::Podman, Some(&p))
        );
        let unit = format!("libpod-conmon-{ID}.scope");
        let p = format!("/machine.slice/{unit}");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            CgroupInfo {
                systemd_unit: Some(unit),
                ..plain(&p, Some(&p))
            }
        );
    }

    #[test]
    fn kind_nested_v2_inner_container_wins() {
        let p = format!(
            "/system.slice/docker-{OUTER}.scope/kubelet.slice/kubelet-kubepods.slice/\
kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::Containerd, Qos::BestEffort, Some(&p))
        );
    }

    #[test]
    fn k3d_nested_v1_cgroupfs_inner_container_wins() {
        let p = format!("/docker/{OUTER}/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(
            parse_proc_cgroup(&v1(&p, &p, false)),
            pod(&p, ID, Runtime::Unknown, Qos::BestEffort, None)
        );
        // kind's own node processes: the node container and the unit inside it.
        let p = format!("/docker/{OUTER}/system.slice/containerd.service");
        assert_eq!(
            parse_proc_cgroup(&v1(&p, &p, false)),
            CgroupInfo {
                systemd_unit: Some("containerd.service".to_owned()),
                ..container(&p, OUTER, Runtime::Docker, None)
            }
        );
    }

    #[test]
    fn pod_level_cgroup_under_node_container_forgets_the_node() {
        // A pod cgroup inside a kind node: the node's id is not the pod's container.
        let p = format!("/docker/{OUTER}/kubepods/burstable/pod{UID}");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            CgroupInfo {
                pod_uid: Some(UID.to_owned()),
                qos: Some(Qos::Burstable),
                ..plain(&p, Some(&p))
            }
        );
    }

    #[test]
    fn ecs_fargate_short_id() {
        let id = "9dd4e461268c8034f5c8564e155c67a6-3798514387";
        let p = format!("/ecs/9dd4e461268c8034f5c8564e155c67a6/{id}");
        assert_eq!(
            parse_proc_cgroup(&v1(&p, &p, false)),
            container(&p, id, Runtime::Unknown, None)
        );
    }

    #[test]
    fn systemd_inside_container_sub_cgroups() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope/init"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            pod(&p, ID, Runtime::Containerd, Qos::Burstable, Some(&p))
        );
        let p = format!("/system.slice/docker-{ID}.scope/system.slice/nginx.service");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            CgroupInfo {
                systemd_unit: Some("nginx.service".to_owned()),
                ..container(&p, ID, Runtime::Docker, Some(&p))
            }
        );
    }

    #[test]
    fn host_service_hybrid_picks_name_systemd() {
        let text = v1("/", "/system.slice/ssh.service", true);
        assert_eq!(
            parse_proc_cgroup(&text),
            CgroupInfo {
                systemd_unit: Some("ssh.service".to_owned()),
                ..plain("/system.slice/ssh.service", Some("/"))
            }
        );
    }

    #[test]
    fn host_service_and_user_session_v2() {
        assert_eq!(
            parse_proc_cgroup("0::/system.slice/containerd.service\n"),
            CgroupInfo {
                systemd_unit: Some("containerd.service".to_owned()),
                ..plain(
                    "/system.slice/containerd.service",
                    Some("/system.slice/containerd.service")
                )
            }
        );
        let p = "/user.slice/user-1000.slice/session-3.scope";
        assert_eq!(
            parse_proc_cgroup(&v2(p)),
            CgroupInfo {
                systemd_unit: Some("session-3.scope".to_owned()),
                ..plain(p, Some(p))
            }
        );
    }

    #[test]
    fn root_and_empty() {
        assert_eq!(parse_proc_cgroup("0::/\n"), plain("/", Some("/")));
        assert_eq!(
            parse_proc_cgroup(&v1("/", "/", true)),
            plain("/", Some("/"))
        );
        assert_eq!(parse_proc_cgroup(""), CgroupInfo::default());
        assert_eq!(parse_proc_cgroup("\n\n"), CgroupInfo::default());
    }

    #[test]
    fn hybrid_this_machine_shape() {
        // This build machine: only memory is placed, under a 32-hex name that is no
        // container id (ids are 64 hex or 32 hex-digits).
        let p = "/process_api/af0f96f4b1566daeacafd9bf3e9b42c3";
        let text = format!(
            "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n4:memory:{p}\n\
3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n"
        );
        assert_eq!(parse_proc_cgroup(&text), plain(p, Some("/")));
    }

    #[test]
    fn hybrid_prefers_v1_path_with_id_over_empty_v2() {
        let p = format!("/kubepods/besteffort/pod{UID}/{ID}");
        let text = format!("4:memory:{p}\n3:cpu,cpuacct:{p}\n1:name=systemd:/\n0::/\n");
        assert_eq!(
            parse_proc_cgroup(&text),
            pod(&p, ID, Runtime::Unknown, Qos::BestEffort, Some("/"))
        );
    }

    #[test]
    fn v2_wins_ties_and_ids_beat_units() {
        // Both hierarchies carry an id; v2's (here a different id) is chosen.
        let v1p = format!("/docker/{OUTER}");
        let v2p = format!("/system.slice/docker-{ID}.scope");
        let text = format!("2:cpu,cpuacct:{v1p}\n1:name=systemd:{v1p}\n0::{v2p}\n");
        assert_eq!(
            parse_proc_cgroup(&text),
            container(&v2p, ID, Runtime::Docker, Some(&v2p))
        );
        // Only the controller without priority has the id: still better than a unit.
        let text = format!("3:cpuset:{v1p}\n1:name=systemd:/system.slice/x.service\n0::/\n");
        assert_eq!(
            parse_proc_cgroup(&text),
            container(&v1p, OUTER, Runtime::Docker, Some("/"))
        );
    }

    #[test]
    fn static_pod_uid_kept_as_is() {
        let uid = "9dd4e461268c8034f5c8564e155c67a6";
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            CgroupInfo {
                pod_uid: Some(uid.to_owned()),
                ..pod(&p, ID, Runtime::Containerd, Qos::Burstable, Some(&p))
            }
        );
    }

    #[test]
    fn deleted_cgroup_and_foreign_cgroup_namespace() {
        // A zombie whose container cgroup is gone, seen from ember's own cgroup namespace.
        let p = format!(
            "/../../kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(
            parse_proc_cgroup(&format!("0::{p} (deleted)\n")),
            pod(&p, ID, Runtime::Containerd, Qos::Burstable, Some(&p))
        );
    }

    #[test]
    fn malformed_lines_are_skipped_and_counted() {
        let p = format!("/system.slice/docker-{ID}.scope");
        let text = format!(
            "garbage\n\nx:cpu:/a\n3:memory\n2:cpu:relative/path\n-1:pids:/b\n\
1:name=systemd:{p}\n0::/\n\u{0}\u{1}:::\n"
        );
        assert_eq!(
            parse_proc_cgroup(&text),
            CgroupInfo {
                malformed_lines: 6,
                ..container(&p, ID, Runtime::Docker, Some("/"))
            }
        );
    }

    #[test]
    fn very_long_lines() {
        // A deep tree above the container: still found, and linear to scan.
        let deep = "/a.slice".repeat(5000);
        let p = format!("{deep}/docker-{ID}.scope");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            container(&p, ID, Runtime::Docker, Some(&p))
        );
        // A huge id-like component is no id.
        let p = format!("/docker/{}", "a".repeat(100_000));
        assert_eq!(parse_proc_cgroup(&v2(&p)), plain(&p, Some(&p)));
        // Long garbage without a colon is one malformed line.
        let text = format!("{}\n0::/\n", "9".repeat(100_000));
        assert_eq!(
            parse_proc_cgroup(&text),
            CgroupInfo {
                malformed_lines: 1,
                ..plain("/", Some("/"))
            }
        );
    }

    #[test]
    fn uppercase_hex_is_not_an_id() {
        let upper = ID.to_ascii_uppercase();
        let p = format!("/system.slice/docker-{upper}.scope");
        assert_eq!(
            parse_proc_cgroup(&v2(&p)),
            CgroupInfo {
                systemd_unit: Some(format!("docker-{upper}.scope")),
                ..plain(&p, Some(&p))
            }
        );
        let p = format!(
            "/kubepods/besteffort/pod{}/{upper}",
            UID.to_ascii_uppercase()
        );
        assert_eq!(parse_proc_cgroup(&v2(&p)), plain(&p, Some(&p)));
    }

    #[test]
    fn near_misses_are_not_ids() {
        let not_hex = format!("{}g", &ID[..63]);
        for name in [
            &ID[..63],                              // too short
            &not_hex,                               // not hex
            "ca978112ca1bbdcafac231b39a23dc4d-",    // no digits
            "ca978112ca1bbdcafac231b39a23dc4d-12a", // not digits
            "ca978112ca1bbdcafac231b39a23dc4-1",    // 31 hex
        ] {
            assert!(!is_container_id(name), "{name}");
        }
        assert!(container_component(&format!("containerd-{ID}.scope"), "").is_none());
        assert!(pod_component(&format!("machine-pod{UID_}.slice"), "").is_none());
    }

    #[test]
    fn strips_runtime_schemes() {
        assert_eq!(strip_runtime_prefix(&format!("containerd://{ID}")), ID);
        assert_eq!(strip_runtime_prefix(&format!("docker://{ID}")), ID);
        assert_eq!(strip_runtime_prefix(&format!("cri-o://{ID}")), ID);
        assert_eq!(strip_runtime_prefix(ID), ID);
        assert_eq!(strip_runtime_prefix(""), "");
    }

    #[test]
    fn names() {
        assert_eq!(Runtime::CriO.as_str(), "cri-o");
        assert_eq!(Runtime::Containerd.as_str(), "containerd");
        assert_eq!(Qos::BestEffort.as_str(), "BestEffort");
    }

    #[test]
    fn reads_own_cgroup() {
        let info = Cgroup::read(std::process::id())
            .expect("own /proc/PID/cgroup")
            .info;
        assert_eq!(info.malformed_lines, 0);
        assert!(info.path.starts_with('/'), "{info:?}");
        assert!(Cgroup::read(0).is_err());
    }

    #[test]
    fn read_cap_drops_the_cut_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cgroup");
        let p = format!("/system.slice/docker-{ID}.scope");
        let text = format!("0::/\n1:name=systemd:{p}\n");
        std::fs::write(&file, &text).expect("write");
        let root = Path::new("/nonexistent");
        // Cut inside the id: the partial line must not yield a truncated path.
        let info = read_path(&file, 40, root).expect("read").info;
        assert_eq!(
            info,
            CgroupInfo {
                malformed_lines: 1,
                ..plain("/", Some("/"))
            }
        );
        let info = read_path(&file, text.len() as u64, root)
            .expect("read")
            .info;
        assert_eq!(info, container(&p, ID, Runtime::Docker, Some("/")));
    }

    /// The usage file `text` names when the container's path is `chosen`.
    fn usage(text: &str, root: &Path, chosen: &str) -> Option<PathBuf> {
        let mut raw = Vec::new();
        parse(text, Some(&mut raw));
        cpu_usage_file(&raw, root, chosen)
    }

    #[test]
    fn usage_files_v1_and_v2() {
        let root = tempfile::tempdir().expect("tempdir");
        let v1 = root.path().join("cpuacct/kubepods/pod1/abc");
        std::fs::create_dir_all(&v1).expect("mkdir");
        std::fs::write(v1.join("cpuacct.usage"), "2500000000\n").expect("write");
        let unified = root.path().join("unified");
        std::fs::create_dir_all(unified.join("a.slice")).expect("mkdir");
        std::fs::write(unified.join("cgroup.controllers"), "").expect("write");
        std::fs::write(
            unified.join("a.slice/cpu.stat"),
            "usage_usec 1500000\nuser_usec 1\n",
        )
        .expect("write");

        std::fs::write(root.path().join("cpuacct/cpuacct.usage"), "9\n").expect("write");
        let text = "2:cpuacct:/kubepods/pod1/abc\n0::/\n";
        let f = usage(text, root.path(), "/kubepods/pod1/abc");
        assert_eq!(f, Some(v1.join("cpuacct.usage")));
        // The root's cpuacct.usage is the whole host's: never a container's.
        let f = usage("2:cpuacct:/\n0::/a.slice\n", root.path(), "/a.slice");
        assert_eq!(f, Some(unified.join("a.slice/cpu.stat")));
        assert_eq!(usage("2:cpuacct:/\n0::/\n", root.path(), "/"), None);
        assert_eq!(usage("2:cpuacct:/../../etc\n", root.path(), ""), None);
        // Read through the one reader, the file is found from the same parse.
        let cg = Cgroup::from_text(text, root.path());
        assert_eq!(cg.info.path, "/kubepods/pod1/abc");
        assert_eq!(cg.cpu_usage_file, Some(v1.join("cpuacct.usage")));
    }
}
