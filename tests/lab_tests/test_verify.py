"""Issue 33 in the lab: the read-only verify run (playbooks/verify.yml, gpu_verify) on the converged lab reports nothing and
changes nothing (changed=0, and both disks byte-identical but for its own result files and the logs of the requests it
made); then six drifts at once (a stranger holding GPU memory in CT 129, a truncated shard of its model, a server that
answers wrong after a restart, an Xid line in the node's kernel log, a kernel installed without headers, the kernel meta
package's hold gone) give exactly their six findings, each with its phase and remedy, in the JSON result and in the
node_exporter textfile; then the NVIDIA userspace in CT 129 bumped without the module gives version_mismatch (NVML
refuses, so the memory check says it could not look). One verify run per state (three in all): make test is near its
budget.

Runs in conftest.py's SERVING block and reuses its converge (the ``serving`` fixture).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, RUN
import labctl as labproc  # tests/lab/labctl.py (conftest puts tests/lab on the path): its PID records
from test_gpu_host_stage import disk_digest, recap
from test_gpu_p2p import drill
from test_serve_safety import ask, ct, serving  # noqa: F401  pylint: disable=unused-import

CT_UPPER = os.path.join(RUN, "ct", "129", "upper")
NODE_UPPER = os.path.join(RUN, "kpro5", "upper")
JSON = "var/lib/kpro-gpu-serving/verify.json"
PROM = "var/lib/prometheus/node-exporter/kpro_gpu_serving.prom"
MODEL_DIR = "/srv/models/Qwen3.6-27B"
VENV_PY = "/opt/sglang/venv/bin/python"
XID = "2026-12-05T10:00:00+00:00 kpro5 kernel: NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
# a process of the lab's "CUDA" (the stand-in's GPU accounting) that is not the server: 64 MiB on GPU 0 (what the
# server left free), until killed
# a kernel release installed without its headers (the lab's pve repository publishes it on demand), newer than any
# other test's; and the kernel meta package the gpu_host stage holds
BARE = {"pve8": "6.8.12-13-pve", "pve9": "6.17.13-5-pve"}[os.environ.get("KPGS_LAB_RELEASE") or "pve8"]
HELD = "proxmox-default-kernel"
# the container's NVML as an apt or unattended upgrade would leave it: libnvidia-ml.so.1 pointing at another version
LIBDIR = "/usr/lib/x86_64-linux-gnu"
BUMPED = "580.142.01"
# what a clean verify run may change on the disks: its own results, the logs of the requests it makes (the known
# answers, one timed request) and of the lab's fakes, and Ansible's remote temporary files (an earlier run's background
# gate removes its own when its job ends)
MAY_CHANGE = (JSON, PROM, "var/log/", "var/lib/kpro-lab/", "root/.ansible/tmp/")
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


def changed_files(before, after):
    """Paths added, removed or with other bytes between two disk_digest()s, less what a verify run may change."""
    paths = set(before) | set(after)
    return sorted(p for p in paths if before.get(p) != after.get(p) and not p.startswith(MAY_CHANGE))


def restart_answering_wrong(lab):
    """The server restarted with the stand-in's wrong-answer drill (sglang #22779: /health 200 after a restart, the
    answers wrong), once it serves again."""
    drill("wrong_answer_tp")
    ct(lab, "systemctl", "restart", "sglang.service")
    t0 = time.time()
    while ask(lab)[0] != "200":
        assert time.time() - t0 < 90, "the server did not come back after its restart"
        time.sleep(1)


def test_verify_reports_nothing_on_the_converged_lab_then_each_drift_its_finding(serving):
    lab, t_start = serving, time.time()
    before = (disk_digest(), disk_digest(CT_UPPER))
    r = verify()
    assert changed_files(before[0], disk_digest()) == [] and changed_files(before[1], disk_digest(CT_UPPER)) == []
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
    # the gpu_host stage held the kernel meta package (real dpkg and apt-mark in the node)
    assert HELD in lab.sh("apt-mark showhold").stdout.split()

    shard = ct(lab, "sh", "-c", "ls %s/*.safetensors | head -1" % MODEL_DIR).stdout.strip()
    ct(lab, "cp", "-p", shard, "/root/verify-shard.bak")
    size = int(ct(lab, "stat", "-c", "%s", shard).stdout)
    had_kern_log = lab.sh("test -e /var/log/kern.log", check=False).returncode == 0
    stranger = None
    lib = ct(lab, "readlink", "%s/libnvidia-ml.so.1" % LIBDIR).stdout.strip()
    try:
        restart_answering_wrong(lab)
        ct(lab, "truncate", "-s", str(size - 1), shard)
        # a kernel installed without its headers (no module for the next boot), and the hold gone
        assert lab.labctl("publish-kernel", BARE, "--no-headers").returncode == 0
        lab.sh("apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
               "proxmox-kernel-%s >/dev/null 2>&1 && apt-mark unhold %s" % (BARE, HELD))
        lab.sh("echo %s >> /var/log/kern.log" % subprocess.list2cmdline([XID]))
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
        assert [(f["check"], f["phase"], f["severity"]) for f in node["findings"]] == [
            ("health", "gpu_xid_error", "error"), ("kernels", "next_boot_module_missing", "error"),
            ("packages", "deployment_drift", "warning")], node["findings"]
        assert node["findings"][0]["evidence"] == ["Xid 79 on 0000:17:00: pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]
        assert node["findings"][1]["evidence"] == ["kernel %s (next boot) has no nvidia module and no headers: proxmox-headers-%s is "
                                                   "not installed, so DKMS cannot build it" % (BARE, BARE)]
        assert "apt-get install proxmox-headers-%s" % BARE in node["findings"][1]["remedy"]
        assert node["findings"][2]["evidence"] == ["%s: dpkg selection install, not hold" % HELD]
        assert metric_findings(node_fams) == [("health", "gpu_xid_error"), ("kernels", "next_boot_module_missing"),
                                              ("packages", "deployment_drift")]
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
        # the container's NVIDIA userspace bumped without the module (an apt upgrade): NVML refuses, as the real one does
        # (NVML_ERROR_LIB_RM_VERSION_MISMATCH), so the memory check says it could not look
        ct(lab, "sh", "-c", "cd %s && cp -p %s libnvidia-ml.so.%s && ln -sfn libnvidia-ml.so.%s libnvidia-ml.so.1" % (
            LIBDIR, lib, BUMPED, BUMPED))
        r = verify("--limit", "ct129")
        data, fams = result(CT_UPPER)
        assert recap(r.stdout, "ct129")["failed"] == 1 and recap(r.stdout, "ct129")["changed"] == 0, r.stdout[-3000:]
        assert (data["findings"][0]["check"], data["findings"][0]["phase"]) == ("driver", "version_mismatch"), data["findings"]
        assert "userspace: libnvidia-ml %s" % BUMPED in data["findings"][0]["evidence"], data["findings"][0]
        assert ("memory", "nvml_unavailable", "warning") in [(f["check"], f["phase"], f["severity"]) for f in data["findings"]]
        assert ("driver", "version_mismatch") in metric_findings(fams)
    finally:
        if stranger:
            ct(lab, "kill", stranger, check=False)
            ct(lab, VENV_PY, "-m", "sglang.srt._kpro_lab.gpustate", "reap", check=False)
        drill(None)
        ct(lab, "sh", "-c", "cd %s && ln -sfn %s libnvidia-ml.so.1 && rm -f libnvidia-ml.so.%s" % (LIBDIR, lib, BUMPED), check=False)
        ct(lab, "cp", "-p", "/root/verify-shard.bak", shard, check=False)
        ct(lab, "rm", "-f", "/root/verify-shard.bak", check=False)
        lab.sh("sed -i '/NVRM: Xid/d' /var/log/kern.log" if had_kern_log else "rm -f /var/log/kern.log", check=False)
        # the kernel first, while the drill's unhold holds (a held meta package would stop its removal), then the hold back
        lab.sh("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q proxmox-kernel-%s >/dev/null 2>&1; apt-mark hold %s"
               % (BARE, HELD), check=False)
        lab.labctl("unpublish-kernel", BARE, check=False)
    print("test_verify wall time: %.0fs" % (time.time() - t_start))


# Issue 33's last point: a real Prometheus (Debian's prometheus and prometheus-node-exporter, make setup's .debian-tools)
# scrapes the verify textfiles through node_exporter's textfile collector and SGLang's /metrics, and has the drift.
PROM_DIR = os.path.join(RUN, "prometheus")
PROM_ADDR = "10.213.5.1:18610"
# node_exporter in kpro5's network namespace (CT 129 shares it), one per textfile directory: kpro5's and CT 129's, their
# disks seen from here; no collector but the textfile one
EXPORTERS = (("kpro5", "10.213.5.2:18611", NODE_UPPER), ("ct129", "10.213.5.2:18612", CT_UPPER))
PROM_YML = """global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: node
    static_configs:
      - targets: [%s]
  - job_name: sglang
    metrics_path: /metrics
    static_configs:
      - targets: ['10.213.5.2:30000']
""" % ", ".join("'%s'" % addr for _h, addr, _u in EXPORTERS)


def start(role, argv):
    """A process of this test, recorded by PID under .run/pids/ as labctl records its own: a reset ends it if we cannot."""
    with open(os.path.join(PROM_DIR, role + ".log"), "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    labproc.record(role, proc.pid)
    return role, proc


def stop(role, proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    os.unlink(os.path.join(labproc.PIDS, role + ".pid"))


def query(expr):
    """[(labels, value)] of an instant query, None while Prometheus does not answer yet."""
    try:
        with urllib.request.urlopen("http://%s/api/v1/query?%s" % (PROM_ADDR, urllib.parse.urlencode({"query": expr})), timeout=5) as r:
            data = json.load(r)
    except OSError:
        return None
    assert data["status"] == "success", data
    return [(s["metric"], float(s["value"][1])) for s in data["data"]["result"]]


def until(expr, ok, timeout=30):
    t0, got = time.time(), None
    while not (got is not None and ok(got)):
        assert time.time() - t0 < timeout, (expr, got)
        time.sleep(0.5)
        got = query(expr)
    return got


def value(got):
    return got[0][1] if got else 0.0


def test_prometheus_scrapes_the_verify_textfiles_and_sglang_and_sees_the_drift(serving):
    lab, t_start = serving, time.time()
    shutil.rmtree(PROM_DIR, ignore_errors=True)   # an earlier run's samples would still answer for 5 minutes
    os.makedirs(PROM_DIR)
    with open(os.path.join(PROM_DIR, "prometheus.yml"), "w") as f:
        f.write(PROM_YML)
    shard = ct(lab, "sh", "-c", "ls %s/*.safetensors | head -1" % MODEL_DIR).stdout.strip()
    ct(lab, "cp", "-p", shard, "/root/verify-shard.bak")
    procs, picture = [], os.environ.get("KPGS_PROMETHEUS_SCREENSHOT")   # the README's picture (docs/verify.md)
    hold = 20 if picture else 0   # for the picture, each state lasts long enough to be seen in the graph
    try:
        for host, addr, upper in EXPORTERS:
            procs.append(start("node-exporter-" + host, [
                "ip", "netns", "exec", "kpgs-kpro5", "/usr/bin/prometheus-node-exporter", "--web.listen-address=" + addr,
                "--collector.disable-defaults", "--collector.textfile",
                "--collector.textfile.directory=" + os.path.join(upper, os.path.dirname(PROM))]))
        procs.append(start("prometheus", [
            "/usr/bin/prometheus", "--config.file=" + os.path.join(PROM_DIR, "prometheus.yml"), "--web.listen-address=" + PROM_ADDR,
            "--storage.tsdb.path=" + os.path.join(PROM_DIR, "data")]))
        until("up", lambda got: sorted(m["job"] for m, v in got if v == 1) == ["node", "node", "sglang"])
        # the PIDs recorded are the exporters' own (ip netns exec execs them, it does not fork)
        assert [open("/proc/%d/comm" % p.pid).read().strip() for _r, p in procs] == ["prometheus-node"] * 2 + ["prometheus"]
        served = value(query('sglang:num_requests_total{job="sglang"}'))

        ct(lab, "truncate", "-s", str(int(ct(lab, "stat", "-c", "%s", shard).stdout) - 1), shard)
        t_drill = time.time()
        r = verify()
        assert recap(r.stdout, "ct129")["failed"] == 1 and recap(r.stdout, "kpro5")["failed"] == 0, r.stdout[-4000:]
        # this run's results (timestamps after the drill, not an earlier run's file): the drift in CT 129, kpro5 clean
        fresh = until("kpro_gpu_serving_verify_timestamp_seconds", lambda got: len(got) == 2 and min(v for _m, v in got) >= t_drill - 1)
        assert sorted(m["host"] for m, _v in fresh) == ["ct129", "kpro5"]
        got = until('kpro_gpu_serving_verify_finding{phase="model_files_changed"}', lambda got: value(got) == 1)
        assert [(m["host"], m["check"], m["severity"], m["job"]) for m, _v in got] == [("ct129", "model", "error", "node")]
        assert sorted((m["host"], v) for m, v in query("kpro_gpu_serving_verify_ok")) == [("ct129", 0.0), ("kpro5", 1.0)]
        # SGLang's own counter, scraped from its /metrics with no key: the verify's requests on it
        got = until('sglang:num_requests_total{job="sglang"}', lambda got: value(got) > served)
        assert got[0][0]["model_name"] == "qwen3.6-27b", got
        time.sleep(hold)

        ct(lab, "cp", "-p", "/root/verify-shard.bak", shard)
        t_fixed = time.time()
        r = verify()
        assert recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-4000:]
        until('kpro_gpu_serving_verify_ok{host="ct129"}', lambda got: value(got) == 1)
        assert query('kpro_gpu_serving_verify_timestamp_seconds{host="ct129"}')[0][1] >= t_fixed - 1
        assert query('kpro_gpu_serving_verify_finding{host="ct129"}') == []
        if picture:
            time.sleep(hold)
            subprocess.run([sys.executable, os.path.join(REPO, "tests", "tools", "prometheus_screenshot.py"), "http://" + PROM_ADDR,
                            picture, "--range", str(int(time.time() - t_drill) + 10)], check=True)
    finally:
        for role, proc in procs:
            stop(role, proc)
        ct(lab, "cp", "-p", "/root/verify-shard.bak", shard, check=False)
        ct(lab, "rm", "-f", "/root/verify-shard.bak", check=False)
    print("test_prometheus wall time: %.0fs" % (time.time() - t_start))
