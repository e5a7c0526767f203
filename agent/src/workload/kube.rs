//! Kubernetes metadata: which pod, container and workload a container id belongs to.
//!
//! [`start`] spawns one task that watches the pods of this node only
//! (`fieldSelector=spec.nodeName=<node>`, so the cost does not grow with the cluster) into a
//! reflector store, and keeps an index from container id and pod uid to [`PodMeta`].
//! [`Metadata`] is the cheap, shareable read side. Profiling never waits for the API: until
//! the first list arrives, and whenever the API is unreachable, lookups just return nothing.
//!
//! Memory is bounded by what the node runs: the store holds this node's pods (running ones are
//! capped by the kubelet's `maxPods`; finished ones until Kubernetes deletes them), each trimmed
//! to the few fields used here before it is stored, plus one small [`PodMeta`] per container.
//!
//! Freshness ([`Status`]): the watcher is rebuilt, with a fresh list, after every error. kube's
//! watcher would otherwise resume a broken watch silently, and on a quiet node nothing would
//! ever show that it had recovered. So the status is exact: [`Status::Synced`] from a completed
//! list until the next error, [`Status::Stale`] from that error until the next completed list
//! (lookups keep answering from the last list meanwhile). Retries use kube's default watcher
//! backoff (0.8 s doubling to 30 s, with jitter), which starts over only after 120 s without
//! an error, so a watch that fails right after each list does not relist every second.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::kube::config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use ::kube::runtime::reflector::{self, Store};
use ::kube::runtime::watcher::{self, DefaultBackoff, Event};
use ::kube::runtime::WatchStreamExt;
use ::kube::{Api, Client, Config};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tracing::{debug, info, warn};

use crate::config::{self, NODE_NAME_ENV};

/// Pod annotation naming the service, read first.
pub const SERVICE_NAME_ANNOTATION: &str = "ember.io/service-name";
/// Pyroscope's (and Grafana Alloy's) pod annotation naming the service, read second.
pub const PYROSCOPE_SERVICE_NAME_ANNOTATION: &str = "pyroscope.io/service_name";
/// Annotations of a static pod's mirror pod holding the kubelet's config hash, which is the uid
/// the kubelet uses in the static pod's cgroup (not the mirror pod's uid).
const CONFIG_HASH_ANNOTATIONS: [&str; 2] =
    ["kubernetes.io/config.mirror", "kubernetes.io/config.hash"];
/// Label the Deployment controller puts on a ReplicaSet's pods, equal to its name suffix.
const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// Longest wait between retries: a cap on kube's default backoff (30 s, plus jitter).
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// One container of one pod on this node, as samples get labelled with it.
///
/// Shared as `Arc<PodMeta>`: every lookup of the same container returns the same allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid, as in its cgroup path (for a static pod's mirror, the mirror's uid).
    pub pod_uid: String,
    /// The container's name; empty for the entry of a pod that reports no container yet.
    pub container: String,
    /// The container id without its runtime scheme (as in cgroup paths); empty while the
    /// container has not started.
    pub container_id: String,
    /// The node the pod runs on.
    pub node: String,
    /// Kind of the workload owning the pod: the controller owner reference's kind, with a
    /// ReplicaSet resolved to its `Deployment` when the pod's `pod-template-hash` label is its
    /// name suffix, and a Job to its `CronJob` when its name ends in a plausible schedule time
    /// (a heuristic). `None` for a bare pod; set exactly when `owner_name` is.
    pub owner_kind: Option<String>,
    /// Name of that workload.
    pub owner_name: Option<String>,
    /// `<namespace>/<name>`: the name from the annotation `ember.io/service-name`, else
    /// `pyroscope.io/service_name`, else the owner's name (the pod's for a bare pod). The
    /// namespace is always the prefix (an annotation that starts with it is not prefixed
    /// twice): who can annotate pods of one namespace cannot write into the service of
    /// another.
    pub service_name: String,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
}

/// State of the pod watch, as [`Metadata::status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Kubernetes metadata is off (by configuration, or no node name is known): lookups are
    /// always empty.
    Disabled,
    /// No list of this node's pods has completed yet (no config, API unreachable, not allowed,
    /// or simply still starting): lookups are empty; retrying in the background.
    Connecting,
    /// The pods were listed and the watch has had no error since.
    Synced,
    /// The watch failed at `since` and no list has completed since: lookups answer from the
    /// last list, which may miss pods started since.
    Stale {
        /// When the first error after the last completed list happened.
        since: SystemTime,
    },
}

/// Errors of the pod watch. None is fatal: each is logged and retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The explicitly configured kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The configured file.
        path: PathBuf,
        /// Why it failed.
        source: KubeconfigError,
    },
    /// Neither the in-cluster service account nor a default kubeconfig is usable.
    #[error("no Kubernetes config: not in a pod ({in_cluster}), and no kubeconfig ({kubeconfig})")]
    NoConfig {
        /// Why the in-cluster config failed.
        in_cluster: InClusterError,
        /// Why `KUBECONFIG` / `~/.kube/config` failed.
        kubeconfig: KubeconfigError,
    },
    /// The client could not be built from the config (TLS, auth, proxy settings).
    #[error("kubernetes client: {0}")]
    Client(#[from] ::kube::Error),
    /// Listing or watching pods failed (unreachable, forbidden, expired resource version …).
    #[error("pod watch: {0}")]
    Watch(#[from] watcher::Error),
    /// The watch stream ended, which kube's watcher never does on its own.
    #[error("pod watch ended")]
    WatchEnded,
}

/// Read side of the pod metadata: cheap to clone, `Send + Sync`, never blocks on the API.
///
/// The watch task stops once every clone has been dropped.
#[derive(Debug, Clone)]
pub struct Metadata {
    shared: Arc<Shared>,
}

impl Metadata {
    /// Metadata that is off for good: every lookup is empty, status [`Status::Disabled`].
    pub fn disabled() -> Self {
        Self::with_status(String::new(), Status::Disabled)
    }

    fn with_status(node: String, status: Status) -> Self {
        Self {
            shared: Arc::new(Shared {
                node,
                index: RwLock::new(Index::default()),
                state: Mutex::new(State {
                    status,
                    failure_logged: false,
                }),
            }),
        }
    }

    /// Metadata that knows exactly `pods`, for other modules' tests; calling it again on a
    /// clone replaces them (a pod's labels changed).
    #[cfg(test)]
    pub(crate) fn set_test_pods(&self, pods: Vec<Pod>) {
        let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
        *self.shared.write() = Index::from_pods(&pods, SystemTime::now());
    }

    /// Metadata with `pods`, listed (status synced), for other modules' tests.
    #[cfg(test)]
    pub(crate) fn with_test_pods(pods: Vec<Pod>) -> Self {
        let m = Self::with_status("node-1".into(), Status::Synced);
        m.set_test_pods(pods);
        m
    }

    /// The container with this id (64 hex as in cgroup paths, or a pod status id with its
    /// `containerd://`, `docker://`, `cri-o://` scheme), from regular, init or ephemeral
    /// container statuses.
    pub fn by_container_id(&self, id: &str) -> Option<Arc<PodMeta>> {
        let id = crate::workload::cgroup::strip_runtime_prefix(id);
        self.shared.read().containers.get(id).cloned()
    }

    /// Every container of the pod with this uid (or, for a static pod, the kubelet's config
    /// hash that its cgroup carries); one entry with an empty `container` if it reports none
    /// yet; empty if the pod is unknown. All entries share the pod's fields.
    pub fn by_pod_uid(&self, uid: &str) -> Vec<Arc<PodMeta>> {
        let index = self.shared.read();
        let uid = index.aliases.get(uid).map_or(uid, String::as_str);
        index.pods.get(uid).cloned().unwrap_or_default()
    }

    /// Number of pods known.
    pub fn pods(&self) -> usize {
        self.shared.read().pods.len()
    }

    /// Whether the metadata is current: [`Status::Synced`].
    pub fn fresh(&self) -> bool {
        self.status() == Status::Synced
    }

    /// The state of the pod watch.
    pub fn status(&self) -> Status {
        self.shared.lock().status
    }

    /// The node whose pods are watched (empty when disabled).
    pub fn node(&self) -> &str {
        &self.shared.node
    }
}

/// Starts watching this node's pods on the current Tokio runtime and returns at once.
///
/// `node` is this node's name (resolved once, see [`crate::config::NodeName`]); without one (or
/// when `cfg.enabled` is off) the result is [`Metadata::disabled`], since a watch of every pod in
/// the cluster is unbounded. The API config is `cfg.kubeconfig` if given, else the in-cluster
/// service account when running in a pod, else `KUBECONFIG` / `~/.kube/config`. Failures to
/// build it or to reach the API are retried in the background with backoff; one line is logged
/// per state change, not per retry.
pub async fn start(cfg: &config::Kubernetes, node: &str) -> Metadata {
    if !cfg.enabled {
        return Metadata::disabled();
    }
    if node.is_empty() {
        warn!(
            "kubernetes metadata disabled: no node name (set {NODE_NAME_ENV} from the downward \
             API fieldRef spec.nodeName, or the node name in the config)"
        );
        return Metadata::disabled();
    }
    let node = node.to_owned();
    let kubeconfig = (!cfg.kubeconfig.as_os_str().is_empty()).then(|| cfg.kubeconfig.clone());
    install_crypto_provider();
    if kubeconfig.is_some() || kubernetes_configured() {
        info!("kubernetes metadata: watching the pods of node {node}");
    } else {
        debug!("kubernetes metadata: no cluster config; trying in the background for {node}");
    }
    let metadata = Metadata::with_status(node.clone(), Status::Connecting);
    let weak = Arc::downgrade(&metadata.shared);
    tokio::spawn(Task::new(weak, node, kubeconfig).run());
    metadata
}

/// rustls picks a crypto provider by itself only while exactly one is compiled in; installing
/// ring (the one ember builds, as it needs no C toolchain) keeps TLS working if another
/// dependency ever enables aws-lc-rs. An error just means some provider is already installed.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The watch task's state, kept across watcher rebuilds.
struct Task {
    shared: Weak<Shared>,
    node: String,
    kubeconfig: Option<PathBuf>,
    store: Store<Pod>,
    writer: reflector::store::Writer<Pod>,
    backoff: DefaultBackoff,
}

impl Task {
    fn new(shared: Weak<Shared>, node: String, kubeconfig: Option<PathBuf>) -> Self {
        let (store, writer) = reflector::store();
        Self {
            shared,
            node,
            kubeconfig,
            store,
            writer,
            backoff: DefaultBackoff::default(),
        }
    }

    /// One watcher at a time, rebuilt (config, client and list) after each error, until
    /// every [`Metadata`] is gone.
    async fn run(mut self) {
        while let Err(err) = self.watch().await {
            let Some(live) = self.shared.upgrade() else {
                return;
            };
            live.failed(&err);
            // Not holding the Arc while asleep, so dropping the last Metadata ends the task.
            drop(live);
            let delay = self.backoff.next().unwrap_or(MAX_RETRY_DELAY);
            tokio::time::sleep(delay.min(MAX_RETRY_DELAY)).await;
        }
    }

    /// Runs one watcher until its first error; `Ok` once every [`Metadata`] is gone.
    async fn watch(&mut self) -> Result<(), Error> {
        let client = connect(self.kubeconfig.as_deref()).await?;
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let mut events = pin!(watcher::watcher(Api::<Pod>::all(client), config).modify(trim));
        while let Some(event) = events.next().await {
            let event = event?;
            let Some(live) = self.shared.upgrade() else {
                return Ok(());
            };
            // The store first: a completed list is read back from it.
            self.writer.apply_watcher_event(&event);
            live.apply(&event, &self.store);
        }
        Err(Error::WatchEnded)
    }
}

/// A client from the explicit kubeconfig, else in-cluster, else the default kubeconfig.
async fn connect(kubeconfig: Option<&Path>) -> Result<Client, Error> {
    let options = KubeConfigOptions::default();
    let config = match kubeconfig {
        Some(path) => {
            let wrap = |source| Error::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(wrap)?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(wrap)?
        }
        None => match Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => Config::from_kubeconfig(&options)
                .await
                .map_err(|kubeconfig| Error::NoConfig {
                    in_cluster,
                    kubeconfig,
                })?,
        },
    };
    Ok(Client::try_from(config)?)
}

/// What the watch task and every [`Metadata`] share.
#[derive(Debug)]
struct Shared {
    node: String,
    index: RwLock<Index>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    status: Status,
    /// Whether the current failure streak has been logged (one line per state change).
    failure_logged: bool,
}

impl Shared {
    // A panic while holding a lock leaves whole maps behind, so poisoning is ignored.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one watcher event, already applied to `store`, to the index.
    fn apply(&self, event: &Event<Pod>, store: &Store<Pod>) {
        match event {
            Event::Apply(pod) => self.write().insert(pod, SystemTime::now()),
            Event::Delete(pod) => {
                if let Some(uid) = &pod.metadata.uid {
                    self.write().remove(uid);
                }
            }
            // A relist is buffered by the store and swapped in whole at `InitDone`, so lookups
            // keep answering from the previous list meanwhile.
            Event::Init | Event::InitApply(_) => {}
            Event::InitDone => {
                let index = Index::from_pods(&store.state(), SystemTime::now());
                let pods = index.pods.len();
                *self.write() = index;
                let mut state = self.lock();
                if state.status != Status::Synced {
                    info!(
                        "kubernetes metadata synced: {pods} pods on node {}",
                        self.node
                    );
                }
                state.status = Status::Synced;
                state.failure_logged = false;
            }
        }
    }

    /// Records a failed attempt; logs only the first of a streak.
    fn failed(&self, err: &Error) {
        let mut state = self.lock();
        match state.status {
            Status::Synced => {
                state.status = Status::Stale {
                    since: SystemTime::now(),
                };
                let err = causes(err);
                warn!("kubernetes metadata stale, serving the last pod list while retrying: {err}");
                state.failure_logged = true;
            }
            // Outside a cluster, with no Kubernetes config anywhere, nothing was asked for:
            // host mode is the expected outcome, not a fault worth a line on every `record`.
            Status::Connecting
                if !state.failure_logged
                    && matches!(err, Error::NoConfig { .. })
                    && !kubernetes_configured() =>
            {
                debug!(
                    "kubernetes metadata: not in a cluster, host mode: {}",
                    causes(err)
                );
                state.failure_logged = true;
            }
            Status::Connecting if !state.failure_logged => {
                let err = causes(err);
                warn!(
                    "kubernetes metadata unavailable, retrying in the background (samples keep \
                     container ids and cgroup paths meanwhile): {err}"
                );
                state.failure_logged = true;
            }
            Status::Connecting | Status::Stale { .. } | Status::Disabled => {
                debug!("kubernetes metadata: {}", causes(err));
            }
        }
    }
}

/// Whether any Kubernetes config exists besides `kubernetes.kubeconfig` (which is unset
/// whenever [`Error::NoConfig`] is raised): a pod's service account environment, `KUBECONFIG`, or
/// `~/.kube/config` (an empty variable counts as unset). If one does and still fails, that is
/// worth a warning.
fn kubernetes_configured() -> bool {
    let set = |name| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let home_config =
        std::env::var_os("HOME").is_some_and(|home| Path::new(&home).join(".kube/config").exists());
    set("KUBERNETES_SERVICE_HOST") || set("KUBECONFIG") || home_config
}

/// An error and its causes on one line: kube's messages stop at "client error (Connect)",
/// and the reason (connection refused, certificate, DNS) is further down the chain.
fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Many errors repeat their source's text in their own.
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Lookup tables derived from the store.
#[derive(Debug, Default)]
struct Index {
    /// By pod uid: one entry per container (or one for the pod while it reports none).
    pods: HashMap<String, Vec<Arc<PodMeta>>>,
    /// By container id without its scheme.
    containers: HashMap<String, Arc<PodMeta>>,
    /// Static pods' config hash (their cgroup's uid) → their mirror pod's uid.
    aliases: HashMap<String, String>,
}

impl Index {
    fn from_pods(pods: &[Arc<Pod>], now: SystemTime) -> Self {
        let mut index = Self::default();
        for pod in pods {
            index.insert(pod, now);
        }
        index
    }

    /// Adds or replaces a pod (by uid; a pod without one is ignored).
    fn insert(&mut self, pod: &Pod, now: SystemTime) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        self.remove(uid);
        let metas = pod_metas(pod, uid, now);
        for meta in &metas {
            if !meta.container_id.is_empty() {
                self.containers
                    .insert(meta.container_id.clone(), Arc::clone(meta));
            }
        }
        if let Some(hash) = config_hash(pod) {
            self.aliases.insert(hash.to_owned(), uid.to_owned());
        }
        self.pods.insert(uid.to_owned(), metas);
    }

    fn remove(&mut self, uid: &str) {
        let Some(metas) = self.pods.remove(uid) else {
            return;
        };
        for meta in metas {
            // Only if still this pod's: an id is never reused, but be sure.
            if self
                .containers
                .get(&meta.container_id)
                .is_some_and(|m| m.pod_uid == uid)
            {
                self.containers.remove(&meta.container_id);
            }
        }
        // Static pods are few, so a scan is fine.
        self.aliases.retain(|_, mirror| mirror != uid);
    }
}

/// The kubelet config hash a mirror pod carries, if it is one.
fn config_hash(pod: &Pod) -> Option<&str> {
    let annotations = pod.metadata.annotations.as_ref()?;
    CONFIG_HASH_ANNOTATIONS
        .iter()
        .find_map(|key| annotations.get(*key))
        .map(String::as_str)
        .filter(|hash| !hash.is_empty())
}

/// One [`PodMeta`] per container in the pod's status (regular, init, ephemeral), or one with
/// no container while there is none.
fn pod_metas(pod: &Pod, uid: &str, now: SystemTime) -> Vec<Arc<PodMeta>> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let (owner_kind, owner_name) = owner(pod, now).unzip();
    let base = PodMeta {
        service_name: service_name(pod, &namespace, owner_name.as_deref().unwrap_or(&name)),
        namespace,
        pod: name,
        pod_uid: uid.to_owned(),
        container: String::new(),
        container_id: String::new(),
        node: pod
            .spec
            .as_ref()
            .and_then(|spec| spec.node_name.clone())
            .unwrap_or_default(),
        owner_kind,
        owner_name,
        labels: meta.labels.clone().unwrap_or_default(),
    };
    let statuses: Vec<&ContainerStatus> = pod
        .status
        .iter()
        .flat_map(|status| {
            [
                &status.container_statuses,
                &status.init_container_statuses,
                &status.ephemeral_container_statuses,
            ]
        })
        .flatten()
        .flatten()
        .collect();
    if statuses.is_empty() {
        return vec![Arc::new(base)];
    }
    statuses
        .into_iter()
        .map(|status| {
            Arc::new(PodMeta {
                container: status.name.clone(),
                container_id: status
                    .container_id
                    .as_deref()
                    .map(crate::workload::cgroup::strip_runtime_prefix)
                    .unwrap_or_default()
                    .to_owned(),
                ..base.clone()
            })
        })
        .collect()
}

/// The workload owning a pod, as (kind, name), from its controller owner reference alone
/// (no API calls, so no RBAC beyond pods):
///
/// - a ReplicaSet named `<deployment>-<hash>` whose pod has the label `pod-template-hash=<hash>`
///   is the Deployment's (the Deployment controller names and labels exactly so);
/// - a Job named `<cronjob>-<n>`, where `n` read as minutes (CronJob controller v2) or as
///   seconds (v1) since the epoch is a time from 2015 to a day from `now`, is the CronJob's.
///   A heuristic: Job pods carry no CronJob label, and reading the Job would need RBAC and a
///   request per Job; a manual Job named like that is taken for a CronJob's.
///
/// Anything else is itself (StatefulSet, DaemonSet, a ReplicaSet without the hash …).
fn owner(pod: &Pod, now: SystemTime) -> Option<(String, String)> {
    let controller = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))?;
    let name = controller.name.as_str();
    let resolved = match controller.kind.as_str() {
        "ReplicaSet" => pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(POD_TEMPLATE_HASH_LABEL))
            .filter(|hash| !hash.is_empty())
            .and_then(|hash| name.strip_suffix(hash.as_str())?.strip_suffix('-'))
            .filter(|base| !base.is_empty())
            .map(|base| ("Deployment", base)),
        "Job" => cronjob_of(name, now).map(|base| ("CronJob", base)),
        _ => None,
    };
    let (kind, name) = resolved.unwrap_or((controller.kind.as_str(), name));
    Some((kind.to_owned(), name.to_owned()))
}

/// The CronJob a Job name points to; see [`owner`].
fn cronjob_of(job: &str, now: SystemTime) -> Option<&str> {
    // 2015-01-01T00:00:00Z, before CronJobs (ScheduledJobs) existed.
    const EARLIEST: u64 = 1_420_070_400;
    let (base, suffix) = job.rsplit_once('-')?;
    if base.is_empty() || suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = suffix.parse().ok()?;
    let latest = now.duration_since(UNIX_EPOCH).ok()?.as_secs() + 86_400;
    let plausible = |secs: u64| (EARLIEST..=latest).contains(&secs);
    (plausible(n) || n.checked_mul(60).is_some_and(plausible)).then_some(base)
}

/// Longest service name taken from a pod annotation, in bytes. Annotations may hold 256 KiB
/// and the name becomes a series label in Prometheus and Pyroscope.
pub const MAX_SERVICE_NAME: usize = 128;

/// The service name of a pod; see [`PodMeta::service_name`]. Blank annotations are ignored;
/// an annotation's control characters become `_` and it is cut to [`MAX_SERVICE_NAME`] bytes.
fn service_name(pod: &Pod, namespace: &str, workload: &str) -> String {
    let annotations = pod.metadata.annotations.as_ref();
    let name = [SERVICE_NAME_ANNOTATION, PYROSCOPE_SERVICE_NAME_ANNOTATION]
        .iter()
        .find_map(|key| {
            annotations?
                .get(*key)
                .map(|value| value.trim())
                .filter(|value| !value.is_empty())
        })
        .map_or_else(|| workload.to_owned(), label_safe);
    // The namespace is the scope: `team-a` annotating `team-b/checkout` gets
    // `team-a/team-b/checkout`, never team-b's series.
    let own = name
        .strip_prefix(namespace)
        .and_then(|rest| rest.strip_prefix('/'))
        .filter(|rest| !rest.is_empty());
    match own {
        Some(_) => name,
        None => format!("{namespace}/{name}"),
    }
}

/// `value` with control characters replaced by `_`, cut to [`MAX_SERVICE_NAME`] bytes on a
/// character boundary.
fn label_safe(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_SERVICE_NAME));
    for c in value.chars() {
        let c = if c.is_control() { '_' } else { c };
        if out.len() + c.len_utf8() > MAX_SERVICE_NAME {
            break;
        }
        out.push(c);
    }
    out
}

/// Drops everything from a pod that [`PodMeta`] does not use, before the store keeps it:
/// managed fields (often half an object), spec (all but the node name), status (all but the
/// phase and the three container status lists, each cut to name and id), annotations (all but
/// the service-name and static-pod ones) and non-controller owner references.
fn trim(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    let annotations = meta.annotations.map(|mut annotations| {
        annotations.retain(|key, _| {
            key == SERVICE_NAME_ANNOTATION
                || key == PYROSCOPE_SERVICE_NAME_ANNOTATION
                || CONFIG_HASH_ANNOTATIONS.contains(&key.as_str())
        });
        annotations
    });
    let owner_references = meta.owner_references.map(|refs| {
        refs.into_iter()
            .filter(|r| r.controller == Some(true))
            .map(|r| OwnerReference {
                api_version: r.api_version,
                kind: r.kind,
                name: r.name,
                uid: r.uid,
                controller: r.controller,
                block_owner_deletion: None,
            })
            .collect()
    });
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        // The watcher resumes from the versions of the events it sees, so keep it intact.
        resource_version: meta.resource_version,
        labels: meta.labels,
        annotations,
        owner_references,
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        ..PodSpec::default()
    });
    let statuses = |list: Option<Vec<ContainerStatus>>| {
        list.map(|list| {
            list.into_iter()
                .map(|status| ContainerStatus {
                    name: status.name,
                    container_id: status.container_id,
                    ..ContainerStatus::default()
                })
                .collect()
        })
    };
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        container_statuses: statuses(status.container_statuses),
        init_container_statuses: statuses(status.init_container_statuses),
        ephemeral_container_statuses: statuses(status.ephemeral_container_statuses),
        ..PodStatus::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::serde_json::{self, json, Value};
    use std::time::Instant;

    const ID1: &str = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb";
    const ID2: &str = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d";
    const ID3: &str = "2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6";
    const UID: &str = "07218590-4cca-4889-bf59-21e5edf551ce";
    /// 2026-11-22T03:15:00Z.
    const NOW_SECS: u64 = 1_795_324_500;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).expect("pod json")
    }

    /// A pod as the API returns it, with the noise trimming must drop.
    fn full_pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-7d9f8b6c5d-x2x9q",
                "generateName": "web-7d9f8b6c5d-",
                "namespace": "shop",
                "uid": UID,
                "resourceVersion": "4242",
                "creationTimestamp": "2026-11-22T03:00:00Z",
                "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5d"},
                "annotations": {
                    "pyroscope.io/service_name": "shop-web",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"huge\": true}",
                    "prometheus.io/scrape": "true"
                },
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8b6c5d",
                     "uid": "11111111-2222-3333-4444-555555555555", "controller": true,
                     "blockOwnerDeletion": true},
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-a-controller",
                     "uid": "66666666-2222-3333-4444-555555555555"}
                ],
                "finalizers": ["example.com/keep"],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                   "apiVersion": "v1", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {}}}]
            },
            "spec": {
                "nodeName": "node-a",
                "serviceAccountName": "web",
                "containers": [{"name": "app", "image": "shop/web:1.2",
                                "env": [{"name": "A", "value": "b"}]}],
                "initContainers": [{"name": "migrate", "image": "shop/migrate:1"}]
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{
                    "name": "app", "containerID": format!("containerd://{ID1}"),
                    "image": "shop/web:1.2", "imageID": "sha256:abc", "ready": true,
                    "restartCount": 2, "state": {"running": {"startedAt": "2026-11-22T03:00:05Z"}}
                }],
                "initContainerStatuses": [{
                    "name": "migrate", "containerID": format!("cri-o://{ID2}"),
                    "image": "shop/migrate:1", "imageID": "sha256:def", "ready": false,
                    "restartCount": 0
                }],
                "ephemeralContainerStatuses": [{
                    "name": "debugger", "containerID": format!("docker://{ID3}"),
                    "image": "busybox", "imageID": "sha256:123", "ready": false,
                    "restartCount": 0
                }]
            }
        })
    }

    /// A minimal pod owned by `owner` (kind, name), with labels and annotations.
    fn owned_pod(owner: Option<(&str, &str)>, labels: Value, annotations: Value) -> Pod {
        let refs: Vec<Value> = owner
            .into_iter()
            .map(|(kind, name)| {
                json!({"apiVersion": "apps/v1", "kind": kind, "name": name,
                       "uid": "11111111-2222-3333-4444-555555555555", "controller": true})
            })
            .collect();
        pod(json!({
            "metadata": {"name": "p-0", "namespace": "ns", "uid": UID, "labels": labels,
                         "annotations": annotations, "ownerReferences": refs},
            "spec": {"nodeName": "node-a", "containers": []}
        }))
    }

    fn owner_of(owner: Option<(&str, &str)>, labels: Value) -> Option<(String, String)> {
        super::owner(&owned_pod(owner, labels, json!({})), now())
    }

    fn pair(kind: &str, name: &str) -> Option<(String, String)> {
        Some((kind.to_owned(), name.to_owned()))
    }

    fn synced(pods: &[Pod]) -> Metadata {
        let md = Metadata::with_status("node-a".to_owned(), Status::Connecting);
        let (store, mut writer) = reflector::store::<Pod>();
        let mut events = vec![Event::Init];
        events.extend(pods.iter().cloned().map(Event::InitApply));
        events.push(Event::InitDone);
        for event in events {
            let event = event.modify(trim);
            writer.apply_watcher_event(&event);
            md.shared.apply(&event, &store);
        }
        md
    }

    #[test]
    fn container_ids_from_all_three_status_lists() {
        let md = synced(&[pod(full_pod())]);
        assert_eq!(md.status(), Status::Synced);
        assert!(md.fresh());
        for (id, container) in [(ID1, "app"), (ID2, "migrate"), (ID3, "debugger")] {
            let meta = md.by_container_id(id).expect(container);
            assert_eq!(meta.container, container);
            assert_eq!(meta.container_id, id);
            assert_eq!(meta.pod, "web-7d9f8b6c5d-x2x9q");
            assert_eq!(meta.namespace, "shop");
            assert_eq!(meta.pod_uid, UID);
            assert_eq!(meta.node, "node-a");
            assert_eq!(meta.owner_kind.as_deref(), Some("Deployment"));
            assert_eq!(meta.owner_name.as_deref(), Some("web"));
            assert_eq!(meta.service_name, "shop/shop-web");
            assert_eq!(meta.labels.get("app").map(String::as_str), Some("web"));
        }
        // Ids with their scheme are accepted too; unknown ids are not found.
        let scheme = md.by_container_id(&format!("containerd://{ID1}"));
        assert_eq!(scheme.map(|m| m.container.clone()).as_deref(), Some("app"));
        assert!(md.by_container_id(&ID1[..63]).is_none());
        assert!(md.by_container_id("").is_none());
        let all = md.by_pod_uid(UID);
        assert_eq!(all.len(), 3);
        // One allocation per container, shared by both lookups.
        assert!(all
            .iter()
            .any(|m| Arc::ptr_eq(m, &md.by_container_id(ID1).expect("app"))));
        assert!(md.by_pod_uid("nope").is_empty());
        assert_eq!(md.pods(), 1);
    }

    #[test]
    fn pod_without_container_statuses_is_known_by_uid() {
        let md = synced(&[owned_pod(None, json!({}), json!({}))]);
        let metas = md.by_pod_uid(UID);
        assert_eq!(metas.len(), 1);
        assert_eq!(metas[0].container, "");
        assert_eq!(metas[0].container_id, "");
        assert_eq!(metas[0].service_name, "ns/p-0");
        assert!(md.by_container_id("").is_none());
    }

    #[test]
    fn watch_events_update_delete_and_go_stale() {
        let md = synced(&[pod(full_pod())]);
        let (store, mut writer) = reflector::store::<Pod>();
        let mut send = |event: Event<Pod>| {
            let event = event.modify(trim);
            writer.apply_watcher_event(&event);
            md.shared.apply(&event, &store)
        };
        // The app container restarts with a new id: the old id goes, the new one comes.
        let mut restarted = full_pod();
        restarted["status"]["containerStatuses"][0]["containerID"] =
            json!(format!("containerd://{}", "a".repeat(64)));
        send(Event::Apply(pod(restarted)));
        assert!(md.by_container_id(ID1).is_none());
        assert_eq!(
            md.by_container_id(&"a".repeat(64))
                .map(|m| m.container.clone()),
            Some("app".to_owned())
        );
        assert!(md.by_container_id(ID2).is_some());

        // An error keeps answering from the last list, and says since when.
        let before = SystemTime::now();
        md.shared.failed(&Error::WatchEnded);
        let Status::Stale { since } = md.status() else {
            panic!("not stale: {:?}", md.status());
        };
        assert!(since >= before);
        assert!(!md.fresh());
        assert!(md.by_container_id(ID2).is_some());
        // More failures keep the first time.
        md.shared.failed(&Error::WatchEnded);
        assert_eq!(md.status(), Status::Stale { since });

        // A relist swaps in whole at InitDone: the pod is gone, another came.
        let other_uid = "99999999-4cca-4889-bf59-21e5edf551ce";
        let other_id = "b".repeat(64);
        let mut other = full_pod();
        other["metadata"]["uid"] = json!(other_uid);
        other["status"]["containerStatuses"][0]["containerID"] = json!(other_id);
        other["status"]["initContainerStatuses"] = json!([]);
        other["status"]["ephemeralContainerStatuses"] = json!([]);
        send(Event::Init);
        send(Event::InitApply(pod(other)));
        assert!(md.by_container_id(ID2).is_some());
        assert!(md.by_container_id(&other_id).is_none());
        send(Event::InitDone);
        assert_eq!(md.status(), Status::Synced);
        assert!(md.by_container_id(ID2).is_none());
        assert_eq!(md.by_pod_uid(UID), []);
        assert_eq!(
            md.by_container_id(&other_id)
                .map(|m| m.pod_uid.clone())
                .as_deref(),
            Some(other_uid)
        );
        assert_eq!(md.pods(), 1);

        // Apply then Delete.
        send(Event::Apply(pod(full_pod())));
        assert_eq!(md.by_pod_uid(UID).len(), 3);
        send(Event::Delete(pod(full_pod())));
        assert!(md.by_pod_uid(UID).is_empty());
        assert!(md.by_container_id(ID1).is_none());
    }

    #[test]
    fn static_pod_found_by_config_hash() {
        let hash = "9dd4e461268c8034f5c8564e155c67a6";
        let mut value = full_pod();
        value["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": hash});
        value["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a",
                    "uid": "11111111-2222-3333-4444-555555555555", "controller": true}]);
        let md = synced(&[pod(value)]);
        assert_eq!(md.by_pod_uid(hash).len(), 3);
        assert_eq!(md.by_pod_uid(UID).len(), 3);
        let meta = md.by_container_id(ID1).expect("app");
        assert_eq!(meta.owner_kind.as_deref(), Some("Node"));
        assert_eq!(meta.service_name, "shop/node-a");
    }

    #[test]
    fn owners() {
        let hash = json!({"pod-template-hash": "7d9f8b6c5d"});
        assert_eq!(
            owner_of(Some(("ReplicaSet", "web-7d9f8b6c5d")), hash.clone()),
            pair("Deployment", "web")
        );
        // Dashes in the Deployment name are kept.
        assert_eq!(
            owner_of(Some(("ReplicaSet", "my-web-app-7d9f8b6c5d")), hash.clone()),
            pair("Deployment", "my-web-app")
        );
        // No label, a different hash, or a name that is just the hash: stays a ReplicaSet.
        assert_eq!(
            owner_of(Some(("ReplicaSet", "web-7d9f8b6c5d")), json!({})),
            pair("ReplicaSet", "web-7d9f8b6c5d")
        );
        assert_eq!(
            owner_of(
                Some(("ReplicaSet", "web-7d9f8b6c5d")),
                json!({"pod-template-hash": "5d"})
            ),
            pair("ReplicaSet", "web-7d9f8b6c5d")
        );
        assert_eq!(
            owner_of(
                Some(("ReplicaSet", "-7d9f8b6c5d")),
                json!({"pod-template-hash": "7d9f8b6c5d"})
            ),
            pair("ReplicaSet", "-7d9f8b6c5d")
        );
        assert_eq!(
            owner_of(Some(("StatefulSet", "db")), json!({})),
            pair("StatefulSet", "db")
        );
        assert_eq!(
            owner_of(Some(("DaemonSet", "ember")), hash),
            pair("DaemonSet", "ember")
        );
        assert_eq!(owner_of(None, json!({})), None);
        // A non-controller reference is no owner.
        let mut bare = owned_pod(Some(("ReplicaSet", "x")), json!({}), json!({}));
        if let Some(refs) = bare.metadata.owner_references.as_mut() {
            refs[0].controller = Some(false);
        }
        assert_eq!(super::owner(&bare, now()), None);
    }

    #[test]
    fn cronjob_jobs() {
        // CronJob controller v2 names Jobs by scheduled minute, v1 by second.
        let minutes = NOW_SECS / 60 - 5;
        let job = format!("backup-nightly-{minutes}");
        assert_eq!(
            owner_of(Some(("Job", &job)), json!({})),
            pair("CronJob", "backup-nightly")
        );
        let job = format!("report-{}", NOW_SECS - 3600);
        assert_eq!(
            owner_of(Some(("Job", &job)), json!({})),
            pair("CronJob", "report")
        );
        // Not times: small numbers, dates, the far future, no digits.
        for job in [
            "migrate-2",
            "import-20261122",
            "x-99999999999",
            "batch-abc",
            "-29588741",
        ] {
            assert_eq!(owner_of(Some(("Job", job)), json!({})), pair("Job", job));
        }
    }

    #[test]
    fn service_name_precedence() {
        let deploy = Some(("ReplicaSet", "web-7d9f8b6c5d"));
        let labels = json!({"pod-template-hash": "7d9f8b6c5d"});
        let service = |annotations: Value| {
            let pod = owned_pod(deploy, labels.clone(), annotations);
            pod_metas(&pod, UID, now())[0].service_name.clone()
        };
        assert_eq!(
            service(json!({"ember.io/service-name": "a", "pyroscope.io/service_name": "b"})),
            "ns/a"
        );
        assert_eq!(service(json!({"pyroscope.io/service_name": "b"})), "ns/b");
        assert_eq!(
            service(json!({"ember.io/service-name": " ", "pyroscope.io/service_name": "b"})),
            "ns/b"
        );
        assert_eq!(service(json!({"other": "c"})), "ns/web");
        // Issue 58: scoped by the pod's namespace; another namespace's name stays under
        // this one; this namespace's own prefix is not doubled.
        assert_eq!(
            service(json!({"ember.io/service-name": "other/checkout"})),
            "ns/other/checkout"
        );
        assert_eq!(
            service(json!({"ember.io/service-name": "ns/checkout"})),
            "ns/checkout"
        );
        assert_eq!(service(json!({"ember.io/service-name": "ns/"})), "ns/ns/");
        assert_eq!(
            service(json!({"ember.io/service-name": "nsx/a"})),
            "ns/nsx/a"
        );
        // A 200 KiB annotation, with a newline, becomes a short, one-line label value.
        let long = format!("svc\n{}", "é".repeat(100_000));
        let name = service(json!({ "ember.io/service-name": long }));
        let name = name.strip_prefix("ns/").unwrap_or_default();
        assert!(name.len() <= MAX_SERVICE_NAME && name.len() > MAX_SERVICE_NAME - 2);
        assert!(name.starts_with("svc_é"), "{name}");
        let bare = owned_pod(None, json!({}), json!({}));
        assert_eq!(pod_metas(&bare, UID, now())[0].service_name, "ns/p-0");
    }

    #[test]
    fn trimming_keeps_what_is_needed() {
        let full = pod(full_pod());
        let mut trimmed = full.clone();
        trim(&mut trimmed);
        // Everything PodMeta reads is unchanged.
        assert_eq!(
            pod_metas(&trimmed, UID, now()),
            pod_metas(&full, UID, now())
        );
        let meta = &trimmed.metadata;
        assert!(meta.managed_fields.is_none());
        assert!(meta.finalizers.is_none());
        assert!(meta.generate_name.is_none());
        assert_eq!(meta.resource_version.as_deref(), Some("4242"));
        let annotations = meta.annotations.as_ref().expect("annotations");
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["pyroscope.io/service_name"]
        );
        let refs = meta.owner_references.as_ref().expect("owner references");
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].name, "web-7d9f8b6c5d");
        let spec = trimmed.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert!(spec.containers.is_empty() && spec.init_containers.is_none());
        assert!(spec.service_account_name.is_none());
        let status = trimmed.status.as_ref().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.conditions.is_none() && status.pod_ip.is_none());
        let app = &status.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(app.image, "");
        assert!(app.state.is_none());
        // Whatever the API adds (specs, conditions, managed fields) is gone; what remains
        // is a fixed handful of fields per pod and per container.
        let json = serde_json::to_string(&trimmed).expect("json");
        for gone in [
            "managedFields",
            "last-applied",
            "env",
            "conditions",
            "podIP",
            "startedAt",
        ] {
            assert!(!json.contains(gone), "{gone} in {json}");
        }
    }

    #[test]
    fn metadata_is_cheap_to_share() {
        fn shareable<T: Clone + Send + Sync + 'static>() {}
        shareable::<Metadata>();
        shareable::<Arc<PodMeta>>();
    }

    /// `kubernetes:` enabled, with this kubeconfig.
    fn kube_cfg(kubeconfig: PathBuf) -> config::Kubernetes {
        config::Kubernetes {
            enabled: true,
            kubeconfig,
            ..Default::default()
        }
    }

    /// A kubeconfig naming `https://127.0.0.1:1`, where nothing listens.
    fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n\
             users: [{name: u, user: {token: t}}]\n\
             contexts: [{name: c, context: {cluster: k, user: u}}]\n",
        )
        .expect("write kubeconfig");
        path
    }

    #[tokio::test]
    async fn disabled_start_is_immediate_and_empty() {
        let disabled = config::Kubernetes {
            enabled: false,
            ..Default::default()
        };
        let md = start(&disabled, "node-a").await;
        assert_eq!(md.status(), Status::Disabled);
        assert!(!md.fresh());
        assert!(md.by_container_id(ID1).is_none());
        assert!(md.by_pod_uid(UID).is_empty());
    }

    #[tokio::test]
    async fn unreachable_api_start_returns_at_once_and_keeps_trying() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = unreachable_kubeconfig(dir.path());
        let began = Instant::now();
        let md = start(&kube_cfg(kubeconfig), "node-a").await;
        // Waiting on the watch would take its backoff (seconds, then minutes); a loaded
        // machine still starts a task within 10 s.
        assert!(began.elapsed() < Duration::from_secs(10));
        assert_eq!(md.status(), Status::Connecting);
        assert_eq!(md.node(), "node-a");
        // Give the task time for a few refused connections: still nothing, still connecting.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(md.status(), Status::Connecting);
        assert!(md.shared.lock().failure_logged);
        assert!(!md.fresh());
        assert!(md.by_container_id(ID1).is_none());
        assert!(md.by_pod_uid(UID).is_empty());
    }

    #[tokio::test]
    async fn unreachable_error_names_the_cause() {
        let dir = tempfile::tempdir().expect("tempdir");
        let md = Metadata::with_status("node-a".to_owned(), Status::Connecting);
        let mut task = Task::new(
            Arc::downgrade(&md.shared),
            "node-a".to_owned(),
            Some(unreachable_kubeconfig(dir.path())),
        );
        let err = task.watch().await.expect_err("nothing listens on port 1");
        let text = causes(&err);
        assert!(matches!(err, Error::Watch(_)), "{text}");
        assert!(text.contains("refused"), "{text}");
        let err = Error::Kubeconfig {
            path: "/x".into(),
            source: KubeconfigError::MissingClusterUrl,
        };
        assert_eq!(causes(&err), err.to_string());
    }

    /// Polls `ok` until it holds; fails the test after 20 s.
    async fn wait_for(what: &str, ok: impl Fn() -> bool) {
        let began = Instant::now();
        while !ok() {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "timed out: {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Against a real kube-apiserver (no kubelet: pods stay Pending, their status is patched in):
    /// `tests/k8s/start-cluster.sh DIR PORT`, then
    /// `EMBER_K8S_KUBECONFIG=DIR/kubeconfig cargo test --release -p ember --lib kube -- --ignored`.
    #[tokio::test]
    #[ignore = "needs a kube-apiserver: set EMBER_K8S_KUBECONFIG (tests/k8s/start-cluster.sh)"]
    async fn real_apiserver_node_scoped_watch() {
        use ::kube::api::{DeleteParams, Patch, PatchParams, PostParams};

        let kubeconfig = PathBuf::from(std::env::var("EMBER_K8S_KUBECONFIG").expect("env"));
        let node = format!("e2e-{}", std::process::id());
        let md = start(&kube_cfg(kubeconfig.clone()), &node).await;
        let client = connect(Some(&kubeconfig)).await.expect("client");
        let pods = Api::<Pod>::namespaced(client, "default");
        wait_for("synced", || md.fresh()).await;

        let make = |name: &str, on: &str| -> Pod {
            pod(json!({
                "metadata": {"name": name, "labels": {"app": "e2e", "pod-template-hash": "5f6d7c8b9"},
                             "annotations": {"ember.io/service-name": "e2e-svc"},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "e2e-web-5f6d7c8b9", "controller": true,
                                 "uid": "11111111-2222-3333-4444-555555555555"}]},
                "spec": {"nodeName": on, "containers": [{"name": "app", "image": "busybox"}],
                         "initContainers": [{"name": "init", "image": "busybox"}]}
            }))
        };
        let mine = format!("{node}-web");
        let theirs = format!("{node}-other");
        let pp = PostParams::default();
        pods.create(&pp, &make(&mine, &node)).await.expect("create");
        pods.create(&pp, &make(&theirs, "some-other-node"))
            .await
            .expect("create");
        let status = |id: &str, init: &str| {
            json!({"status": {"phase": "Running",
                "containerStatuses": [{"name": "app", "containerID": format!("containerd://{id}"),
                    "image": "busybox", "imageID": "", "ready": true, "restartCount": 0}],
                "initContainerStatuses": [{"name": "init", "containerID": format!("cri-o://{init}"),
                    "image": "busybox", "imageID": "", "ready": false, "restartCount": 0}]}})
        };
        let patch = PatchParams::default();
        pods.patch_status(&mine, &patch, &Patch::Merge(status(ID1, ID2)))
            .await
            .expect("patch");
        pods.patch_status(&theirs, &patch, &Patch::Merge(status(ID3, &"c".repeat(64))))
            .await
            .expect("patch");

        wait_for("container seen", || md.by_container_id(ID1).is_some()).await;
        let meta = md.by_container_id(ID1).expect("app");
        assert_eq!(
            (
                meta.pod.as_str(),
                meta.namespace.as_str(),
                meta.node.as_str()
            ),
            (mine.as_str(), "default", node.as_str())
        );
        assert_eq!(meta.owner_kind.as_deref(), Some("Deployment"));
        assert_eq!(meta.owner_name.as_deref(), Some("e2e-web"));
        assert_eq!(meta.service_name, "e2e-svc");
        assert_eq!(
            md.by_container_id(ID2)
                .map(|m| m.container.clone())
                .as_deref(),
            Some("init")
        );
        assert_eq!(md.by_pod_uid(&meta.pod_uid).len(), 2);
        // Another node's pod never arrives: the watch is node-scoped.
        assert!(md.by_container_id(ID3).is_none());
        assert_eq!(md.pods(), 1);

        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete(&mine, &dp).await.expect("delete");
        pods.delete(&theirs, &dp).await.expect("delete");
        wait_for("pod deleted", || md.by_container_id(ID1).is_none()).await;
        assert!(md.fresh());
    }

    #[tokio::test]
    async fn missing_kubeconfig_is_retried_not_fatal() {
        let md = start(
            &kube_cfg(PathBuf::from("/nonexistent/ember/kubeconfig")),
            "node-a",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(md.status(), Status::Connecting);
        assert!(md.shared.lock().failure_logged);
        assert!(md.by_container_id(ID1).is_none());
    }
}
