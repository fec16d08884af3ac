"""Issue 18 in the lab: two simulated nodes (labctl.py up --nodes 2: kpro5 with CT 129, kpro7 with CT 131) and the
inventory inventories/lab-two-nodes, one converge shared by the file (module fixture), then re-runs of it:

a. a rolling run (kpro_rollout_serial=1) converges both units, the first gated before the second is touched;
b. the second unit fails (its container is told to expect 3 GPUs, it has 2; --tags gpu_container, the stage that
   checks it): the first keeps serving, the play stops with the second's diagnosis, rc != 0;
c. the run again without that: changed=0 on every host;
d. one model over both nodes (-e @inventories/lab-two-nodes/two-node-server.yml: TP 4, nnodes 2, node ranks 0/1,
   dist_init_addr on CT 129's address), --tags serve: starts and passes the gate on both (NVML on both nodes, the
   endpoint on rank 0);
e. rank 1 never arrives (the stand-in's drill init_failed_before_gpu on kpro7: its scheduler dies before it joins):
   rank 0's gate diagnoses peer_missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from conftest import REPO, labctl, lab_is_up
from test_gpu_host_stage import ANSIBLE_PLAYBOOK, PLAYBOOK, recap

INV = os.path.join(REPO, "inventories", "lab-two-nodes", "hosts.yml")
TWO_NODE_SERVER = os.path.join(REPO, "inventories", "lab-two-nodes", "two-node-server.yml")
HOSTS = ("kpro5", "ct129", "kpro7", "ct131")
CT = {"kpro5": "129", "kpro7": "131"}
GATE = "Gate the launch until it really serves"
SECRETS = "/etc/kpro-gpu-serving/sglang-secrets.yaml"
# Run in a container: GET /health with the server's key (read from its secrets file, never in an argv).
HEALTH = r"""
import json, re, urllib.request
key = json.loads(re.search(r'api_key: (".*")', open("%s").read()).group(1))
req = urllib.request.Request("http://127.0.0.1:30000/health", headers={"Authorization": "Bearer " + key})
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        print(r.status)
except Exception as e:
    print(getattr(e, "code", None))
""" % SECRETS


def play(*args):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    t0 = time.time()
    r = subprocess.run([ANSIBLE_PLAYBOOK, "-i", INV, PLAYBOOK] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=env, check=False, cwd=REPO)
    r.seconds = time.time() - t0
    print("ansible-playbook %s: rc %d, %.0fs" % (" ".join(args), r.returncode, r.seconds))
    return r


def in_ct(node, *argv):
    return labctl("--node", node, "exec", "--", "pct", "exec", CT[node], "--", *argv, check=False)


def health(node):
    return in_ct(node, "python3", "-c", HEALTH).stdout.strip()


def node_state(node):
    root = labctl("--node", node, "root").stdout.strip()
    with open(os.path.join(root, "var/lib/kpro-lab/state.json")) as f:
        return json.load(f)


def drill(node, text):
    """The SGLang stand-in's drill file on ``node`` (its container sees the node's /var/lib/kpro-lab); None removes it."""
    path = os.path.join(labctl("--node", node, "root").stdout.strip(), "var/lib/kpro-lab/sglang-drill")
    if text is None:
        if os.path.exists(path):
            os.unlink(path)
    else:
        with open(path, "w") as f:
            f.write(text + "\n")


def result_line(out, task, host):
    """The offset in ``out`` of ``host``'s result line of the first run of task ``task`` after offset 0."""
    head = out.index("TASK [kpro.gpu_serving.sglang_server : %s]" % task) if task == GATE else out.index(task)
    m = re.compile(r"^(ok|changed|failed|fatal): \[%s\]" % re.escape(host), re.M).search(out, head)
    assert m, out[head:head + 3000]
    return m.start()


def gate_results(out, host):
    """Offsets of ``host``'s results of the gate task, in output order."""
    found, pos = [], 0
    header = "TASK [kpro.gpu_serving.sglang_server : %s]" % GATE
    while True:
        i = out.find(header, pos)
        if i < 0:
            return found
        nxt = out.find("\nTASK [", i + 1)
        block = out[i:nxt if nxt > 0 else len(out)]
        m = re.search(r"^(ok|changed): \[%s\]" % re.escape(host), block, re.M)
        if m:
            found.append(i + m.start())
        pos = i + 1


@pytest.fixture(scope="module")
def two_nodes():
    if os.geteuid() != 0:
        pytest.skip("lab tests need root")
    was_up = lab_is_up()
    t0 = time.time()
    r = labctl("reset", "--nodes", "2", check=False)
    assert r.returncode == 0, r.stderr + r.stdout
    print("up --nodes 2: %.0fs" % (time.time() - t0))
    runs = {"converge": play("-e", "kpro_rollout_serial=1")}
    yield runs
    labctl("down")  # both nodes, and the drill files with their disks
    if was_up:  # leave the lab as found: the one-node lab up
        labctl("up")


def test_rolling_run_converges_both_units_each_gated_before_the_next(two_nodes):
    out = two_nodes["converge"].stdout
    assert two_nodes["converge"].returncode == 0, out[-4000:]
    for host in HOSTS:
        assert recap(out, host)["failed"] == 0, host
    rollout = out.index("PLAY [Stages 1-7")
    first_gate, second_gate = gate_results(out, "ct129"), gate_results(out, "ct131")
    assert first_gate and second_gate, out[-4000:]
    second_unit_first = re.compile(r"^(ok|changed|skipping): \[kpro7\]", re.M).search(out, rollout)
    assert second_unit_first, out[rollout:rollout + 3000]
    # the first unit's gate finished before the second host's first stage task, the second's gate after it
    assert rollout < first_gate[0] < second_unit_first.start() < second_gate[0]
    # two batches: the rollout play ran twice, one unit each
    assert out.count("PLAY [Stages 1-7") == 2
    assert health("kpro5") == "200" and health("kpro7") == "200"
    for node in ("kpro5", "kpro7"):  # each node's server holds its own GPUs' memory
        assert all(g["processes"] for g in node_state(node)["gpus"]), node


def test_second_unit_fails_first_keeps_serving(two_nodes):
    before = in_ct("kpro5", "systemctl", "show", "-p", "MainPID", "sglang.service").stdout.strip()
    # the stage the drill fails in (and the rollout's own tasks, tag always); the preflight checks ran in the converge
    r = play("--tags", "gpu_container", "--skip-tags", "preflight",
             "-e", '{"gpu_container_expected_gpu_count": "{{ 3 if inventory_hostname == \'ct131\' else 2 }}"}')
    two_nodes["drill"] = r
    out = r.stdout
    assert r.returncode != 0, out[-3000:]
    assert recap(out, "ct131")["failed"] >= 1 and recap(out, "ct129")["failed"] == 0 and recap(out, "kpro5")["failed"] == 0
    # the play stops with the second unit's diagnosis: its host, the failed task and the phase
    flat = " ".join(out.replace("''", "'").split())  # YAML's line folding and quote doubling undone
    assert re.search(r"ct131 failed at [^\n]+: gpu_mismatch: NVML sees 2 GPU", out), out[-3000:]
    assert "'kpro5 + ct129: serving'" in flat and re.search(r"kpro7 \+ ct131: FAILED on ct131 at \"[^\"]+\" \(gpu_mismatch\)", flat), out[-3000:]
    # the first unit was not restarted and still serves
    assert in_ct("kpro5", "systemctl", "show", "-p", "MainPID", "sglang.service").stdout.strip() == before
    assert health("kpro5") == "200"


def test_rerun_after_restoring_changes_nothing(two_nodes):
    r = play("--skip-tags", "preflight")
    assert r.returncode == 0, r.stdout[-4000:]
    for host in HOSTS:
        assert recap(r.stdout, host)["changed"] == 0, (host, r.stdout[-3000:])
    assert health("kpro5") == "200" and health("kpro7") == "200"


def test_one_model_over_two_nodes(two_nodes):
    r = play("--tags", "serve", "-e", "@" + TWO_NODE_SERVER)
    two_nodes["multi"] = r
    out = r.stdout
    assert r.returncode == 0, out[-4000:]
    for host in HOSTS:
        assert recap(out, host)["failed"] == 0, host
    assert gate_results(out, "ct129") and gate_results(out, "ct131")
    # one batch: both nodes of the server together
    assert out.count("PLAY [Stages 1-7") == 1
    for node, rank in (("kpro5", "0"), ("kpro7", "1")):
        argv = in_ct(node, "grep", "^ExecStart=", "/etc/systemd/system/sglang.service").stdout
        assert "--nnodes 2" in argv and "--node-rank %s" % rank in argv and "--dist-init-addr 10.213.5.2:20000" in argv, argv
        # NVML on both nodes: the server's processes hold memory on every GPU of each node
        assert all(g["processes"] for g in node_state(node)["gpus"]), node
    # the endpoint on rank 0
    assert health("kpro5") == "200"


def test_missing_peer_is_diagnosed_on_rank_0(two_nodes):
    drill("kpro7", "init_failed_before_gpu")
    try:
        # both nodes restarted (the options did not change); no rollback (it would restore the same deployment)
        r = play("--tags", "serve", "-e", "@" + TWO_NODE_SERVER, "-e", "sglang_server_force_restart=true",
                 "-e", "sglang_server_rollback=false")
    finally:
        drill("kpro7", None)
    out = r.stdout
    assert r.returncode != 0, out[-3000:]
    assert recap(out, "ct129")["failed"] >= 1
    flat = " ".join(out.replace("''", "'").split())
    # rank 0 waited at the init address for rank 1 and says so; rank 1 has its own diagnosis
    assert "ct129 failed at %s: peer_missing" % GATE in flat, out[-6000:]
    assert re.search(r"Timed out after \d+ seconds waiting for clients\. 2/4 clients joined", flat), out[-6000:]
    assert "ct131 failed at %s: init_failed_before_gpu" % GATE in flat, out[-6000:]
