"""Checks on ember's Kubernetes manifests that schemas cannot express.

Run by tests/deploy/check.sh with the venv's python (PyYAML comes with yamllint).

  manifests.py policy FILE                  least privilege + cross-references
  manifests.py same FILE_A FILE_B           the two DaemonSets agree on what matters
  manifests.py config FILE OUT              write the ConfigMap's ember.yaml to OUT
  manifests.py no-rbac FILE                 no RBAC objects, no token mounted
  manifests.py split FILE CORE OTHER        core kinds to CORE, the rest to OTHER
  manifests.py servicemonitor FILE          ServiceMonitor points at the Service and pods
  manifests.py podmonitor FILE              PodMonitor points at the agent pods
  manifests.py rules FILE JOB OUT           PrometheusRule = deploy/alerts.yaml (job JOB); its rules to OUT

Each prints one line per problem and exits 1 if there was any.
"""

import json
import os
import sys

import yaml

# What the DaemonSet may ask for, and nothing more.
ALLOWED_CAPS = {"BPF", "PERFMON", "SYS_PTRACE", "SYS_RESOURCE", "DAC_READ_SEARCH", "CHECKPOINT_RESTORE", "SYSLOG"}
REQUIRED_CAPS = ALLOWED_CAPS
# Optional extras (extraCapabilities) the policy accepts; never SYS_ADMIN.
OPTIONAL_CAPS = set()
HOST_PATHS = {"/sys/fs/cgroup", "/sys/kernel/tracing"}
CORE_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Service", "NetworkPolicy"}
# The seccomp profile deploy/seccomp/ember.json, as installed on the nodes.
SECCOMP = {"type": "Localhost", "localhostProfile": "ember.json"}
DEPLOY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy")
# The seccomp installer (values.yaml seccompInstaller): the one init container allowed, and
# the one writable host path, the kubelet's seccomp directory.
INSTALLER = "seccomp-installer"
# Memory the config's caps let ember hold, beyond which the limit must reach (bytes).
MEMORY_BASELINE = 192 << 20

problems = []


def fail(msg):
    problems.append(msg)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        fail(f"expected one {kind}, found {len(found)}")
        return None
    return found[0]


def agent_config(docs):
    """The ConfigMap carrying ember.yaml (a chart may also render a dashboards ConfigMap)."""
    return one([d for d in docs if d.get("kind") == "ConfigMap" and "ember.yaml" in d.get("data", {})], "ConfigMap")


def dashboards(docs):
    """Grafana dashboard ConfigMaps: the sidecar's label, and the JSON of deploy/grafana/."""
    for d in docs:
        if d.get("kind") != "ConfigMap" or "ember.yaml" in d.get("data", {}):
            continue
        if "ember.json" in d.get("data", {}):
            if json.loads(d["data"]["ember.json"]) != json.load(open(os.path.join(DEPLOY, "seccomp", "ember.json"))):
                fail(f"ConfigMap {d['metadata']['name']}: ember.json differs from deploy/seccomp/ember.json")
            continue
        if d["metadata"].get("labels", {}).get("grafana_dashboard") is None:
            fail(f"ConfigMap {d['metadata']['name']} has no grafana_dashboard label for the sidecar")
        for name, text in d.get("data", {}).items():
            want = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "grafana", name)
            if not os.path.exists(want) or json.loads(text) != json.load(open(want)):
                fail(f"dashboard {name} in the chart differs from deploy/grafana/{name}")


def subset(small, big):
    return all(big.get(k) == v for k, v in (small or {}).items())


def policy(docs):
    ds = one(docs, "DaemonSet")
    sa = one(docs, "ServiceAccount")
    cm = agent_config(docs)
    dashboards(docs)
    if not (ds and sa and cm):
        return
    ns = ds["metadata"]["namespace"]
    for d in docs:
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding") and d["metadata"].get("namespace") != ns:
            fail(f"{d['kind']} {d['metadata']['name']}: namespace is not {ns}")
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version"):
            if d["kind"] != "Namespace" and key not in d["metadata"].get("labels", {}):
                fail(f"{d['kind']} {d['metadata']['name']}: no label {key}")

    # RBAC: pods get/list/watch only, bound to this ServiceAccount.
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    for r in roles:
        rules = r.get("rules", [])
        if rules != [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]:
            fail(f"{r['kind']} {r['metadata']['name']}: rules are not exactly pods get/list/watch: {rules}")
    for b in [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        if b["roleRef"]["name"] not in {r["metadata"]["name"] for r in roles}:
            fail(f"{b['kind']} {b['metadata']['name']}: roleRef {b['roleRef']['name']} is not in the file")
        if b["subjects"] != [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": ns}]:
            fail(f"{b['kind']} {b['metadata']['name']}: subjects are not the agent's ServiceAccount")

    # DaemonSet pod spec.
    spec = ds["spec"]
    tpl = spec["template"]
    pod = tpl["spec"]
    if not subset(spec["selector"]["matchLabels"], tpl["metadata"]["labels"]):
        fail("DaemonSet selector does not match the pod template's labels")
    if spec.get("updateStrategy", {}).get("rollingUpdate", {}).get("maxUnavailable") != "10%":
        fail("updateStrategy.rollingUpdate.maxUnavailable is not 10%")
    if pod.get("serviceAccountName") != sa["metadata"]["name"]:
        fail("pod serviceAccountName is not the ServiceAccount")
    if pod.get("hostPID") is not True:
        fail("hostPID is not true")
    for k in ("hostNetwork", "hostIPC"):
        if pod.get(k):
            fail(f"{k} is set")
    if {"operator": "Exists"} not in pod.get("tolerations", []):
        fail("no toleration {operator: Exists}")
    if pod.get("nodeSelector", {}).get("kubernetes.io/os") != "linux":
        fail("nodeSelector kubernetes.io/os is not linux")
    if pod.get("securityContext", {}).get("privileged"):
        fail("pod securityContext is privileged")
    inits = pod.get("initContainers") or []
    if len(pod["containers"]) != 1 or [i["name"] for i in inits] not in ([], [INSTALLER]):
        fail(f"expected exactly one container and no init containers but {INSTALLER}")
        return
    installer_paths = installer(inits[0], pod) if inits else set()
    c = pod["containers"][0]
    sc = c.get("securityContext", {})
    want = {"runAsUser": 0, "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
    for k, v in want.items():
        if sc.get(k) != v:
            fail(f"container securityContext.{k} is {sc.get(k)!r}, want {v!r}")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        fail(f"capabilities.drop is {caps.get('drop')}, want [ALL]")
    added = set(caps.get("add", []))
    if not REQUIRED_CAPS <= added:
        fail(f"capabilities.add lacks {sorted(REQUIRED_CAPS - added)}")
    if added - ALLOWED_CAPS - OPTIONAL_CAPS:
        fail(f"capabilities.add has more than allowed: {sorted(added - ALLOWED_CAPS - OPTIONAL_CAPS)}")
    if sc.get("seccompProfile") != SECCOMP:
        fail(f"seccompProfile is {sc.get('seccompProfile')}, want {SECCOMP}")
    annotations = tpl["metadata"].get("annotations", {})
    apparmor_annotation = annotations.get(f"container.apparmor.security.beta.kubernetes.io/{c['name']}")
    if sc.get("appArmorProfile") != {"type": "Unconfined"} and apparmor_annotation != "unconfined":
        fail("AppArmor is not unconfined (neither appArmorProfile nor the annotation)")

    env = {e["name"]: e for e in c.get("env", [])}
    if env.get("NODE_NAME", {}).get("valueFrom") != {"fieldRef": {"fieldPath": "spec.nodeName"}}:
        fail("env NODE_NAME is not from fieldRef spec.nodeName")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    # The probes: liveness /healthz, readiness /readyz, both on the health port (a
    # listener of their own, which the NetworkPolicy admits no pod to).
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") != "health" or "health" not in ports:
            fail(f"{probe} is not httpGet {path} on the container port named health")
    res = c.get("resources", {})
    for k in ("requests", "limits"):
        if not {"cpu", "memory"} <= set(res.get(k, {})):
            fail(f"resources.{k} lacks cpu or memory")

    # NetworkPolicy: selects the agents, admits ingress to the HTTP port only.
    nps = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if len(nps) != 1:
        fail(f"expected one NetworkPolicy, found {len(nps)}")
    else:
        np = nps[0]["spec"]
        if not subset(np["podSelector"].get("matchLabels"), tpl["metadata"]["labels"]):
            fail("NetworkPolicy podSelector does not select the agents")
        if "Ingress" not in np.get("policyTypes", []):
            fail("NetworkPolicy does not restrict ingress")
        for rule in np.get("ingress", []):
            if [p.get("port") for p in rule.get("ports", [])] not in (["http"], [ports.get("http")]):
                fail(f"NetworkPolicy admits more than the HTTP port: {rule}")
            if any(p.get("port") in ("health", ports.get("health")) for p in rule.get("ports", [])):
                fail(f"NetworkPolicy admits pods to the health port (the probes' own): {rule}")
            # Issue 58: /metrics names every pod of the node; no rule admits any source.
            peers = rule.get("from") or []
            if not peers:
                fail(f"NetworkPolicy admits every source to /metrics: {rule}")
            for peer in peers:
                ns = peer.get("namespaceSelector")
                if "ipBlock" in peer or ns is not None and not (ns.get("matchLabels") or ns.get("matchExpressions")):
                    fail(f"NetworkPolicy peer admits every namespace or address: {peer}")
        names = {
            p["namespaceSelector"]["matchLabels"].get("kubernetes.io/metadata.name")
            for r in np.get("ingress", [])
            for p in r.get("from") or []
            if "namespaceSelector" in p and "matchLabels" in p["namespaceSelector"]
        }
        own = nps[0]["metadata"].get("namespace")
        if own not in names or "monitoring" not in names:
            fail(f"NetworkPolicy does not admit its own namespace {own} and monitoring: {sorted(map(str, names))}")

    # Volumes: every mount has a volume; host paths are the allowed ones, read-only.
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    init_mounts = {m["name"] for i in inits for m in i.get("volumeMounts", [])}
    for name, m in mounts.items():
        v = vols.get(name)
        if v is None:
            fail(f"volumeMount {name} has no volume")
            continue
        if "hostPath" in v:
            if v["hostPath"]["path"] not in HOST_PATHS:
                fail(f"hostPath {v['hostPath']['path']} is not one of {sorted(HOST_PATHS)}")
            if not m.get("readOnly"):
                fail(f"hostPath volume {name} is not mounted read-only")
    if {v["hostPath"]["path"] for v in vols.values() if "hostPath" in v} != HOST_PATHS | installer_paths:
        fail(f"hostPath volumes are not exactly {sorted(HOST_PATHS | installer_paths)}")
    if set(vols) - set(mounts) - init_mounts:
        fail(f"unused volumes {sorted(set(vols) - set(mounts) - init_mounts)}")

    # The agent config agrees with the pod: port, config path, data dir.
    cfg_vol = [n for n, v in vols.items() if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    if not cfg_vol:
        fail("no volume mounts the ConfigMap")
        return
    cfg_dir = mounts[cfg_vol[0]]["mountPath"]
    args = c.get("args", [])
    if "--config" not in args or args[args.index("--config") + 1] != f"{cfg_dir}/ember.yaml":
        fail(f"args {args} do not pass --config {cfg_dir}/ember.yaml")
    cfg = yaml.safe_load(cm["data"]["ember.yaml"]) or {}
    server = cfg.get("server", {})
    listen = str(server.get("metrics_listen", ""))
    if server.get("enabled") is False:
        fail("config server.enabled is false: the probes need /healthz")
    if listen.startswith(("127.", "localhost", "[::1]")) or not listen:
        fail(f"config server.metrics_listen {listen!r} is loopback: probes and scrapes use the pod IP")
    port = int(listen.rsplit(":", 1)[-1]) if listen else None
    if port not in ports.values():
        fail(f"config server.metrics_listen port {port} is not a container port {ports}")
    health = str(server.get("health_listen", ""))
    if health.startswith(("127.", "localhost", "[::1]")) or not health:
        fail(f"config server.health_listen {health!r} is loopback or unset: the kubelet probes the pod IP")
    elif int(health.rsplit(":", 1)[-1]) != ports.get("health"):
        fail(f"config server.health_listen {health!r} is not the container port named health {ports}")
    elif ports.get("health") == port:
        fail("the health port is the metrics port: the probes need a listener of their own")
    # Profiles name every process and pod on the node: loopback, or a token.
    profiles = str(server.get("listen", ""))
    if not profiles.startswith(("127.", "localhost", "[::1]")) and not server.get("token_file"):
        fail(f"config server.listen {profiles!r} exposes profiles without server.token_file")
    if profiles.rsplit(":", 1)[-1] in {str(p) for p in ports.values()}:
        fail(f"config server.listen {profiles!r} is a container port: profiles are not for the pod IP")
    scrape_port = annotations.get("prometheus.io/port")
    if scrape_port is not None and scrape_port != str(port):
        fail(f"prometheus.io/port {scrape_port} is not the listen port {port}")
    if not cfg.get("kubernetes", {}).get("enabled"):
        fail("config kubernetes.enabled is not true")
    # The memory limit covers what the caps let ember hold (else the OOM killer acts
    # before the caps do). Defaults as in config/ember.yaml.
    lim, smp, jit, sinks = cfg.get("limits", {}), cfg.get("sampling", {}), cfg.get("jit", {}), cfg.get("sinks", {})
    enabled_sinks = sum(1 for s in ("pyroscope", "otlp") if sinks.get(s, {}).get("enabled"))
    held = (MEMORY_BASELINE + int(lim.get("sample_queue_bytes", 33554432))
            + 2 * int(lim.get("max_stack_bytes_per_window", 33554432))
            + int(jit.get("max_total_bytes", 67108864)) + int(smp.get("unwind_max_bytes", 33554432))
            + 2 * int(smp.get("ring_buffer_bytes", 1048576))
            + enabled_sinks * int(sinks.get("queue_bytes", 16777216)))
    off = cfg.get("offcpu", {})
    if off.get("enabled", True):
        # Its BPF maps (charged to the pod), its sums with two records kept per sum, and
        # its ring buffer mapped twice.
        held += (2304 * int(off.get("max_threads", 8192)) + 320 * int(off.get("max_tasks", 65536))
                 + 4864 * int(off.get("max_stacks", 8192)) + 2 * int(off.get("ring_buffer_bytes", 1048576)))
    memory = res.get("limits", {}).get("memory")
    if memory is not None and parse_quantity(memory) < held:
        fail(f"resources.limits.memory {memory} is below what the caps let ember hold ({held >> 20} Mi)")
    data_dir = cfg.get("output", {}).get("data_dir", "")
    writable = [m for m in mounts.values() if not m.get("readOnly")]
    under = [m for m in writable if data_dir.startswith(m["mountPath"].rstrip("/") + "/")]
    if not under:
        fail(f"output.data_dir {data_dir} is not on a writable volume (the root filesystem is read-only)")
    else:
        v = vols[under[0]["name"]]
        limit = v.get("emptyDir", {}).get("sizeLimit")
        if limit is None:
            fail("the data emptyDir has no sizeLimit")
        else:
            keep = int(cfg.get("output", {}).get("keep_bytes", 268435456))
            if keep >= parse_quantity(limit):
                fail(f"output.keep_bytes {keep} is not below the emptyDir sizeLimit {limit}")


def installer(i, pod):
    """The seccomp installer: no capabilities, RuntimeDefault, read-only root; it alone writes
    a host path, which ends in /seccomp. Returns that path."""
    sc = i.get("securityContext", {})
    want = {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    for k, v in want.items():
        if sc.get(k) != v:
            fail(f"{INSTALLER} securityContext.{k} is {sc.get(k)!r}, want {v!r}")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    agent_mounts = {m["name"] for m in pod["containers"][0].get("volumeMounts", [])}
    paths = set()
    for m in i.get("volumeMounts", []):
        v = vols.get(m["name"], {})
        if "hostPath" in v:
            if m["name"] in agent_mounts or not v["hostPath"]["path"].rstrip("/").endswith("/seccomp"):
                fail(f"{INSTALLER}: hostPath {v['hostPath']['path']} is not a seccomp directory of its own")
            paths.add(v["hostPath"]["path"])
        elif not m.get("readOnly"):
            fail(f"{INSTALLER}: {m['name']} is writable")
    if len(paths) != 1:
        fail(f"{INSTALLER} writes {len(paths)} host paths, want the kubelet's seccomp directory")
    return paths


def parse_quantity(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    for u, m in units.items():
        if str(q).endswith(u):
            return int(str(q)[: -len(u)]) * m
    return int(q)


def pod_essentials(docs):
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    strip = lambda d: {k: v for k, v in d.items() if k != "name"}  # noqa: E731
    return {
        "hostPID": pod.get("hostPID"),
        "tolerations": pod.get("tolerations"),
        "nodeSelector": pod.get("nodeSelector"),
        "securityContext": c.get("securityContext"),
        "resources": c.get("resources"),
        "args": c.get("args"),
        "env": c.get("env"),
        "ports": c.get("ports"),
        "livenessProbe": c.get("livenessProbe"),
        "readinessProbe": c.get("readinessProbe"),
        "volumeMounts": c.get("volumeMounts"),
        "hostPaths": sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v),
        "emptyDirs": [strip(v) for v in pod["volumes"] if "emptyDir" in v],
        "updateStrategy": ds["spec"].get("updateStrategy"),
    }


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "policy":
        policy(load(args[0]))
    elif cmd == "same":
        a, b = pod_essentials(load(args[0])), pod_essentials(load(args[1]))
        for k in a:
            if a[k] != b[k]:
                fail(f"{k} differs:\n  {args[0]}: {a[k]}\n  {args[1]}: {b[k]}")
    elif cmd == "config":
        cm = agent_config(load(args[0]))
        if cm:
            with open(args[1], "w") as f:
                f.write(cm["data"]["ember.yaml"])
    elif cmd == "no-rbac":
        docs = load(args[0])
        rbac = [d["kind"] for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
        if rbac:
            fail(f"RBAC objects rendered with kubernetes.enabled false: {rbac}")
        ds = one(docs, "DaemonSet")
        if ds and ds["spec"]["template"]["spec"].get("automountServiceAccountToken") is not False:
            fail("automountServiceAccountToken is not false with kubernetes.enabled false")
    elif cmd == "split":
        docs = load(args[0])
        with open(args[1], "w") as core, open(args[2], "w") as other:
            yaml.safe_dump_all([d for d in docs if d["kind"] in CORE_KINDS], core)
            yaml.safe_dump_all([d for d in docs if d["kind"] not in CORE_KINDS], other)
    elif cmd == "servicemonitor":
        docs = load(args[0])
        sm, svc, ds = one(docs, "ServiceMonitor"), one(docs, "Service"), one(docs, "DaemonSet")
        if sm and svc and ds:
            if sm["apiVersion"] != "monitoring.coreos.com/v1":
                fail(f"ServiceMonitor apiVersion {sm['apiVersion']}")
            if set(sm["spec"]) - {"selector", "namespaceSelector", "endpoints", "jobLabel"}:
                fail(f"ServiceMonitor spec has unexpected keys {sorted(sm['spec'])}")
            if not subset(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]):
                fail("ServiceMonitor selector does not match the Service's labels")
            if sm["spec"]["namespaceSelector"] != {"matchNames": [svc["metadata"]["namespace"]]}:
                fail("ServiceMonitor namespaceSelector is not the Service's namespace")
            names = {p["name"] for p in svc["spec"]["ports"]}
            for ep in sm["spec"]["endpoints"]:
                if set(ep) - {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings",
                              "honorLabels"}:
                    fail(f"ServiceMonitor endpoint has unexpected keys {sorted(ep)}")
                # The operator adds namespace/pod/container target labels (ember's own pod).
                if ep.get("honorLabels") is not True:
                    fail("ServiceMonitor endpoint without honorLabels: true renames ember's "
                         "namespace/pod/container labels exported_*")
                if ep["port"] not in names:
                    fail(f"ServiceMonitor endpoint port {ep['port']} is not a Service port {names}")
            if svc["spec"].get("clusterIP") != "None":
                fail("the Service is not headless")
            if not subset(svc["spec"]["selector"], ds["spec"]["template"]["metadata"]["labels"]):
                fail("the Service selector does not match the agent pods")
            cports = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
            for p in svc["spec"]["ports"]:
                if p["targetPort"] not in cports:
                    fail(f"Service targetPort {p['targetPort']} is not a container port")
            if "prometheus.io/scrape" in ds["spec"]["template"]["metadata"].get("annotations", {}):
                fail("pods keep prometheus.io annotations although a ServiceMonitor scrapes them")
    elif cmd == "podmonitor":
        docs = load(args[0])
        pm, ds = one(docs, "PodMonitor"), one(docs, "DaemonSet")
        if pm and ds:
            if pm["apiVersion"] != "monitoring.coreos.com/v1":
                fail(f"PodMonitor apiVersion {pm['apiVersion']}")
            if not subset(pm["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"]):
                fail("PodMonitor selector does not match the agent pods")
            if pm["spec"]["namespaceSelector"] != {"matchNames": [ds["metadata"]["namespace"]]}:
                fail("PodMonitor namespaceSelector is not the agents' namespace")
            cports = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
            for ep in pm["spec"]["podMetricsEndpoints"]:
                if ep.get("honorLabels") is not True:
                    fail("PodMonitor endpoint without honorLabels: true renames ember's labels exported_*")
                if ep["port"] not in cports or ep["port"] == "health":
                    fail(f"PodMonitor endpoint port {ep['port']} is not the metrics container port")
            if "prometheus.io/scrape" in ds["spec"]["template"]["metadata"].get("annotations", {}):
                fail("pods keep prometheus.io annotations although a PodMonitor scrapes them")
    elif cmd == "rules":
        pr = one(load(args[0]), "PrometheusRule")
        if pr:
            with open(os.path.join(DEPLOY, "alerts.yaml")) as f:
                want = yaml.safe_load(f.read().replace('job="ember"', f'job="{args[1]}"'))
            if pr["spec"] != {"groups": want["groups"]}:
                fail(f"PrometheusRule's groups are not deploy/alerts.yaml's with job={args[1]}")
            with open(args[2], "w") as f:
                yaml.safe_dump({"groups": pr["spec"]["groups"]}, f)
    else:
        sys.exit(f"unknown command {cmd}")
    for p in problems:
        print(f"  {' '.join(sys.argv[2:3])}: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
