"""Issue 12 in the lab: the API key stays secret (no process argv, no file under /var/log of the node or CT 129), and a
crashed server comes back by itself (Restart=on-failure, NRestarts), without a playbook run.

The module's fixture converges the whole playbook once unless CT 129 already serves (test_bad_inputs_serve.py shares it).
"""

from __future__ import annotations

import os
import re
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


SERVE = ("--tags", "serve", "--skip-tags", "preflight")


def test_a_stopped_server_is_unresponsive_then_restarted_or_left_with_the_evidence(serving):
    """Issue 30 "A hung server": SIGSTOP on the MainPID (the kernel still accepts its connections). The converge's look names
    it unresponsive (the State line of /proc, how long) within a minute, never ready; with the restart off the run fails
    with that evidence and leaves the process, with it on (the default) the run restarts it and it serves again."""
    lab = serving
    before = unit_props(lab)
    assert before["ActiveState"] == "active" and int(before["MainPID"]) > 0, before
    ct(lab, "kill", "-STOP", before["MainPID"])
    try:
        t0 = time.time()
        r = play(*SERVE + ("-e", "sglang_server_restart_unresponsive=false"))
        took, out = time.time() - t0, " ".join(r.stdout.replace("\\n", " ").split())
        print("restart off: failed after %.0fs" % took)
        assert recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
        assert "unresponsive: GET http://127.0.0.1:30000/health: no answer within 5s, 3 times in a row" in out, out[-4000:]
        assert "main process %s: State: T (stopped)" % before["MainPID"] in out, out[-4000:]
        assert "not restarted: sglang_server_restart_unresponsive is false" in out
        print(re.search(r"unresponsive: GET .*?is false", out).group(0))
        over = float(re.search(r"3 times in a row over (\d+)s", out).group(1))
        assert over < 60, over
        # the rollout's rescue summary prints "ready in ? s": no time to ready, the server was never ready
        assert "NoneType" not in out and "Traceback" not in out and not re.search(r"ready in \d", out)
        assert unit_props(lab)["MainPID"] == before["MainPID"]

        t0 = time.time()
        r = play(*SERVE + ("-v",))
        took, out = time.time() - t0, " ".join(r.stdout.replace("\\n", " ").split())
        print("restart on: served again after %.0fs" % took)
        assert recap(r.stdout, "ct129")["failed"] == 0, out[-4000:]
        # -v: the converge's result (its look, YAML) and the restart of this run
        assert "phase: unresponsive" in out and "State: T (stopped)" in out, out[-4000:]
        assert re.search(r"TASK \[kpro.gpu_serving.sglang_server : Restart the unresponsive server[^\]]*\] \**\s*changed: \[ct129\]", out)
        assert "NoneType" not in out and "Traceback" not in out
        after = unit_props(lab)
        assert after["ActiveState"] == "active" and after["MainPID"] not in ("0", before["MainPID"]), after
        assert ask(lab)[:2] == ["200", "200"]
    finally:
        ct(lab, "kill", "-CONT", before["MainPID"], check=False)
