# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate against a server that accepts connections and answers nothing (SIGSTOP): unresponsive, never ready.

A real listening socket that never accepts (the kernel completes the handshake, as for a stopped server), a real
stopped process (its /proc state), a log that says ready."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_ready
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_ready import GATE_SPEC, Gate, http
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.serve_lab import (  # noqa: F401  pylint: disable=unused-import
    MODEL_NAME, fakenvml, serve_lab)

READY_LOG = ("# kpro-launch-id: hung0001\n"
             "[2026-03-01 09:41:30] INFO:     Uvicorn running on http://127.0.0.1:%d (Press CTRL+C to quit)\n"
             "[2026-03-01 09:41:31] The server is fired up and ready to roll!\n")


class Module(object):
    def run_command(self, *_a, **_kw):
        return 1, "", "no nvidia-smi here"

    def get_bin_path(self, *_a, **_kw):
        return None


@pytest.fixture
def silent_port():
    """A port whose connections the kernel accepts (backlog) and nobody answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def stopped_pid():
    proc = subprocess.Popen(["sleep", "60"])
    proc.send_signal(signal.SIGSTOP)
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def no_gpus(monkeypatch):
    monkeypatch.setattr(sglang_ready, "gpu_facts", lambda **_kw: {"available": False, "msg": "no GPU in a unit test"})


def gate(tmp_path, port, pid, **kw):
    log = tmp_path / "sglang-hung0001.log"
    log.write_text(READY_LOG % port)
    params = dict((k, v.get("default")) for k, v in GATE_SPEC.items())
    params.update(pid=pid, log_path=str(log), launch_id="hung0001", base_url="http://127.0.0.1:%d" % port,
                  served_model_name="m", timeout=1, poll_interval=0.05, http_timeout=0.3)
    params.update(kw)
    return Gate(Module(), params)


def test_http_tells_no_answer_from_a_refused_connection(silent_port):
    assert http("GET", "http://127.0.0.1:%d/health" % silent_port, timeout=0.2) == (None, "no answer within 0.2s")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert http("GET", "http://127.0.0.1:%d/health" % port, timeout=0.2) == (None, None)


def test_a_broken_answer_is_a_failed_exchange_not_a_traceback():
    """A server that answers with no HTTP status line (http.client's BadStatusLine) is not silent either."""
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer():
        conn, _addr = srv.accept()
        conn.recv(4096)
        conn.sendall(b"not http at all\r\n\r\n")
        conn.close()

    t = threading.Thread(target=answer)
    t.start()
    try:
        assert http("GET", "http://127.0.0.1:%d/health" % srv.getsockname()[1], timeout=2) == (None, None)
    finally:
        t.join(5)
        srv.close()


def test_a_stopped_server_is_unresponsive_with_its_process_state(tmp_path, silent_port, stopped_pid, no_gpus):
    g = gate(tmp_path, silent_port, stopped_pid)
    t0 = time.time()
    res = g.summary(g.run())
    assert res["phase"] == "unresponsive" and res["probe"] is None
    assert time.time() - t0 < 3          # three checks of 0.3 s, not the stall budget
    assert "no answer within 0.3s, 3 times in a row" in res["evidence"][0]
    assert "main process %d: State: T (stopped)" % stopped_pid in res["evidence"][1]
    assert "kill -CONT %d" % stopped_pid in res["remedy"] and "sglang_server_restart_unresponsive" in res["remedy"]
    assert res["facts"]["process_state"] == "T (stopped)" and res["facts"]["unresponsive_s"] >= 0.9


def test_a_refused_health_never_counts_and_the_stall_is_a_timeout_not_ready(tmp_path, stopped_pid, no_gpus):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    g = gate(tmp_path, port, stopped_pid, stall_timeout=1)
    res = g.summary(g.run())
    assert res["phase"] == "timeout" and res["probe"] is None
    assert "The log says ready, but GET /health never answered 200 (last: no connection)" in res["remedy"]
    assert res["remedy"].startswith("No progress for 1s") and res["facts"]["stalled_s"] >= 1


def test_an_answer_between_silences_starts_the_count_again(tmp_path, monkeypatch, stopped_pid, no_gpus):
    answers = [(None, "no answer within 0.3s")] * 2 + [(503, None)] + [(None, "no answer within 0.3s")] * 3
    calls = []

    def fake_http(method, url, api_key=None, body=None, timeout=5.0):
        calls.append(url)
        return answers[len(calls) - 1]

    monkeypatch.setattr(sglang_ready, "http", fake_http)
    g = gate(tmp_path, 1, stopped_pid, unresponsive_after=3)
    res = g.run()
    assert res["phase"] == "unresponsive" and len(calls) == 6
    assert "3 times in a row" in res["evidence"][0]


def test_the_sglang_stand_in_stopped_after_ready_is_unresponsive(serve_lab):
    """The stand-in serves, then its main process gets SIGSTOP: the same gate that found it ready names it unresponsive."""
    serve_lab.launch("stop0001")
    params = dict((k, v.get("default")) for k, v in GATE_SPEC.items())
    params.update(pid=serve_lab.proc.pid, log_dir=str(serve_lab.log_dir), launch_id="stop0001", served_model_name=MODEL_NAME,
                  base_url="http://127.0.0.1:%d" % serve_lab.port, timeout=60, poll_interval=0.2, http_timeout=1.0,
                  known_answer_checks=[])
    ready = Gate(Module(), params).run()
    assert ready["phase"] == "ready", (ready["phase"], ready["evidence"])
    os.kill(serve_lab.proc.pid, signal.SIGSTOP)
    try:
        res = Gate(Module(), dict(params, timeout=1)).run()
    finally:
        os.kill(serve_lab.proc.pid, signal.SIGCONT)
    assert res["phase"] == "unresponsive" and "State: T (stopped)" in res["evidence"][1], res["evidence"]


def test_the_log_is_read_once_a_late_exception_line_has_come(tmp_path, no_gpus):
    """A dying scheduler's traceback reaches the log in two pieces, the exception line a second after the frames: the
    gate's settle waits for it (the exception line names the phase), where a plain 0.3 s quiet read it cut."""
    import threading
    g = gate(tmp_path, 1, 1)
    head = "[TP0] Scheduler hit an exception: Traceback (most recent call last):\n  File \"s.py\", line 9, in load\n    w()\n"
    with open(g.log_path, "a") as f:
        f.write(head)

    def late():
        time.sleep(1.0)
        with open(g.log_path, "a") as f:
            f.write("torch.OutOfMemoryError: CUDA out of memory.\n")

    t = threading.Thread(target=late)
    t.start()
    t0 = time.time()
    g.settle_log()
    waited, text = time.time() - t0, g.reader.read()
    t.join()
    assert text.endswith("torch.OutOfMemoryError: CUDA out of memory.\n")
    assert 0.9 < waited < 5
