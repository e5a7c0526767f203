#!/usr/bin/env python3
"""Builds ember's Grafana dashboards with grafana-foundation-sdk (PyPI) and writes them as
JSON beside this file, and into the Helm chart (helm/ember/dashboards/).

    python3 deploy/grafana/build.py          # write
    python3 deploy/grafana/build.py --check  # fail if the committed JSON is stale

Every panel's PromQL and every variable's query is run against a real Prometheus scraping a
live ember by tests/tests/e2e/explorer.rs (grafana_dashboards_query_a_real_prometheus); it reads
the same JSON. Panels on workloads link to the matching Pyroscope flame graph (Grafana's
Pyroscope app, data source variable `pyroscope`), by `service_name` where the series has it
(`workload` of ember_stacks_total) and by namespace/container labels otherwise.
"""
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

HERE = Path(__file__).resolve().parent
CHART = HERE.parent.parent / "helm" / "ember" / "dashboards"
PROM = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
SEL = 'instance=~"$instance"'
CSEL = 'instance=~"$instance", container_id=~"$container_id"'
PYRO = "/a/grafana-pyroscope-app/explore?explorationType=flame-graph&var-dataSource=${pyroscope}" \
       "&var-profileMetricId=process_cpu:cpu:nanoseconds:cpu:nanoseconds&from=${__from}&to=${__to}"
BY_SERVICE = PYRO + "&var-serviceName=${__field.labels.workload}"
BY_CONTAINER = PYRO + "&var-filters=namespace%7C%3D%7C${__field.labels.namespace}" \
                      ",container%7C%3D%7C${__field.labels.container}"


def q(expr, legend, ref="A"):
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def ts(title, unit, queries, link=None, desc=""):
    p = timeseries.Panel().title(title).unit(unit).datasource(PROM).height(8).span(12)
    if desc:
        p = p.description(desc)
    for i, (expr, legend) in enumerate(queries):
        p = p.with_target(q(expr, legend, "ABCDEFGH"[i]))
    if link:
        p = p.data_links([dashboard.DashboardLink("Flame graph in Pyroscope").url(link).target_blank(True)])
    return p


def variables(d, containers):
    d = d.with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    d = d.with_variable(dashboard.DatasourceVariable("pyroscope").label("Pyroscope").type("grafana-pyroscope-datasource"))
    d = d.with_variable(
        dashboard.QueryVariable("instance").label("agent").datasource(PROM)
        .query("label_values(ember_windows_total, instance)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*"))
    if containers:
        d = d.with_variable(
            dashboard.QueryVariable("container_id").label("container").datasource(PROM)
            .query('label_values(ember_container_cpu_usage_seconds_total{instance=~"$instance"}, container_id)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))
    return d


def use_dashboard():
    d = dashboard.Dashboard("ember: USE per node and container").uid("ember-use") \
        .tags(["ember", "use"]).time("now-1h", "now").refresh("30s")
    d = variables(d, containers=True)
    d = d.with_row(dashboard.Row("Node: CPU, memory, disk, network"))
    d = d.with_panel(ts("CPU utilization", "percentunit", [
        (f'1 - avg by (instance) (rate(ember_node_cpu_seconds_total{{mode="idle", {SEL}}}[{RATE}]))', "{{instance}}")]))
    d = d.with_panel(ts("CPU saturation (PSI some, load per CPU)", "percentunit", [
        (f"rate(ember_node_pressure_cpu_waiting_seconds_total{{{SEL}}}[{RATE}])", "psi {{instance}}"),
        (f'ember_node_load1{{{SEL}}} / on (instance) count by (instance) (ember_node_cpu_seconds_total{{mode="idle", {SEL}}})',
         "load/cpu {{instance}}")]))
    d = d.with_panel(ts("Memory utilization", "percentunit", [
        (f"1 - ember_node_memory_MemAvailable_bytes{{{SEL}}} / ember_node_memory_MemTotal_bytes{{{SEL}}}", "{{instance}}")]))
    d = d.with_panel(ts("Memory saturation and errors (PSI, swap, OOM kills)", "short", [
        (f"rate(ember_node_pressure_memory_waiting_seconds_total{{{SEL}}}[{RATE}])", "psi {{instance}}"),
        (f"rate(ember_node_vmstat_pswpin{{{SEL}}}[{RATE}]) + rate(ember_node_vmstat_pswpout{{{SEL}}}[{RATE}])",
         "swap pages/s {{instance}}"),
        (f"rate(ember_node_vmstat_oom_kill{{{SEL}}}[{RATE}])", "oom kills/s {{instance}}")]))
    d = d.with_panel(ts("Disk utilization (busy time)", "percentunit", [
        (f"rate(ember_node_disk_io_time_seconds_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}}")]))
    d = d.with_panel(ts("Disk saturation (PSI io some)", "percentunit", [
        (f"rate(ember_node_pressure_io_waiting_seconds_total{{{SEL}}}[{RATE}])", "{{instance}}")]))
    d = d.with_panel(ts("Network throughput", "Bps", [
        (f"rate(ember_node_network_receive_bytes_total{{{SEL}}}[{RATE}])", "rx {{instance}} {{device}}"),
        (f"rate(ember_node_network_transmit_bytes_total{{{SEL}}}[{RATE}])", "tx {{instance}} {{device}}")]))
    d = d.with_panel(ts("Network saturation and errors (drops, errors)", "short", [
        (f"rate(ember_node_network_receive_drop_total{{{SEL}}}[{RATE}]) + rate(ember_node_network_transmit_drop_total{{{SEL}}}[{RATE}])",
         "drops/s {{instance}} {{device}}"),
        (f"rate(ember_node_network_receive_errs_total{{{SEL}}}[{RATE}]) + rate(ember_node_network_transmit_errs_total{{{SEL}}}[{RATE}])",
         "errors/s {{instance}} {{device}}")]))
    d = d.with_row(dashboard.Row("Containers"))
    legend = "{{namespace}}/{{pod}}/{{container}} {{container_id}}"
    d = d.with_panel(ts("Container CPU (cores)", "short", [
        (f"rate(ember_container_cpu_usage_seconds_total{{{CSEL}}}[{RATE}])", legend)], BY_CONTAINER))
    d = d.with_panel(ts("Container CPU saturation (PSI cpu some)", "percentunit", [
        (f"rate(ember_container_pressure_cpu_waiting_seconds_total{{{CSEL}}}[{RATE}])", legend)], BY_CONTAINER))
    d = d.with_panel(ts("Container memory working set", "bytes", [
        (f"ember_container_memory_working_set_bytes{{{CSEL}}}", legend)], BY_CONTAINER))
    d = d.with_panel(ts("Container memory and io saturation (PSI some)", "percentunit", [
        (f"rate(ember_container_pressure_memory_waiting_seconds_total{{{CSEL}}}[{RATE}])", "memory " + legend),
        (f"rate(ember_container_pressure_io_waiting_seconds_total{{{CSEL}}}[{RATE}])", "io " + legend)], BY_CONTAINER))
    return d


def profiling_dashboard():
    d = dashboard.Dashboard("ember: profiling and agent health").uid("ember-profiling") \
        .tags(["ember", "profiling"]).time("now-1h", "now").refresh("30s")
    d = variables(d, containers=False)
    d = d.with_row(dashboard.Row("Workloads"))
    d = d.with_panel(ts("Per-container CPU: samples vs cgroup", "short", [
        (f"rate(ember_container_cpu_seconds_total{{{SEL}}}[{RATE}])", "sampled {{namespace}}/{{pod}}/{{container}} {{container_id}}"),
        # The cgroup's counter is read for every container: show the sampled ones.
        (f"rate(ember_container_cpu_usage_seconds_total{{{SEL}}}[{RATE}]) and on (instance, container_id) ember_container_info{{{SEL}}}",
         "cgroup {{namespace}}/{{pod}}/{{container}} {{container_id}}")],
        BY_CONTAINER, "CPU seconds per second seen by sampling (samples / Hz) next to the cgroup's own counter"))
    d = d.with_panel(ts("Run-queue latency p99", "s", [
        (f"histogram_quantile(0.99, sum by (le, instance) (rate(ember_runqueue_latency_seconds_bucket{{{SEL}}}[{RATE}])))",
         "p99 {{instance}}")]))
    d = d.with_panel(ts("Profile quality: complete stacks per workload", "percentunit", [
        (f'sum by (workload) (rate(ember_stacks_total{{result="complete", {SEL}}}[{RATE}])) / '
         f"sum by (workload) (rate(ember_stacks_total{{{SEL}}}[{RATE}]))", "{{workload}}")],
        BY_SERVICE, "Share of user stacks that reached the program's entry or thread start"))
    d = d.with_panel(ts("Frames named", "percentunit", [
        (f'sum by (instance) (rate(ember_frames_total{{result!="unnamed", {SEL}}}[{RATE}])) / '
         f"sum by (instance) (rate(ember_frames_total{{{SEL}}}[{RATE}]))", "{{instance}}")]))
    d = d.with_row(dashboard.Row("ember itself"))
    d = d.with_panel(ts("Samples and samples lost", "short", [
        (f"rate(ember_samples_total{{{SEL}}}[{RATE}])", "samples/s {{instance}}"),
        (f"sum by (instance, reason) (rate(ember_samples_lost_total{{{SEL}}}[{RATE}]))", "lost/s {{reason}} {{instance}}")]))
    d = d.with_panel(ts("Export drops and HTTP refusals", "short", [
        (f"sum by (instance) (rate(ember_export_dropped_total{{{SEL}}}[{RATE}])) or on (instance) (0 * ember_windows_total{{{SEL}}})",
         "export drops/s {{instance}}"),
        (f"sum by (instance, reason) (rate(ember_http_refused_total{{{SEL}}}[{RATE}]))", "http {{reason}} {{instance}}")]))
    d = d.with_panel(ts("Agent memory", "bytes", [
        (f"ember_process_resident_memory_bytes{{{SEL}}}", "RSS {{instance}}")]))
    d = d.with_panel(stat.Panel().title("Windows written").datasource(PROM).height(8).span(12)
                     .with_target(q(f"sum(increase(ember_windows_total{{{SEL}}}[$__range]))", "windows")))
    return d


def render(d):
    return json.dumps(d.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main():
    check = "--check" in sys.argv
    stale = []
    for name, d in (("ember-use.json", use_dashboard()), ("ember-profiling.json", profiling_dashboard())):
        text = render(d)
        for out in (HERE / name, CHART / name):
            if check:
                if not out.exists() or out.read_text() != text:
                    stale.append(str(out))
            else:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text)
    if stale:
        print("stale dashboards (run python3 deploy/grafana/build.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
