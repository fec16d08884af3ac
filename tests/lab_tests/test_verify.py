"""Issue 33 in the lab: the read-only verify run (playbooks/verify.yml, gpu_verify) on the converged lab reports nothing and
changes nothing; then four drifts at once (a stranger holding GPU memory in CT 129, a truncated shard of its model, an Xid
line in the node's kernel log, a server answering wrong) give exactly their four findings, each with its phase and remedy,
in the JSON result and in the node_exporter textfile. One verify run per state (two in all): make test is near its budget.

Runs after test_serve_safety.py (conftest.py AFTER_SERVE_SAFETY) and reuses its converge (the ``serving`` fixture).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, RUN
from test_gpu_host_stage import recap
from test_gpu_p2p import drill
from test_serve_safety import ct, serving  # noqa: F401  pylint: disable=unused-import

CT_UPPER = os.path.join(RUN, "ct", "129", "upper")
NODE_UPPER = os.path.join(RUN, "kpro5", "upper")
JSON = "var/lib/kpro-gpu-serving/verify.json"
PROM = "var/lib/prometheus/node-exporter/kpro_gpu_serving.prom"
MODEL_DIR = "/srv/models/Qwen3.6-27B"
VENV_PY = "/opt/sglang/venv/bin/python"
XID = "2026-12-05T10:00:00+00:00 kpro5 kernel: NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
# a process of the lab's "CUDA" (the stand-in's GPU accounting) that is not the server: 64 MiB on GPU 0 (what the
# server left free), until killed
STRANGER = ("from sglang.srt._kpro_lab import gpustate; gpustate.set_usage(0, 64, 'python3'); import time; time.sleep(900)")


def verify(*args):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    t0 = time.time()
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", os.path.join(REPO, "inventories", "lab"),
                        os.path.join(REPO, "playbooks", "verify.yml")] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False, cwd=REPO)
    print("verify run: %.0fs" % (time.time() - t0))
    return r


def result(upper):
    with open(os.path.join(upper, JSON)) as f:
        data = json.load(f)
    with open(os.path.join(upper, PROM)) as f:
        fams = dict((m.name, m) for m in text_string_to_metric_families(f.read()))
    return data, fams


def metric_findings(fams):
    fam = fams.get("kpro_gpu_serving_verify_finding")
    return sorted((s.labels["check"], s.labels["phase"]) for s in fam.samples) if fam else []


def test_verify_reports_nothing_on_the_converged_lab_then_each_drift_its_finding(serving):
    lab, t_start = serving, time.time()
    r = verify()
    assert recap(r.stdout, "kpro5") == dict(recap(r.stdout, "kpro5"), changed=0, failed=0), r.stdout[-4000:]
    assert recap(r.stdout, "ct129") == dict(recap(r.stdout, "ct129"), changed=0, failed=0), r.stdout[-4000:]
    for upper, host in ((NODE_UPPER, "kpro5"), (CT_UPPER, "ct129")):
        data, fams = result(upper)
        assert data["ok"] and data["findings"] == [], data["findings"]
        assert fams["kpro_gpu_serving_verify_ok"].samples[0].labels == {"host": host}
        assert fams["kpro_gpu_serving_verify_ok"].samples[0].value == 1 and metric_findings(fams) == []
    ct_data, ct_fams = result(CT_UPPER)
    assert ct_data["known_answer_ok"] is True and ct_fams["kpro_gpu_serving_known_answer_ok"].samples[0].value == 1
    assert 0 < ct_fams["kpro_gpu_serving_request_latency_seconds"].samples[0].value < 10

    shard = ct(lab, "sh", "-c", "ls %s/*.safetensors | head -1" % MODEL_DIR).stdout.strip()
    ct(lab, "cp", "-p", shard, "/root/verify-shard.bak")
    size = int(ct(lab, "stat", "-c", "%s", shard).stdout)
    had_kern_log = lab.sh("test -e /var/log/kern.log", check=False).returncode == 0
    stranger = None
    try:
        ct(lab, "truncate", "-s", str(size - 1), shard)
        lab.sh("echo %s >> /var/log/kern.log" % subprocess.list2cmdline([XID]))
        drill("wrong_answer_tp")
        stranger = ct(lab, "sh", "-c", "setsid %s -c \"%s\" >/dev/null 2>/root/stranger.err </dev/null & echo $!"
                      % (VENV_PY, STRANGER)).stdout.strip()
        t0 = time.time()
        while "(%s, 'python3', 64)" % stranger not in ct(lab, VENV_PY, "-m", "sglang.srt._kpro_lab.gpustate", "show").stdout:
            assert time.time() - t0 < 30, ct(lab, "cat", "/root/stranger.err", check=False).stdout
            time.sleep(1)
        r = verify()
        out = " ".join(r.stdout.replace("\\n", " ").split())
        assert recap(r.stdout, "kpro5")["failed"] == 1 and recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
        assert recap(r.stdout, "kpro5")["changed"] == 0 and recap(r.stdout, "ct129")["changed"] == 0
        node, node_fams = result(NODE_UPPER)
        assert [(f["check"], f["phase"]) for f in node["findings"]] == [("health", "gpu_xid_error")], node["findings"]
        assert node["findings"][0]["evidence"] == ["Xid 79 on 0000:17:00: pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]
        assert metric_findings(node_fams) == [("health", "gpu_xid_error")]
        data, fams = result(CT_UPPER)
        found = [(f["check"], f["phase"]) for f in data["findings"]]
        assert found == [("memory", "gpu_memory_held"), ("model", "model_files_changed"), ("live", "wrong_answer")], \
            json.dumps(dict((k, data.get(k)) for k in ("findings", "nvml", "gpu_processes")))[:6000]
        assert all(f["remedy"] and f["severity"] == "error" for f in data["findings"])
        assert "PID %s python holds 64 MiB on GPU 0" % stranger in " ".join(data["findings"][0]["evidence"]), data["findings"][0]
        assert "%s: %d bytes, the revision's %d bytes" % (os.path.relpath(shard, MODEL_DIR), size - 1, size) in data["findings"][1]["evidence"]
        assert metric_findings(fams) == sorted(found)
        assert fams["kpro_gpu_serving_verify_ok"].samples[0].value == 0 and fams["kpro_gpu_serving_known_answer_ok"].samples[0].value == 0
        # the failed task names the first error's phase
        assert "gpu_memory_held: verify found 3 finding(s), the first error in check memory" in out, out[-4000:]
    finally:
        if stranger:
            ct(lab, "kill", stranger, check=False)
            ct(lab, VENV_PY, "-m", "sglang.srt._kpro_lab.gpustate", "reap", check=False)
        drill(None)
        ct(lab, "cp", "-p", "/root/verify-shard.bak", shard, check=False)
        ct(lab, "rm", "-f", "/root/verify-shard.bak", check=False)
        lab.sh("sed -i '/NVRM: Xid/d' /var/log/kern.log" if had_kern_log else "rm -f /var/log/kern.log", check=False)
    print("test_verify wall time: %.0fs" % (time.time() - t_start))
