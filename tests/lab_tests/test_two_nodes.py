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
   rank 0's gate diagnoses peer_missing;
f. the model from the peer (-e @inventories/lab-two-nodes/model-from-peer.yml, issue 32): CT 129's model removed, the
   model stage copies it from CT 131 (ssh to kpro7, pct exec 131), the hub sees only metadata; a shard on the peer with
   the same size and other bytes comes from the hub alone; the peer's link cut mid-copy fails the run, keeps what
   arrived, and the re-run fetches only the rest from the peer.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
import re
import subprocess
import time

import pytest

from conftest import REPO, labctl, lab_is_up
from test_gpu_host_stage import ANSIBLE_PLAYBOOK, PLAYBOOK, recap

INV = os.path.join(REPO, "inventories", "lab-two-nodes", "hosts.yml")
TWO_NODE_SERVER = os.path.join(REPO, "inventories", "lab-two-nodes", "two-node-server.yml")
FROM_PEER = os.path.join(REPO, "inventories", "lab-two-nodes", "model-from-peer.yml")
MODEL = "/srv/models/Qwen3.6-27B"
HUB = "http://10.213.5.1:18602"
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
    hub_files(clear=True)
    # the containers copy the model from each other before the hub (issue 32): the first unit's peer has nothing yet
    runs = {"converge": play("-e", "kpro_rollout_serial=1", "-e", "@" + FROM_PEER)}
    runs["converge_hub_files"] = hub_files(sent=True)
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
    # one host downloaded from the hub (the first; its peer had nothing yet), the second copied from the first
    flat = " ".join(out.split())
    assert re.search(r"bytes by source: peer:root@10\.213\.5\.2:129:/srv/models/Qwen3\.6-27B=\d+[;\s'\"]", flat), out[-6000:]
    assert re.search(r"bytes by source: hub=\d+[;\s'\"]", flat), out[-6000:]
    names = [p.split("?")[0].rsplit("/", 1)[-1] for p in two_nodes["converge_hub_files"]]
    assert names and len(names) == len(set(names)), names  # each file's bytes sent once: to one host


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


def hub_files(clear=False, sent=False):
    """The hub's file requests (HEAD or GET of /resolve/, the CDN's) since the last clear, as their paths; ``sent``:
    only those that sent file bytes."""
    with urllib.request.urlopen(HUB + "/_log" + ("?clear=true" if clear else ""), timeout=10) as r:
        log = json.loads(r.read().decode())
    return sorted(e["path"] for e in log if ("/resolve/" in e["path"] or "/_cdn/" in e["path"] or e.get("svc") == "cdn")
                  and (e["bytes"] or not sent))


def model_result(out):
    """hf_model's bytes per source, from the background download's result (the wait task's JSON, the last one of a -v
    run: the check-mode probe before it reports none)."""
    found = re.findall(r'"bytes_by_source": (\{[^}]*\})', out)
    assert found, out[-4000:]
    return json.loads(found[-1])


def model_stage(*extra, wait=True):
    """The model stage alone on CT 129 with the peer before the hub; results as JSON lines (-v) for the assertions."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    argv = [ANSIBLE_PLAYBOOK, "-i", INV, PLAYBOOK, "--tags", "model", "--skip-tags", "preflight", "--limit", "kpro5,ct129",
            "-v", "-e", "@" + FROM_PEER] + list(extra)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    if not wait:
        return proc
    t0 = time.time()
    out = proc.communicate()[0]
    print("model stage %s: rc %d, %.0fs" % (" ".join(extra), proc.returncode, time.time() - t0))
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def shard_of_peer(name, data=None):
    """Read (or write) a shard of CT 131's model, from kpro7's node with pct exec."""
    path = os.path.join(MODEL, name)
    if data is None:
        r = labctl("--node", "kpro7", "exec", "--", "pct", "exec", "131", "--", "base64", "-w0", path)
        return base64.b64decode(r.stdout)
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "python"), os.path.join(REPO, "tests", "lab", "labctl.py"),
                        "--node", "kpro7", "exec", "--", "pct", "exec", "131", "--", "dd", "of=" + path, "conv=notrunc",
                        "status=none"], input=data, check=True)
    return r


def test_model_from_the_peer_hub_sees_only_metadata(two_nodes):
    files = [f for f in in_ct("kpro7", "ls", MODEL).stdout.split() if f.endswith(".safetensors")]
    total = int(in_ct("kpro7", "sh", "-c", "cat %s/*.safetensors | wc -c" % MODEL).stdout.split()[0])
    assert in_ct("kpro5", "rm", "-rf", MODEL).returncode == 0
    hub_files(clear=True)
    r = model_stage()
    assert r.returncode == 0, r.stdout[-4000:]
    by_source = model_result(r.stdout)
    assert hub_files(sent=True) == [], "the hub served file bytes"  # its listing and a HEAD at most: metadata
    assert set(by_source) == {"peer:root@10.213.5.3:131:%s" % MODEL} and sum(by_source.values()) >= total, by_source
    # every file verified against the hub's listing: the model is complete on the next check, offline
    again = model_stage()
    assert recap(again.stdout, "ct129")["changed"] == 0 and hub_files(sent=True) == [], again.stdout[-3000:]
    two_nodes["shards"] = sorted(files)


def test_a_corrupt_peer_file_comes_from_the_hub_alone(two_nodes):
    name = two_nodes["shards"][0]
    good = shard_of_peer(name)
    bad = bytearray(good)
    bad[-4096:] = bytes(b ^ 0xFF for b in bad[-4096:])  # the same size, other bytes (past the header)
    shard_of_peer(name, bytes(bad))
    try:
        assert in_ct("kpro5", "rm", "-f", os.path.join(MODEL, name)).returncode == 0
        hub_files(clear=True)
        r = model_stage()
    finally:
        shard_of_peer(name, good)
    assert r.returncode == 0, r.stdout[-4000:]
    sent = hub_files(sent=True)
    assert len(sent) == 1 and (sent[0].endswith("/" + name) or "/_cdn/" in sent[0]), sent  # that file alone, once
    assert "differs from the hub" in r.stdout or "sha256 mismatch" in r.stdout, r.stdout[-4000:]
    assert sum(model_result(r.stdout).values()) >= len(good)


def test_a_peer_cut_mid_copy_keeps_what_arrived_and_the_rerun_fetches_the_rest(two_nodes):
    assert in_ct("kpro5", "rm", "-rf", MODEL).returncode == 0
    only_peer = '{"model_sources": [{"type": "peer", "group": "gpu_containers"}]}'
    proc = model_stage("-e", only_peer, "-e", "model_peer_bwlimit=1000000", wait=False)
    progress = os.path.join(REPO, "tests", "lab", ".run", "ct", "129", "upper", MODEL.lstrip("/"), ".cache",
                            "kpro-progress.json")
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # some bytes are in: cut the peer's link (kpro7's own veth, in its netns)
            try:
                with open(progress) as f:
                    if json.load(f).get("bytes_done", 0) >= 3000000:
                        break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        subprocess.run(["ip", "netns", "exec", "kpgs-kpro7", "ip", "link", "set", "kpgs7n", "down"], check=True)
        out = proc.communicate(timeout=240)[0]
    finally:
        subprocess.run(["ip", "netns", "exec", "kpgs-kpro7", "ip", "link", "set", "kpgs7n", "up"], check=False)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "download_failed" in out, out[-4000:]
    # what arrived is kept: the files done (and any partial file) stay; the re-run fetches only the rest. (SSH's channel
    # window lets the peer send ahead of the bwlimit's pace, so a file in flight may still complete from what was
    # buffered; a partial file's resume from its offset is in tests/unit/plugins/modules/test_hf_model_sources.py.)
    kept = in_ct("kpro5", "sh", "-c", "ls %s/*.safetensors 2>/dev/null | wc -l" % MODEL).stdout.strip()
    assert 0 < int(kept) < len(two_nodes["shards"]), out[-3000:]
    r = model_stage("-e", only_peer)
    assert r.returncode == 0, r.stdout[-4000:]
    total = int(re.findall(r'"bytes_total": (\d+)', r.stdout)[-1])
    assert 0 < sum(model_result(r.stdout).values()) < total, r.stdout[-3000:]


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
