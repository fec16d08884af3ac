"""Issue 12 in the lab: the API key stays secret (no process argv, no file under /var/log of the node or CT 129), and a
crashed server comes back by itself (Restart=on-failure, NRestarts), without a playbook run.

The module's fixture converges the whole playbook once unless CT 129 already serves (test_bad_inputs_serve.py shares it).
"""

from __future__ import annotations

import os
import time

import pytest

from conftest import RUN, cmdlines, files_holding
from test_gpu_host_stage import play, recap

CT_UPPER = os.path.join(RUN, "ct", "129", "upper")
NODE_UPPER = os.path.join(RUN, "kpro5", "upper")
SECRETS = "/etc/kpro-gpu-serving/sglang-secrets.yaml"
# Run in CT 129: GET /health, then a completion with the key read from the secrets file (never in an argv).
ASK = r"""
import json, re, sys, urllib.request
key = re.search(r'api_key: (".*")', open("%s").read()).group(1)
key = json.loads(key)
def call(path, body=None):
    req = urllib.request.Request("http://127.0.0.1:30000" + path, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except Exception as e:
        return getattr(e, "code", None), None
h = call("/health")[0]
c = call("/v1/completions", {"model": "qwen3.6-27b", "prompt": "The capital city of France is", "max_tokens": 8, "temperature": 0})
print(h, c[0], (c[1] or {}).get("choices", [{}])[0].get("text", "").strip().replace(" ", "_")[:40])
""" % SECRETS


def ct(lab, *argv, check=True):
    return lab.exec("pct", "exec", "129", "--", *argv, check=check)


def ask(lab):
    """(health status, completion status, text) from inside CT 129."""
    out = ct(lab, "python3", "-c", ASK, check=False).stdout.split()
    return (out + [None, None, None])[:3] if out else (None, None, None)


def unit_props(lab):
    out = ct(lab, "systemctl", "show", "-p", "MainPID", "-p", "InvocationID", "-p", "NRestarts", "-p", "ActiveState",
             "sglang.service").stdout
    return dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)


def serving_now(lab):
    return ask(lab)[:2] == ["200", "200"]


@pytest.fixture(scope="module")
def serving(lab):
    if not serving_now(lab):
        t0 = time.time()
        out = play()
        assert recap(out.stdout, "ct129")["failed"] == 0, out.stdout[-4000:]
        print("converge: %.0fs" % (time.time() - t0))
    return lab


def api_key():
    with open(os.path.join(RUN, "sglang-api-key")) as f:
        return f.read().strip()


def test_api_key_in_no_argv_and_no_log(serving):
    lab, key = serving, api_key()
    assert key
    assert [pid for pid, argv in cmdlines() if key in argv] == []
    logs = [os.path.join(top, "var/log") for top in (CT_UPPER, NODE_UPPER)]
    assert files_holding(key, *logs) == []
    # the server got the key (it answers the authorised completion above) through --config, mode 0600
    assert "--config %s" % SECRETS in ct(lab, "systemctl", "cat", "sglang.service").stdout
    assert ct(lab, "stat", "-c", "%a", SECRETS).stdout.strip() == "600"
    log = ct(lab, "cat", "/var/log/sglang/sglang.log").stdout
    assert "api_key='<redacted>'" in log


def test_killed_server_comes_back_without_a_playbook_run(serving):
    lab = serving
    before = unit_props(lab)
    assert before["ActiveState"] == "active" and int(before["MainPID"]) > 0
    t0 = time.time()
    ct(lab, "kill", "-9", before["MainPID"])
    answered, after = None, {}
    while time.time() - t0 < 240:
        time.sleep(2)
        after = unit_props(lab)
        if after.get("InvocationID") != before["InvocationID"] and after.get("ActiveState") == "active":
            answered = ask(lab)
            if answered[:2] == ["200", "200"]:
                break
    took = time.time() - t0
    print("back and answering after %.0fs: %s" % (took, answered))
    assert answered and answered[:2] == ["200", "200"] and "Paris" in answered[2], (answered, after)
    assert int(after["NRestarts"]) == int(before.get("NRestarts") or 0) + 1
    assert after["MainPID"] != before["MainPID"]
