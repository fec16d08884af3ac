# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""docs/grafana/kpro-gpu-serving.json: the output of tests/tools/grafana_dashboard.py (Grafana's own SDK,
grafana-foundation-sdk), with what Grafana needs to import it, and queries of metrics that exist: the verify textfile's
(metrics_textfile.py) and SGLang's (the names of the wheel's collector, as the lab's stand-in serves them)."""

from __future__ import annotations

import json
import os
import re
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "tools"))
sys.path.insert(0, os.path.join(REPO, "tests", "lab", "sglang_standin"))
import grafana_dashboard  # noqa: E402
from sglang.srt._kpro_lab import metrics as standin_metrics  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import metrics_textfile as mt  # noqa: E402

DS = {"type": "prometheus", "uid": "${datasource}"}


def shipped():
    with open(grafana_dashboard.OUT) as f:
        return f.read()


def panels(dash):
    return [p for p in dash["panels"] if p["type"] != "row"]


def test_the_shipped_file_is_the_generators_output():
    assert shipped() == grafana_dashboard.render(), "run: .venv/bin/python tests/tools/grafana_dashboard.py"


def test_what_grafana_needs_to_import_it():
    dash = json.loads(shipped())
    assert dash["uid"] == "kpro-gpu-serving" and dash["title"] and isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    # the Prometheus data source is chosen at import: a datasource variable every panel and target names
    variables = dict((v["name"], v) for v in dash["templating"]["list"])
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["host"]["datasource"] == DS
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    for p in panels(dash):
        assert p["datasource"] == DS and p["targets"], p["title"]
        assert p["type"] in ("stat", "table", "timeseries") and isinstance(p["options"], dict), p["title"]
        assert all(t["datasource"] == DS and t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        assert len(set(t["refId"] for t in p["targets"])) == len(p["targets"]), p["title"]
    # the grid: 24 columns, no two panels overlap
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = set((x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"]))
        assert not cells & mine, p["title"]
        cells |= mine


def queried(dash):
    names = set()
    for p in panels(dash):
        for t in p["targets"]:
            names |= set(re.findall(r"\b((?:sglang:|kpro_gpu_serving_|DCGM_FI_)[A-Za-z0-9_:]+)", t["expr"]))
    return names


def test_it_queries_metrics_that_exist_and_shows_each_asked_for():
    names = queried(json.loads(shipped()))
    verify = set(mt.PREFIX + n for n, _h in mt.GAUGES) | {mt.PREFIX + mt.FINDING[0]}
    sglang = set(n for n, _t, _h, _l in standin_metrics._SCHEDULER + standin_metrics._TOKENIZER)   # pylint: disable=protected-access
    sglang |= set(n + "_bucket" for n, _h, _b, _l in standin_metrics._HISTOGRAMS)                # pylint: disable=protected-access
    dcgm = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"}   # dcgm-exporter's etc/default-counters.csv
    assert names - verify - sglang - dcgm == set()
    # the panels: GPU memory and utilization, request rate, tokens/s, queue, known-answer status, drift findings
    assert {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "sglang:num_requests_total", "sglang:generation_tokens_total",
            "sglang:num_queue_reqs", "kpro_gpu_serving_known_answer_ok", "kpro_gpu_serving_verify_finding"} <= names
    # and every metric the verify run writes
    assert verify <= names


def test_the_findings_table_shows_host_check_phase_severity():
    dash = json.loads(shipped())
    table = [p for p in panels(dash) if p["type"] == "table"][0]
    assert table["targets"][0]["instant"] and table["targets"][0]["format"] == "table"
    organize = table["transformations"][0]
    assert organize["id"] == "organize" and sorted(organize["options"]["indexByName"], key=organize["options"]["indexByName"].get) == [
        "host", "check", "phase", "severity"]
