# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stand-in's GET /metrics (tests/lab/sglang_standin/sglang/srt/_kpro_lab/metrics.py), read with Prometheus's own
parser: served only with --enable-metrics (404 otherwise), never behind the API key, the real collector's names, types
and labels, and values that follow the requests the stand-in answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families

from test_sglang_standin import GOOD, lab  # noqa: F401  pylint: disable=unused-import
from test_sglang_standin_versions import parse

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "lab", "sglang_standin"))
from sglang.srt._kpro_lab import metrics  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import sglang_releases  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_options, sglang_unit  # noqa: E402

SCHED = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
TOK = {"model_name": "m", "engine_type": "unified"}


def families(text):
    return dict((f.name, f) for f in text_string_to_metric_families(text))


def value(fams, name, suffix="", **labels):
    """The one sample of family ``name`` (sample name + ``suffix``) whose labels include ``labels``."""
    fam = fams[name]
    hits = [s.value for s in fam.samples if s.name == fam.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, suffix, labels, fam.samples)
    return hits[0]


def test_names_types_and_labels_are_the_collectors():
    m = metrics.Metrics("m", lambda: (1000, 8))
    m.prefill("a", 10)
    m.finish("a", 10, 5, 0.15, 0.5)
    fams = families(m.render())
    # prometheus_client's parser names a counter's family without _total: the sample keeps it
    assert dict((n, f.type) for n, f in fams.items()) == {
        "sglang:num_running_reqs": "gauge", "sglang:num_queue_reqs": "gauge", "sglang:gen_throughput": "gauge",
        "sglang:cache_hit_rate": "gauge", "sglang:token_usage": "gauge", "sglang:max_total_num_tokens": "gauge",
        "sglang:prompt_tokens": "counter", "sglang:generation_tokens": "counter", "sglang:num_requests": "counter",
        "sglang:time_to_first_token_seconds": "histogram", "sglang:e2e_request_latency_seconds": "histogram"}
    assert all(s.labels == SCHED for s in fams["sglang:num_running_reqs"].samples)
    assert all(s.labels == TOK for s in fams["sglang:prompt_tokens"].samples)
    assert value(fams, "sglang:prompt_tokens", "_total") == 10 and value(fams, "sglang:generation_tokens", "_total") == 5
    # 0.15 s falls in the le=0.2 bucket and every one above it; the buckets are the collector's defaults
    ttft = dict((s.labels["le"], s.value) for s in fams["sglang:time_to_first_token_seconds"].samples if s.name.endswith("_bucket"))
    assert ttft["0.1"] == 0 and ttft["0.2"] == 1 and ttft["400.0"] == 1 and ttft["+Inf"] == 1 and len(ttft) == 19
    assert value(fams, "sglang:e2e_request_latency_seconds", "_sum") == 0.5
    assert len([s for s in fams["sglang:e2e_request_latency_seconds"].samples if s.name.endswith("_bucket")]) == 23


def test_the_text_is_what_prometheus_clients_multiprocess_collector_writes():
    """The same declarations as the wheel's (0.5.11 metrics_collector.py:200-244, 838-842, 1207-1216, 1279-1283,
    1372-1391), written by prometheus_client's MultiProcessCollector as the real /metrics is (utils/common.py:1412-1422):
    the stand-in's text, line for line."""
    m = metrics.Metrics("m", lambda: (1000, 8))
    m.prefill("a", 10)
    m.decode("a", 60, 25.0)
    m.finish("a", 10, 50, 0.3, 2.5)
    ours = m.render()
    script = textwrap.dedent("""
        import json, sys, tempfile, os
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
        from sglang.srt._kpro_lab import metrics as sm
        sched, tok = json.loads(sys.argv[1]), json.loads(sys.argv[2])
        values = {"sglang:num_running_reqs": 1, "sglang:num_queue_reqs": 0, "sglang:gen_throughput": 25.0,
                  "sglang:cache_hit_rate": 0.0, "sglang:token_usage": 0.06, "sglang:max_total_num_tokens": 1000}
        for name, _t, doc, _l in sm._SCHEDULER:
            Gauge(name=name, documentation=doc, labelnames=sched.keys(), multiprocess_mode="mostrecent").labels(**sched).set(values[name])
        for name, n in (("sglang:prompt_tokens_total", 10), ("sglang:generation_tokens_total", 50), ("sglang:num_requests_total", 1)):
            doc = [d for nm, _t, d, _l in sm._TOKENIZER if nm == name][0]
            Counter(name=name, documentation=doc, labelnames=tok.keys()).labels(**tok).inc(n)
        for (name, doc, buckets, _l), v in zip(sm._HISTOGRAMS, (0.3, 2.5)):
            Histogram(name=name, documentation=doc, labelnames=tok.keys(), buckets=buckets).labels(**tok).observe(v)
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        sys.stdout.write(generate_latest(reg).decode())
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "lab", "sglang_standin"))
    real = subprocess.run([sys.executable, "-c", script, json.dumps(SCHED), json.dumps(TOK)], env=env, check=True,
                          capture_output=True, text=True).stdout
    # the collector writes its families in the order of its files: compare each family's lines
    assert sorted(ours.splitlines()) == sorted(real.splitlines())


def test_queue_running_usage_and_the_idle_log():
    m = metrics.Metrics("m", lambda: (1000, 2))
    for rid in "abc":
        m.prefill(rid, 100)
    fams = families(m.render())
    # two slots: the third request waits in the queue; the pool holds the three prompts
    assert value(fams, "sglang:num_running_reqs") == 2 and value(fams, "sglang:num_queue_reqs") == 1
    assert value(fams, "sglang:token_usage") == 0.3
    assert "sglang:prompt_tokens" not in fams      # a tokenizer family shows once a request finished (multiprocess files)
    m.decode("a", 150, 40.0)
    for rid in "abc":
        m.finish(rid, 100, 50, 0.2, 1.0)
    fams = families(m.render())
    # the gauges keep what the scheduler logged last until it logs again: idle, after 30 s
    assert value(fams, "sglang:gen_throughput") == 40.0 and value(fams, "sglang:num_requests", "_total") == 3
    m.last_log -= metrics.IDLE_LOG_S + 1
    fams = families(m.render())
    assert value(fams, "sglang:gen_throughput") == 0 and value(fams, "sglang:num_running_reqs") == 0
    assert value(fams, "sglang:num_queue_reqs") == 0 and value(fams, "sglang:token_usage") == 0


def test_served_only_with_enable_metrics_never_behind_the_key_and_follows_requests(lab):
    lab.start(GOOD + ["--api-key", "sekret"])
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200, 60), lab.text()[-3000:]
    # without --enable-metrics the route is not mounted: FastAPI's 404, whatever the key
    assert lab.get("/metrics") == (404, '{"detail": "Not Found"}')
    assert lab.get("/metrics", key="sekret") == (404, '{"detail": "Not Found"}')
    lab.proc.kill()
    lab.wait()
    lab.start(GOOD + ["--api-key", "sekret", "--enable-metrics"])
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200, 60), lab.text()[-3000:]
    code, text = lab.get("/metrics")           # no key: /metrics is always allowed (0.5.11 utils/auth.py:100)
    assert code == 200
    before = families(text)
    # the warmup request counted already; the KV pool is rank 0's, as the log says
    assert value(before, "sglang:num_requests", "_total") == 1
    pool = value(before, "sglang:max_total_num_tokens", tp_rank="0")
    assert "max_total_num_tokens=%d," % pool in lab.text()
    assert value(before, "sglang:spec_accept_length") == 3.12     # GOOD runs NEXTN
    code, body = lab.get("/v1/chat/completions", key="sekret", data={"model": "qwen3.6-27b", "temperature": 0, "messages": [
        {"role": "user", "content": "Count from 1 to 60, one number per line."}], "chat_template_kwargs": {"enable_thinking": False}})
    assert code == 200
    usage = json.loads(body)["usage"]
    after = families(lab.get("/metrics")[1])
    for fam, key in (("sglang:prompt_tokens", "prompt_tokens"), ("sglang:generation_tokens", "completion_tokens")):
        assert value(after, fam, "_total") - value(before, fam, "_total") == usage[key]
    assert value(after, "sglang:num_requests", "_total") == 2
    assert value(after, "sglang:e2e_request_latency_seconds", "_count") == 2
    assert value(after, "sglang:gen_throughput") > 0     # 60 lines: a decode log, with the measured rate


def test_the_role_default_reaches_execstart_as_a_flag_every_release_takes(capsys):
    """sglang_server_enable_metrics (true) -> the option enable_metrics -> --enable-metrics, which no release in the table
    renamed or removed (0.5.11 server_args.py:4876-4880; 0.5.23 arg_groups/fields/observability.py:70)."""
    assert "--enable-metrics" in sglang_unit.render_flags({"enable_metrics": True})
    assert "--enable-metrics" not in sglang_unit.render_flags({"enable_metrics": False})
    for version in sglang_releases.VERSIONS:
        flag = sglang_options.flag("enable_metrics", version)
        ns, code, err = parse(version, [flag], capsys)
        assert code == 0 and ns.enable_metrics is True, (version, flag, err)
