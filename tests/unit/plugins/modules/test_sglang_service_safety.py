# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 12, findings 1, 3, 6: a bad setting fails before the serving server is touched (same main PID, same files)."""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading

import pytest

from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.serve_lab import (  # noqa: F401  pylint: disable=unused-import
    MODEL_NAME, STANDIN, alive, fakenvml, serve_lab)
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.test_sglang_gate import main_pid, reaper, service, unit_gate


def _files(lab):
    out = {}
    for d, _dirs, files in os.walk(str(lab.root / "etc")):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.join(d, f)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture
def serving(serve_lab, monkeypatch):
    """A serving server started by the module; the flags probe finds the stand-in (as <venv>/bin/python would)."""
    lab = serve_lab
    monkeypatch.setenv("PYTHONPATH", STANDIN)
    stop = threading.Event()
    threading.Thread(target=reaper, args=(lab, stop), daemon=True).start()
    res = service(lab, restart_sec=1)
    lab.started.append(main_pid(lab))
    yield lab, res
    stop.set()
    lab.record()
    subprocess.run([lab.systemctl, "stop", "sglang.service"], env=dict(os.environ), check=False, capture_output=True)


def _other_listener():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


BAD = [
    ("unknown option", {"mem_fraction_statc": 0.8}, "not_started", "the installed SGLang has no --mem-fraction-statc (did you mean mem_fraction_static?)"),
    ("tp above the GPUs", {"tp_size": 4}, "not_started", "needs 4 GPUs (tp_size x pp_size x dp_size from base_gpu_id) but NVML sees 2"),
    ("mem_fraction_static 1.0", {"mem_fraction_static": 1.0}, "not_started", "mem_fraction_static=1.0 is out of range"),
    ("mem_fraction_static 0", {"mem_fraction_static": 0}, "not_started", "mem_fraction_static=0 is out of range"),
    ("port 70000", {"port": 70000}, "not_started", "port=70000 is out of range"),
    ("port 0", {"port": 0}, "not_started", "port=0 is out of range"),
    ("newline in an option", {"chat_template": "a\nExecStartPre=/bin/sh"}, "not_started", "option chat_template: the value contains the control character"),
]


@pytest.mark.parametrize("name,change,phase,message", BAD, ids=[b[0] for b in BAD])
def test_bad_option_fails_before_the_server_is_touched(serving, name, change, phase, message):
    lab, _res = serving
    pid, files = main_pid(lab), _files(lab)
    res = service(lab, expect_ok=False, options=lab.options(**change))
    assert res["phase"] == phase and message in res["msg"], res["msg"]
    assert main_pid(lab) == pid and alive(pid) and _files(lab) == files


def test_killed_server_is_restarted_by_the_unit(serving):
    """Finding 5: Restart=on-failure; the SIGKILLed main process is replaced and the server answers again (NRestarts is
    asserted in the lab, tests/lab_tests/test_serve_safety.py: this systemctl stand-in of the host does not count)."""
    import signal
    import time
    import urllib.request
    lab, _res = serving
    pid = main_pid(lab)
    os.kill(pid, signal.SIGKILL)
    deadline, answered = time.time() + 90, None
    while time.time() < deadline and answered != 200:
        time.sleep(1)
        new = main_pid(lab)
        if new and new != pid:
            lab.started.append(new)
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % lab.port, timeout=5) as r:
                    answered = r.status
            except OSError:
                pass
    assert answered == 200


def test_port_taken_by_another_process(serving):
    lab, _res = serving
    pid, files = main_pid(lab), _files(lab)
    s = _other_listener()
    try:
        res = service(lab, expect_ok=False, options=lab.options(port=s.getsockname()[1]))
    finally:
        s.close()
    assert res["phase"] == "port_in_use" and "is taken by another process" in res["msg"]
    assert main_pid(lab) == pid and alive(pid) and _files(lab) == files


def test_our_own_port_is_not_taken(serving):
    """The running server's own listener does not count: an option change on the same port restarts."""
    lab, _res = serving
    res = service(lab, options=lab.options(max_running_requests=8))
    assert res["restarted"] is True


def test_newline_in_environment_and_bad_regex(serving):
    lab, _res = serving
    pid, files = main_pid(lab), _files(lab)
    env = dict(lab.server_env(), NCCL_DEBUG="WARN\nExecStartPre=/bin/false")
    res = service(lab, expect_ok=False, environment=env)
    assert "environment variable NCCL_DEBUG" in res["msg"] and "control character" in res["msg"]
    res = service(lab, expect_ok=False, probe_regex="(?i)par(is")
    assert "sglang_server_probe.regex" in res["msg"]
    assert main_pid(lab) == pid and alive(pid) and _files(lab) == files


def test_a_changed_venv_lock_restarts_the_server_once(serving):
    """sglang_install syncs the venv in place (only its lock stamp changes): the server restarts once for it."""
    lab, _res = serving
    stamp = lab.root / "nonexistent" / ".kpro-lock.sha256"   # <venv>/.kpro-lock.sha256 under the module's root
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text("1" * 64 + "\n")
    res = service(lab, restart_sec=1)
    lab.started.append(main_pid(lab))
    assert res["restarted"] is True and any("lock changed" in r for r in res["reasons"]), res["reasons"]
    again = service(lab, restart_sec=1)
    assert again["changed"] is False and again["restarted"] is False and again["reasons"] == []


def test_deployment_check_refuses_a_rolled_back_deployment_before_the_server_is_touched(serving, tmp_path):
    """deployment_check: sglang_deployment state=checked's step inside the converge. A deployment recorded as failed and
    rolled back is refused with its diagnosis's phase, the server untouched; the serving one is reported as recorded."""
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
    lab, _res = serving
    state = str(tmp_path / "state")
    path = dp.record_path(state, "sglang.service")
    serving_args = {"unit": "sglang.service", "venv": "/nonexistent", "options": lab.options()}
    bad_args = dict(serving_args, options=lab.options(max_running_requests=7))
    good = dp.deployment(serving_args, dp.venv_identity("/nonexistent"), "main")
    bad = dp.deployment(bad_args, dp.venv_identity("/nonexistent"), "main")
    diag = {"phase": "degenerate_output", "msg": "answered '!!!!'", "evidence": ["!!!!"]}
    dp.save(path, dp.record_failed(dp.record_good({}, good), bad, diag, good))
    record_before = open(path).read()
    pid, files = main_pid(lab), _files(lab)
    check = {"service": bad_args, "model_revision": "main", "state_dir": state}
    res = service(lab, expect_ok=False, options=bad_args["options"], deployment_check=check)
    assert res["phase"] == "degenerate_output" and "failed the gate" in res["msg"] and "rollback_retry" in res["remedy"], res
    assert main_pid(lab) == pid and alive(pid) and _files(lab) == files and open(path).read() == record_before
    same = service(lab, restart_sec=1, deployment_check=dict(check, service=serving_args))
    assert same["deployment_recorded"] is True and not same["restarted"] and main_pid(lab) == pid
    other = service(lab, restart_sec=1, deployment_check=dict(check, service=serving_args, model_revision="other"))
    assert other["deployment_recorded"] is False and not other["restarted"] and open(path).read() == record_before


def test_memory_still_being_freed_is_not_taken_for_the_baseline(serving):
    """CI, test_two_nodes: a peer's stop ended rank 0's server a moment before its converge read NVML, whose used memory
    and process list are two reads; the old server's memory, listed under no process, was taken for the baseline and
    the plan refused a launch that fits (weights_oom: 4026 MiB free). Here the unit is stopped and its memory stays
    used with no process for a moment: the restart plans with the stored baseline and waits for the memory."""
    import time
    lab, _res = serving
    subprocess.run([lab.systemctl, "stop", "sglang.service"], env=dict(os.environ), check=True, capture_output=True)
    with lab.labstate.modify(str(lab.root)) as st:
        for gpu in st["gpus"]:
            gpu["processes"], gpu["mem_used_mib"] = [], 45110

    def freed():
        time.sleep(1.5)
        with lab.labstate.modify(str(lab.root)) as st:
            for gpu in st["gpus"]:
                gpu["mem_used_mib"] = 300
    t = threading.Thread(target=freed, daemon=True)
    t.start()
    res = service(lab, restart_sec=1)
    t.join()
    lab.started.append(main_pid(lab))
    assert res["restarted"] is True and res["plan"]["fits"] is True, res.get("msg")
    assert res["released_after_s"] >= 1.0 and res["gpu_used_mib"] == [300, 300], res


def test_look_checks_a_server_it_did_not_restart_once(serving):
    """look: the gate's one check inside the converge's module run (the idempotent re-run pays one module call, not
    two): ready with the probe and the known-answer check; no look after a restart (the gate waits for that launch); a
    key that is the launch's own is refused before anything changes."""
    lab, res = serving
    assert unit_gate(lab, res)["phase"] == "ready"
    look = {"base_url": "http://127.0.0.1:%d" % lab.port, "served_model_name": MODEL_NAME, "chat_template_kwargs": None}
    again = service(lab, restart_sec=1, look=look)
    assert again["restarted"] is False and again["look"]["phase"] == "ready", again.get("look")
    assert again["look"]["launch_id"] == res["launch_id"] and again["look"]["known_answer"]["passed"] is True
    assert "paris" in again["look"]["probe"]["text"].lower() and again["look"]["gpu_used_mib"]
    pid, files = main_pid(lab), _files(lab)
    bad = service(lab, expect_ok=False, restart_sec=1, look=dict(look, timeout=5, log_path="/tmp/x"))
    assert bad["phase"] == "bad_input" and "log_path, timeout not allowed" in bad["msg"], bad["msg"]
    assert main_pid(lab) == pid and _files(lab) == files
    changed = service(lab, restart_sec=1, look=look, options=lab.options(max_running_requests=8))
    lab.started.append(main_pid(lab))
    assert changed["restarted"] is True and "look" not in changed
