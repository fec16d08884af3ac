# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve stage in one direction: the options reach ExecStart (built once) and the plan (made once) by SGLang's
own names, and the gate takes the plan instead of making it again."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_ready, sglang_serve, sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_log import LAUNCH_HEADER, launch_header, read_launch_header

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "qwen3.6-27b")
OPTS = {"model_path": "/srv/models/Qwen3.6-27B", "served_model_name": "qwen3.6-27b", "tp_size": 2, "context_length": 65536,
        "mem_fraction_static": 0.85, "max_running_requests": 16, "port": 30000}


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    for name in ("config.json", "model.safetensors.index.json"):
        shutil.copy(os.path.join(FIX, name), str(d / name))
    return d


class FakeModule(object):
    check_mode = False

    def __init__(self, tmp_path, **params):
        self.warnings = []
        self.params = dict(
            unit="sglang", venv="/opt/sglang/venv", python=None, options=dict(OPTS), api_key="k", environment={}, model_dir=None,
            plan=True, plan_overrides={}, state="started", force_restart=False, enabled=None, release_timeout=5, idle_used_mib=1024,
            timeout_stop_sec=120, limit_nofile=65536, restart="on-failure", restart_sec=30, start_limit_interval_sec=3600,
            start_limit_burst=3, probe_regex="(?i)paris", secret_file=str(tmp_path / "secrets.yaml"), user=None,
            log_dir="/var/log/sglang", launcher=su.LAUNCHER_PATH, env_file=None, unit_dir="/etc/systemd/system",
            state_dir="/var/lib/kpro-gpu-serving", systemctl="/bin/false", root=str(tmp_path), cgroup_root=str(tmp_path))
        self.params.update(params)

    def warn(self, msg):
        self.warnings.append(msg)


def test_plan_launch_keeps_sglang_names_and_uses_the_gpus_of_the_launch(model, monkeypatch):
    seen = []
    real = sglang_serve.memory_plan

    def spy(config, index, options, **kw):
        seen.append((options, kw))
        return real(config, index, options, **kw)

    monkeypatch.setattr(sglang_serve, "memory_plan", spy)
    res = sglang_serve.plan_launch(dict(OPTS, base_gpu_id=1), str(model), [49140, 49140, 24000], [300, 400, 500],
                                   overrides={"context_overhead_mib": 1000})
    assert len(seen) == 1
    options, kw = seen[0]
    assert options["tp_size"] == 2 and options["context_length"] == 65536 and options["context_overhead_mib"] == 1000
    assert "model_path" not in options and "port" not in options
    assert kw == {"gpu_total_mib": [49140, 24000], "gpu_baseline_mib": [400, 500], "environment": None, "sglang_version": None}
    assert "tp" not in options  # no rename on the way: the plan reads tp_size itself
    assert res["context_length"] == 65536 and "model" not in res


def test_plan_launch_skips_without_the_model_files(tmp_path):
    warnings = []
    assert sglang_serve.plan_launch(OPTS, str(tmp_path / "nope"), [49140], warn=warnings.append) is None
    assert sglang_serve.plan_launch(OPTS, str(tmp_path), [49140], warn=warnings.append) is None
    assert "not found (set model_dir)" in warnings[0] and "config.json not found" in warnings[1]


def test_plan_launch_without_an_index_sums_the_safetensors(model):
    os.unlink(str(model / "model.safetensors.index.json"))
    (model / "model-00001.safetensors").write_bytes(b"\0" * 4096)
    assert sglang_serve.model_weights_index(str(model)) == 4096
    assert sglang_serve.plan_launch(OPTS, str(model), [49140, 49140])["per_gpu"]["weights_mib"] == 0


def test_render_builds_exec_start_once_with_the_context_length(tmp_path, monkeypatch):
    calls = []
    real = su.exec_start

    def spy(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(su, "exec_start", spy)
    server = sglang_serve.Server(FakeModule(tmp_path))
    server.render()
    assert len(calls) == 1
    line = server.result["exec_start"]
    assert "--context-length 65536" in line and "--tp-size 2" in line and "--config %s" % (tmp_path / "secrets.yaml") in line
    assert "ExecStart=%s\n" % line in server.unit_text
    assert server.unit_path == str(tmp_path / "etc/systemd/system/sglang.service")
    assert len(server.fingerprint) == 64


def test_render_refusals_are_failures(tmp_path):
    server = sglang_serve.Server(FakeModule(tmp_path, probe_regex="(", options=dict(OPTS, api_key="x")))
    with pytest.raises(Failure) as e:
        server.render()
    assert e.value.phase == "not_started" and "probe" in e.value.msg
    server = sglang_serve.Server(FakeModule(tmp_path, options=dict(OPTS, chat_template="a\nb")))
    with pytest.raises(Failure) as e:
        server.render()
    assert "control character" in e.value.msg and "nothing was changed" in e.value.remedy


def test_check_mode_writes_nothing_and_reports_the_files(tmp_path):
    module = FakeModule(tmp_path, launcher=str(tmp_path / "launch"))
    module.check_mode = True
    server = sglang_serve.Server(module)
    server.render()
    changed = server.write_files()
    assert server.unit_path in changed and str(tmp_path / "launch") in changed
    assert not os.path.exists(server.unit_path) and server.result["diff"]["after"] == server.unit_text


def test_the_gate_takes_the_plan():
    plan = {"fits": True, "per_gpu": {"weights_mib": 26417}}
    assert sglang_ready.planned_weights_mib(plan) == 26417
    assert sglang_ready.planned_weights_mib(plan, 1000.0) == 1000.0
    assert sglang_ready.planned_weights_mib(None) is None and sglang_ready.planned_weights_mib({}) is None
    # the gate does not make the plan (or any part of it) again
    assert not hasattr(sglang_ready, "weights_total_bytes") and not hasattr(sglang_ready, "memory_plan")


def test_the_converges_look_takes_only_the_gates_own_options():
    """sglang_service look: the gate's options that are not the launch's; a null is left out (the gate's default); the
    launch's own (timeout, log, key) are refused before anything changes."""
    assert set(sglang_ready.LOOK_KEYS) < set(sglang_ready.GATE_SPEC)
    launch_own = {"unit", "systemctl", "pid", "log_path", "log_dir", "launch_id", "api_key", "api_key_file", "plan", "timeout",
                  "gpu_baseline_mib", "planned_weights_mib"}
    assert not set(sglang_ready.LOOK_KEYS) & launch_own
    look = sglang_ready.look_options({"served_model_name": "m", "chat_template_kwargs": None, "probe_max_tokens": 8})
    assert look == {"served_model_name": "m", "probe_max_tokens": 8}
    with pytest.raises(Failure) as e:
        sglang_ready.look_options({"served_model_name": "m", "timeout": 600, "api_key": "k"})
    assert e.value.phase == "bad_input" and "api_key, timeout not allowed" in e.value.msg


def test_one_launch_header(tmp_path):
    assert "printf '%s %%s\\n'" % LAUNCH_HEADER in su.LAUNCHER_SCRIPT
    log = tmp_path / "x.log"
    log.write_text(launch_header("abc123") + "line\n")
    assert read_launch_header(str(log)) == "abc123"
    log.write_text("no header\n")
    assert read_launch_header(str(log)) is None and read_launch_header(str(tmp_path / "nope")) is None


def test_a_changed_venv_lock_is_a_restart_reason():
    lock, other = "1" * 64, "2" * 64
    assert sglang_serve.lock_reasons({"lock_sha256": lock}, lock) == []
    assert "lock changed" in sglang_serve.lock_reasons({"lock_sha256": lock}, other)[0]
    assert "lock changed" in sglang_serve.lock_reasons({"lock_sha256": ""}, other)[0]
    # a launch stored before the lock was: a stamp written after the launch started means a sync under it
    assert sglang_serve.lock_reasons({"started": 100.0}, other, stamp_mtime=50.0) == []
    assert "synced" in sglang_serve.lock_reasons({"started": 100.0}, other, stamp_mtime=150.0)[0]
    assert sglang_serve.lock_reasons({}, other, stamp_mtime=150.0) == []


def test_render_reads_the_venv_lock_once(tmp_path):
    venv = tmp_path / "opt" / "sglang" / "venv"
    venv.mkdir(parents=True)
    (venv / ".kpro-lock.sha256").write_text("1" * 64 + "\n")
    server = sglang_serve.Server(FakeModule(tmp_path))
    server.render()
    assert server.lock == "1" * 64


def test_a_port_held_by_a_server_that_is_ending_is_looked_at_again(monkeypatch):
    """A listener that is not ours and goes away within PORT_GRACE_S (rank 0 ending after its peer was lost) is not a
    refusal; one that stays is, after the grace."""
    ss = sglang_serve
    listening = "  0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    t0 = time.time()
    monkeypatch.setattr(ss, "read_text", lambda p: head + (listening if p.endswith("/tcp") and time.time() - t0 < 0.6 else ""))
    monkeypatch.setattr(ss.su, "socket_inodes", lambda pids: set())
    assert ss.Server.port_busy(None, 30000, []) is False
    assert 0.5 <= time.time() - t0 < ss.PORT_GRACE_S
    monkeypatch.setattr(ss, "PORT_GRACE_S", 0.6)
    monkeypatch.setattr(ss, "read_text", lambda p: head + (listening if p.endswith("/tcp") else ""))
    t1 = time.time()
    assert ss.Server.port_busy(None, 30000, []) is True
    assert time.time() - t1 >= 0.6


def test_check_refuses_what_the_container_can_check_before_anything_is_stopped(tmp_path, monkeypatch):
    """Issue 30: a missing model directory, a host with shell syntax, PATH replaced and extra flags SGLang's own parser
    refuses (the lab's stand-in, run as the venv's Python) are one refusal, raised by check(), before stop()."""
    standin = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "lab", "sglang_standin"))
    monkeypatch.setenv("PYTHONPATH", standin)
    monkeypatch.setenv("KPRO_LAB_SGLANG_STANDIN_VERSION", "0.5.11")
    import subprocess
    import sys

    class Runner(FakeModule):
        def run_command(self, args, handle_exceptions=True):
            res = subprocess.run(args, capture_output=True, text=True, check=False)
            return res.returncode, res.stdout, res.stderr

    opts = dict(OPTS, model_path=str(tmp_path / "gone"), host="0.0.0.0; rm -rf /", extra=["--foo; reboot"])
    server = sglang_serve.Server(Runner(tmp_path, options=opts, python=sys.executable, environment={"PATH": "/nonexistent"}))
    server.render()
    monkeypatch.setattr(server, "port_busy", lambda port, ours: False)
    monkeypatch.setattr(server, "stop", lambda *a: pytest.fail("stopped"))
    with pytest.raises(Failure) as e:
        server.check({"gpus": [{}, {}]}, [], [])
    ev = e.value.evidence
    assert e.value.phase == "not_started" and len(ev) == 4, ev
    assert "no such directory" in ev[0] and "neither an IP address" in ev[1] and "PATH='/nonexistent'" in ev[2]
    assert ev[3].endswith("sglang serve: error: unrecognized arguments: --foo; reboot")
