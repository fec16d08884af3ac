# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate docs/grafana/kpro-gpu-serving.json with Grafana's own SDK (grafana-foundation-sdk, requirements/dev.in).

    .venv/bin/python tests/tools/grafana_dashboard.py            # write the file
    .venv/bin/python tests/tools/grafana_dashboard.py --check    # exit 1 when the shipped file is not this output

Three sources, one Prometheus data source (the dashboard's ${datasource} variable, chosen at import):
- the verify run's node_exporter textfile (plugins/module_utils/serve/metrics_textfile.py): kpro_gpu_serving_*;
- SGLang's own /metrics (--enable-metrics, sglang_server_enable_metrics): sglang:*;
- NVIDIA's dcgm-exporter (not installed by the collection; its default counters, etc/default-counters.csv):
  DCGM_FI_DEV_FB_USED / _FB_FREE (MiB), DCGM_FI_DEV_GPU_UTIL (%). Without it those panels show "No data".
"""

import itertools
import json
import os
import sys

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(REPO, "docs", "grafana", "kpro-gpu-serving.json")
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
HOST = 'host=~"$host"'
V = "kpro_gpu_serving_"
IDS = itertools.count(1)   # every panel and row its own id (Grafana keys panel state and links by it)


def q(expr, legend=None, instant=False, ref="A"):
    out = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        out = out.legend_format(legend)
    return out.instant().format(pm.PromQueryFormat.TABLE) if instant else out


def series(title, desc, unit, *targets, span=8):
    p = (timeseries.Panel().id(next(IDS)).title(title).description(desc).unit(unit).datasource(DS).span(span).height(8)
         .legend(gc.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM))
         .tooltip(gc.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)))
    for t in targets:
        p = p.with_target(t)
    return p


def flag_stat(title, desc, expr, good, bad):
    """A 1/0 gauge per host: green ``good`` or red ``bad``."""
    marks = dm.ValueMap(options={"1": dm.ValueMappingResult(text=good, color="green", index=0),
                                 "0": dm.ValueMappingResult(text=bad, color="red", index=1)})
    return big(title, desc).mappings([marks]).with_target(q(expr, "{{host}}"))


def big(title, desc):
    """A stat panel: each series' last value."""
    return (stat.Panel().id(next(IDS)).title(title).description(desc).datasource(DS).span(6).height(5)
            .reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"])).graph_mode(cm.BigValueGraphMode.NONE))


def verify_row(d):
    d = d.with_row(gd.Row("Verify: playbooks/verify.yml (node_exporter textfile)").id(next(IDS)))
    d = d.with_panel(flag_stat("Verify", "kpro_gpu_serving_verify_ok: 1 when the last verify run found no error", V + "verify_ok{%s}" % HOST,
                               "OK", "FINDINGS"))
    d = d.with_panel(flag_stat("Known-answer checks", "kpro_gpu_serving_known_answer_ok: the server's answers to the gate's checks",
                               V + "known_answer_ok{%s}" % HOST, "RIGHT", "WRONG"))
    age = (big("Since the last verify", "A verify that stopped running shows here (hourly: over 2 h is red)").unit("s")
           .thresholds(gd.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([
               dm.Threshold(value=None, color="green"), dm.Threshold(value=7200, color="red")]))
           .with_target(q("time() - %sverify_timestamp_seconds{%s}" % (V, HOST), "{{host}}")))
    d = d.with_panel(age)
    d = d.with_panel(big("Findings", "kpro_gpu_serving_verify_findings of the last run").with_target(q(V + "verify_findings{%s}" % HOST, "{{host}}")))
    drift = (table.Panel().id(next(IDS)).show_header(True).title("Drift findings")
             .description("One row per finding of the last run (docs/verify.md: phases and remedies)")
             .datasource(DS).span(16).height(8).with_target(q(V + "verify_finding{%s} == 1" % HOST, instant=True))
             .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True},
                 "indexByName": {"host": 0, "check": 1, "phase": 2, "severity": 3}})))
    d = d.with_panel(drift)
    return d.with_panel(series("Verify's request latency", "kpro_gpu_serving_request_latency_seconds: one short completion", "s",
                               q(V + "request_latency_seconds{%s}" % HOST, "{{host}}")))


def sglang_row(d):
    rate = "[$__rate_interval]"
    d = d.with_row(gd.Row("SGLang: /metrics (--enable-metrics)").id(next(IDS)))
    d = d.with_panel(series("Request rate", "finished requests per second (sglang:num_requests_total)", "reqps",
                            q("sum by (instance) (rate(sglang:num_requests_total%s))" % rate, "{{instance}}")))
    d = d.with_panel(series("Tokens/s", "generated and prompt tokens per second (sglang:*_tokens_total); the scheduler's own decode "
                            "figure (sglang:gen_throughput)", "short",
                            q("sum by (instance) (rate(sglang:generation_tokens_total%s))" % rate, "generated {{instance}}"),
                            q("sum by (instance) (rate(sglang:prompt_tokens_total%s))" % rate, "prompt {{instance}}", ref="B"),
                            q("sum by (instance) (sglang:gen_throughput)", "decode (scheduler) {{instance}}", ref="C")))
    d = d.with_panel(series("Queue and running requests", "sglang:num_queue_reqs waits for a slot (max_running_requests)", "short",
                            q("sum by (instance) (sglang:num_queue_reqs)", "queued {{instance}}"),
                            q("sum by (instance) (sglang:num_running_reqs)", "running {{instance}}", ref="B")))
    d = d.with_panel(series("Time to first token", "p50 and p95 of sglang:time_to_first_token_seconds", "s",
                            q("histogram_quantile(0.5, sum by (le, instance) (rate(sglang:time_to_first_token_seconds_bucket%s)))" % rate,
                              "p50 {{instance}}"),
                            q("histogram_quantile(0.95, sum by (le, instance) (rate(sglang:time_to_first_token_seconds_bucket%s)))" % rate,
                              "p95 {{instance}}", ref="B"), span=12))
    return d.with_panel(series("KV cache usage", "sglang:token_usage: the share of the KV pool's tokens in use", "percentunit",
                               q("max by (instance) (sglang:token_usage)", "{{instance}}"), span=12))


def gpu_row(d):
    d = d.with_row(gd.Row("GPUs: NVIDIA dcgm-exporter (install it on the Proxmox host)").id(next(IDS)))
    d = d.with_panel(series("GPU memory used", "DCGM_FI_DEV_FB_USED (MiB) per GPU", "mbytes",
                            q("DCGM_FI_DEV_FB_USED", "{{Hostname}} GPU {{gpu}}"), span=12))
    return d.with_panel(series("GPU utilization", "DCGM_FI_DEV_GPU_UTIL (%) per GPU", "percent",
                               q("DCGM_FI_DEV_GPU_UTIL", "{{Hostname}} GPU {{gpu}}"), span=12))


def build():
    global IDS   # pylint: disable=global-statement
    IDS = itertools.count(1)
    d = (gd.Dashboard("kpro GPU serving").uid("kpro-gpu-serving").tags(["kpro", "sglang", "gpu"]).refresh("1m").time("now-6h", "now")
         .timezone("browser").editable()
         .description("kpro.gpu_serving: the verify run's findings, SGLang's metrics and the GPUs (docs/verify.md)")
         .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
         .with_variable(gd.QueryVariable("host").label("Host").datasource(DS).query("label_values(%sverify_ok, host)" % V)
                        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(".*")))
    return gpu_row(sglang_row(verify_row(d))).build()


def render():
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv):
    text = render()
    if "--check" in argv:
        with open(OUT) as f:
            same = f.read() == text
        print("%s is %s" % (os.path.relpath(OUT, REPO),
                            "the generator's output" if same else "NOT the generator's output: run tests/tools/grafana_dashboard.py"))
        return 0 if same else 1
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
