//! The workload labels of a process, and of a container as the readings label it.
//!
//! In: a process's [`Cgroup`] (from `/proc/PID/cgroup`) and, when the pod watch runs, the
//! pod [`Metadata`]. Out: [`Labels`] (what samples carry, what filters judge, what the
//! accounting keys its series by) and [`container_labels`] (the `namespace`, `pod`,
//! `container`, `container_id` labels of the readings' per-container series).

use super::cgroup::Cgroup;
use super::kube::{Metadata, PodMeta};
use crate::model::Labels;

// The labels are a model type (what samples carry); what makes them from a cgroup and a
// pod is workload knowledge, so it lives here.
impl Labels {
    /// Builds the labels from a process's cgroup and, when known, its pod.
    pub fn new(cg: &Cgroup, pod: Option<&PodMeta>) -> Self {
        let info = &cg.info;
        let mut l = Labels {
            container_id: info.container_id.clone().unwrap_or_default(),
            pod_uid: info.pod_uid.clone().unwrap_or_default(),
            systemd_unit: info.systemd_unit.clone().unwrap_or_default(),
            ..Default::default()
        };
        if l.container_id.is_empty() {
            l.cgroup = info.path.clone();
        }
        if let Some(p) = pod {
            l.namespace = p.namespace.clone();
            l.pod = p.pod.clone();
            l.container = p.container.clone();
            l.service_name = p.service_name.clone();
            l.pod_labels = p.labels.clone();
            if l.pod_uid.is_empty() {
                l.pod_uid = p.pod_uid.clone();
            }
        }
        l
    }
}

/// Looks up the labels of a process at window close.
pub fn labels_for(cg: &Cgroup, metadata: Option<&Metadata>) -> Labels {
    let pod = match (&cg.info.container_id, metadata) {
        (Some(id), Some(m)) => m.by_container_id(id),
        _ => None,
    };
    Labels::new(cg, pod.as_deref())
}

/// `namespace`, `pod`, `container`, `container_id` labels of a container found by the cgroup
/// walker, the first three from the pod watch when it knows the container (empty otherwise).
///
/// With `sandbox_pod_uid` (the pod uid of the container's cgroup path), a container the watch
/// does not know is named by its pod: a pod's sandbox (pause) container is in no container
/// status. The USE readings pass it; the perf counters and run-queue latency do not, and
/// leave a sandbox's pod and namespace empty.
pub fn container_labels(
    container_id: &str,
    sandbox_pod_uid: Option<&str>,
    meta: Option<&Metadata>,
) -> Vec<(&'static str, String)> {
    let (mut ns, mut pod, mut container) = (String::new(), String::new(), String::new());
    if let Some(m) = meta {
        if let Some(p) = m.by_container_id(container_id) {
            (ns, pod, container) = (p.namespace.clone(), p.pod.clone(), p.container.clone());
        } else if let Some(p) = sandbox_pod_uid.and_then(|u| m.by_pod_uid(u).into_iter().next()) {
            (ns, pod) = (p.namespace.clone(), p.pod.clone());
        }
    }
    vec![
        ("namespace", ns),
        ("pod", pod),
        ("container", container),
        ("container_id", container_id.to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{cg_in_pod, ID};
    use super::*;
    use std::path::Path;

    #[test]
    fn cgroup_labels_without_api() {
        let l = Labels::new(&cg_in_pod(), None);
        assert_eq!(l.container_id, ID);
        assert_eq!(l.pod_uid, "1b2c3d4e-0000-1111-2222-333344445555");
        assert!(l.cgroup.is_empty(), "containers are named by id, not path");
        let keys: Vec<_> = l.sample_labels().map(|(k, _)| k).collect();
        assert_eq!(keys, ["container_id", "pod_uid"]);
        let host = Labels::new(
            &Cgroup::from_text("0::/system.slice/ssh.service\n", Path::new("/x")),
            None,
        );
        assert_eq!(host.cgroup, "/system.slice/ssh.service");
        assert_eq!(host.systemd_unit, "ssh.service");
    }

    #[test]
    fn container_labels_without_the_pod_watch() {
        let l = container_labels(ID, Some("1b2c3d4e-0000-1111-2222-333344445555"), None);
        assert_eq!(
            l,
            [
                ("namespace", String::new()),
                ("pod", String::new()),
                ("container", String::new()),
                ("container_id", ID.to_owned()),
            ]
        );
    }
}
