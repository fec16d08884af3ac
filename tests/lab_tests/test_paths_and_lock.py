"""Issue 30: paths stay where they belong, one run at a time, and inputs refused at the earliest point.

- a GPU id that is a NIC's (8086:1533) or no function's (10de:9999) is refused by the host stage's first look, the node
  unchanged;
- a unit name that is not a plain systemd name, a model directory through a symlink into /etc or with '..': refused with
  phase and remedy, nothing written outside the model directory (the container's /etc byte for byte the same), the
  server's MainPID unchanged;
- a wrong Hugging Face token is refused by the preflight (the hub's whoami), before any model request;
- a second run against the container waits, then fails naming the first (controller, PID, start); a run whose
  controller died leaves a lock the next run of that controller takes over; each run has its own token file.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket

import pytest

from test_container_model_stage import MODEL, ct, hub_log
from test_gpu_host_stage import UPPER, disk_digest, play, recap
from test_model_download_safety import CT_DISK, ctl, kill_controller, start_play, wait_for
from test_serve_safety import serving, unit_props  # noqa: F401  pylint: disable=unused-import

LOCK = "/run/lock/kpro-gpu-serving-129.lock"
SHARD = "model-00003-of-00015.safetensors"


def flat(out):
    return " ".join(out.replace("''", "'").replace("\\n", " ").split())


def tree(top):
    out = {}
    for d, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(d, name)
            out[os.path.relpath(p, top)] = os.readlink(p) if os.path.islink(p) else (
                hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else "?")
    return out


def lock_holder(lab):
    text = lab.sh("cat %s 2>/dev/null; true" % LOCK).stdout.strip()
    return json.loads(text) if text else None


@pytest.mark.parametrize("ids, words", [
    (["8086:1533"], "ids: 8086:1533: vendor 8086 is not NVIDIA's (10de); it is 8086:1533 at"),
    (["10de:9999"], "ids: 10de:9999: no PCI function of this host has this id (an unknown NVIDIA id)"),
])
def test_a_gpu_id_that_is_no_nvidia_gpu_is_refused_before_the_host_changes(lab, tmp_path, ids, words):
    before = disk_digest(UPPER)
    extra = tmp_path / "ids.json"
    extra.write_text(json.dumps({"gpu_host_vendor_device_ids": ids}))
    r = play("--tags", "gpu_host", "--skip-tags", "preflight", "-e", "@%s" % extra)
    out = flat(r.stdout)
    assert recap(r.stdout)["failed"] == 1, r.stdout[-3000:]
    assert "bad_input: " + words in out and "the host's NVIDIA GPUs: 10de:2230 at" in out, r.stdout[-3000:]
    assert "Remedy: Give the vendor:device ids of the NVIDIA GPUs" in out and "nothing was changed" in out
    assert "The driver version is an NVIDIA version" in r.stdout    # the first look, right after the version's assert
    assert disk_digest(UPPER) == before


def test_the_converge_holds_the_lock_and_releases_it(serving):
    lab = serving
    assert lock_holder(lab) is None   # the converge (the serving fixture, or an earlier test's) released it


def test_a_unit_name_with_a_path_is_refused_before_anything(serving):
    lab = serving
    before = unit_props(lab)
    r = play("--tags", "serve", "--skip-tags", "preflight", "-e", "sglang_server_unit=../../../tmp/x.service")
    out = flat(r.stdout)
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-3000:]
    assert ("bad_input: unit '../../../tmp/x.service' is not a plain systemd service name" in out
            and "Remedy: name the unit like sglang.service" in out), r.stdout[-3000:]
    assert unit_props(lab)["MainPID"] == before["MainPID"]
    assert ct(lab, "sh", "-c", "ls /tmp/x.service /tmp/x* 2>/dev/null; true").stdout.strip() == ""


@pytest.mark.parametrize("link, model_dir, words", [
    ("/etc", "/srv/models/etc-link", "model_input: local_dir '/srv/models/etc-link' resolves to /etc, which is the system "
                                     "directory /etc: the model's files and its .cache would be written there"),
    ("/etc", "/srv/models/etc-link/kpro", "resolves to /etc/kpro, under the system directory /etc"),
    ("/opt", "/srv/models/opt-link/m", "resolves to /opt/m, outside the models' root /srv/models"),
    (None, "/srv/models/../../etc/kpro-model", "model_input: local_dir '/srv/models/../../etc/kpro-model' contains '..'"),
])
def test_a_model_dir_that_leads_elsewhere_is_refused_and_nothing_is_written(serving, link, model_dir, words):
    lab = serving
    if link:
        ct(lab, "ln", "-sfn", link, "/srv/models/" + model_dir.split("/")[3])
    before, pid = tree(CT_DISK + "/etc"), unit_props(lab)["MainPID"]
    try:
        r = play("--tags", "model", "-e", "model_dir=%s" % model_dir)
    finally:
        if link:
            ct(lab, "rm", "-f", "/srv/models/" + model_dir.split("/")[3])
    out = flat(r.stdout)
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-3000:]
    assert words in out and "Remedy: point model_dir at a directory under the models' root" in out, r.stdout[-3000:]
    assert tree(CT_DISK + "/etc") == before and not os.path.lexists(CT_DISK + "/opt/m")
    assert unit_props(lab)["MainPID"] == pid


def test_a_wrong_token_is_refused_by_the_preflight_before_any_model_request(serving):
    lab = serving
    hub_log(clear=True)
    r = play("--tags", "model", "-e", "model_hf_token=hf_wrongTokenForTheLab000")
    out = flat(r.stdout)
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-3000:]
    assert "TASK [kpro.gpu_serving.preflight : The hub knows the Hugging Face token]" in r.stdout
    assert ("model_token: the hub refused the token: check model_hf_token (hf_token / vault_hf_token): GET "
            "http://10.213.5.1:18602/api/whoami-v2 answered 401 (Invalid credentials in Authorization header)") in out, out[-3000:]
    assert "hf_wrongTokenForTheLab000" not in r.stdout
    paths = [(e["method"], e["path"], e["status"]) for e in hub_log()]
    assert paths == [("GET", "/api/whoami-v2", 401)], paths
    ok = play("--tags", "model")   # the right token passes the same check
    assert recap(ok.stdout, "ct129")["failed"] == 0 and "The hub knows the Hugging Face token" in ok.stdout
    assert lab


def test_a_second_run_waits_then_fails_naming_the_first(serving, tmp_path):
    lab = serving
    # an old run's token file under the name every run used to share: this run neither reads nor removes it
    old = "/run/kpro-hf/token-" + hashlib.sha1(MODEL.encode()).hexdigest()
    ct(lab, "sh", "-c", "mkdir -p %s && echo other-run > %s/keep" % (old, old))
    ct(lab, "rm", "-f", MODEL + "/" + SHARD)
    ctl("rate=20000")   # the missing shard takes a while: the first run holds the lock meanwhile
    first, log = start_play("--tags", "model", log_path=str(tmp_path / "first.log"))
    try:
        holder = wait_for(lambda: (lock_holder(lab) or {}).get("pid") == first.pid and lock_holder(lab), 120,
                          "the first run to take the lock")
        assert holder["controller"] == socket.gethostname()
        second = play("--tags", "model", "-e", "kpro_lock_wait=4")
        out = flat(second.stdout)
        assert recap(second.stdout, "ct129")["failed"] == 1, second.stdout[-3000:]
        assert ("run_locked: container 129 is being changed by another run: ansible-playbook PID %d on controller %s, "
                "started %s (lock %s on the node); waited 4 s" % (first.pid, holder["controller"], holder["started"], LOCK)
                in out), out[-3000:]
        assert "Remedy: wait for that run to end" in out
        ctl("reset=true")   # the throttle has done its work (the lock was held): the first run finishes at full speed
        assert first.wait(timeout=400) == 0, open(str(tmp_path / "first.log")).read()[-3000:]
    finally:
        ctl("reset=true")
        if first.poll() is None:
            kill_controller(first)
        log.close()
    assert lock_holder(lab) is None and ct(lab, "cat", old + "/keep").stdout.strip() == "other-run"
    assert ct(lab, "sh", "-c", "ls -A /run/kpro-hf").stdout.split() == [os.path.basename(old)]
    ct(lab, "rm", "-rf", old)


def test_a_lock_left_by_a_dead_controller_is_taken_over(serving, tmp_path):
    lab = serving
    dead, log = start_play("--tags", "model", log_path=str(tmp_path / "dead.log"))
    try:
        wait_for(lambda: (lock_holder(lab) or {}).get("pid") == dead.pid, 120, "the run to take the lock")
    finally:
        kill_controller(dead)
        log.close()
    assert lock_holder(lab)["pid"] == dead.pid   # killed: nothing released it
    r = play("--tags", "model", "-e", "kpro_lock_wait=4")
    assert recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-3000:]
    assert ("took over a stale lock of container 129: ansible-playbook PID %d on controller %s" % (dead.pid, socket.gethostname())
            in flat(r.stdout) and "is gone" in flat(r.stdout)), r.stdout[-3000:]
    assert lock_holder(lab) is None
