//! The include/exclude rules of the `filters:` section, compiled once and applied to each
//! process.
//!
//! In: the config's [`Filters`] and, per process, its name and workload [`Labels`]. Out: a
//! [`Verdict`]: profile it, drop it (and stop sampling it in BPF), or ask again once its pod
//! is known.

use crate::config::selector::{Selector, SelectorError};
use crate::config::Filters;

use crate::model::Labels;

/// The include/exclude rules, compiled once.
#[derive(Debug, Default)]
pub struct Filter {
    rules: Filters,
    include_selector: Option<Selector>,
    exclude_selector: Option<Selector>,
}

/// What the filter says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Profile it.
    Include,
    /// Drop it (and stop sampling it in BPF).
    Exclude,
    /// It is in a container whose pod is not known yet and a pod rule applies: ask again later.
    Undecided,
}

impl Filter {
    /// Compiles the `filters:` section.
    pub fn new(rules: &Filters) -> Result<Self, SelectorError> {
        let sel = |s: &str| -> Result<Option<Selector>, SelectorError> {
            if s.trim().is_empty() {
                Ok(None)
            } else {
                Selector::parse(s).map(Some)
            }
        };
        Ok(Self {
            include_selector: sel(&rules.include_pod_selector)?,
            exclude_selector: sel(&rules.exclude_pod_selector)?,
            rules: rules.clone(),
        })
    }

    /// Whether any rule needs Kubernetes metadata.
    fn needs_pods(&self) -> bool {
        let r = &self.rules;
        !(r.include_namespaces.is_empty()
            && r.exclude_namespaces.is_empty()
            && r.include_containers.is_empty()
            && r.exclude_containers.is_empty()
            && self.include_selector.is_none()
            && self.exclude_selector.is_none())
    }

    /// Whether nothing is filtered at all.
    pub fn is_empty(&self) -> bool {
        !self.needs_pods()
            && self.rules.include_processes.is_empty()
            && self.rules.exclude_processes.is_empty()
    }

    /// Judges a process by its name and workload labels.
    pub fn verdict(&self, process: &str, labels: &Labels) -> Verdict {
        let r = &self.rules;
        let listed = |list: &[String], v: &str| list.iter().any(|x| x == v);
        if listed(&r.exclude_processes, process) {
            return Verdict::Exclude;
        }
        if !r.include_processes.is_empty() && !listed(&r.include_processes, process) {
            return Verdict::Exclude;
        }
        self.workload_verdict(labels)
    }

    /// Judges a workload by its labels alone (the namespace, container and pod rules): what
    /// holds for every process of a container, so an `Exclude` here may deny its whole
    /// cgroup. Process name rules are left to [`Filter::verdict`].
    pub fn workload_verdict(&self, labels: &Labels) -> Verdict {
        let r = &self.rules;
        let listed = |list: &[String], v: &str| list.iter().any(|x| x == v);
        if !self.needs_pods() {
            return Verdict::Include;
        }
        let in_pod = !labels.pod.is_empty();
        if !in_pod && !labels.container_id.is_empty() {
            // A container whose pod we have not seen (yet): pod rules cannot be judged.
            return Verdict::Undecided;
        }
        if in_pod {
            if listed(&r.exclude_namespaces, &labels.namespace)
                || listed(&r.exclude_containers, &labels.container)
                || self
                    .exclude_selector
                    .as_ref()
                    .is_some_and(|s| s.matches(&labels.pod_labels))
            {
                return Verdict::Exclude;
            }
            let included = (r.include_namespaces.is_empty()
                || listed(&r.include_namespaces, &labels.namespace))
                && (r.include_containers.is_empty()
                    || listed(&r.include_containers, &labels.container))
                && self
                    .include_selector
                    .as_ref()
                    .is_none_or(|s| s.matches(&labels.pod_labels));
            return if included {
                Verdict::Include
            } else {
                Verdict::Exclude
            };
        }
        // A host process: it is in no namespace, container or pod, so any include rule on
        // those leaves it out, and no exclude rule on them can match it.
        let pod_includes = !r.include_namespaces.is_empty()
            || !r.include_containers.is_empty()
            || self.include_selector.is_some();
        if pod_includes {
            Verdict::Exclude
        } else {
            Verdict::Include
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{cg_in_pod, pod_labels};
    use super::*;

    fn filter(f: Filters) -> Filter {
        Filter::new(&f).expect("valid filters")
    }

    #[test]
    fn no_rules_include_everything() {
        let f = filter(Filters::default());
        assert!(f.is_empty());
        assert_eq!(f.verdict("bash", &Labels::default()), Verdict::Include);
        assert_eq!(
            f.verdict("x", &Labels::new(&cg_in_pod(), None)),
            Verdict::Include
        );
    }

    #[test]
    fn process_rules_need_no_metadata() {
        let f = filter(Filters {
            exclude_processes: vec!["noisy".into()],
            ..Default::default()
        });
        assert_eq!(f.verdict("noisy", &Labels::default()), Verdict::Exclude);
        assert_eq!(f.verdict("quiet", &Labels::default()), Verdict::Include);
        let f = filter(Filters {
            include_processes: vec!["only".into()],
            ..Default::default()
        });
        assert_eq!(f.verdict("other", &Labels::default()), Verdict::Exclude);
        assert_eq!(f.verdict("only", &Labels::default()), Verdict::Include);
    }

    #[test]
    fn pod_rules() {
        let f = filter(Filters {
            include_namespaces: vec!["prod".into()],
            exclude_containers: vec!["sidecar".into()],
            exclude_pod_selector: "app=debug".into(),
            ..Default::default()
        });
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "web")),
            Verdict::Include
        );
        assert_eq!(
            f.verdict("p", &pod_labels("dev", "web", "web")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "sidecar", "web")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "debug")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &Labels::new(&cg_in_pod(), None)),
            Verdict::Undecided
        );
        assert_eq!(
            f.verdict("p", &Labels::default()),
            Verdict::Exclude,
            "host process, namespace include"
        );
        let f = filter(Filters {
            exclude_namespaces: vec!["kube-system".into()],
            include_pod_selector: "app in (web)".into(),
            ..Default::default()
        });
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "web")),
            Verdict::Include
        );
        assert_eq!(
            f.verdict("p", &pod_labels("prod", "web", "api")),
            Verdict::Exclude
        );
        assert_eq!(
            f.verdict("p", &pod_labels("kube-system", "web", "web")),
            Verdict::Exclude
        );
    }

    #[test]
    fn bad_selector_is_an_error() {
        assert!(Filter::new(&Filters {
            include_pod_selector: "app in (".into(),
            ..Default::default()
        })
        .is_err());
    }
}
