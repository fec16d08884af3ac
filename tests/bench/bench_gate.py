#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Latency of the completion gate (kpro.gpu_serving.sglang_gate) against the SGLang stand-in.

    .venv/bin/python tests/bench/bench_gate.py [--runs 5] [--speed 20] [--poll-interval 1.0]

(from the checkout, after ``make setup``; needs gcc for the fake libnvidia-ml; no root, no lab.)

Measures, over N runs each, with the gate's default poll interval (1 s):

- failure-detection latency: the main process's exit (the stand-in's kv_cache_oom drill; the
  moment is taken from /proc by a watcher thread) -> the gate returned its diagnosis (target < 3 s).
  Negative values mean the gate named the failure from this launch's log before the process
  had exited (SGLang logs the exception, then kills its tree). A second series SIGKILLs the main
  process mid weight-load, so only the process state tells (the silent-death path);
- readiness latency: the ready line "The server is fired up and ready to roll!" written to
  this launch's log (its mtime when the line appeared, seen by a watcher thread) -> the gate
  returned ``ready`` after /health, /v1/models, the content probe and the known-answer check (target < 2 s);
- the known-answer check's share of it: the same readiness with the check off (``known_answer_checks: []``), the
  difference of the medians, and the check's own ``elapsed_s`` (target: no more than a few seconds).

Prints median and max of each. Not a unit test: timings depend on the machine.
Only processes this script started are ended, by PID.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, ".collections"))

from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_gate  # noqa: E402
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules import serve_lab as sl  # noqa: E402
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import (  # noqa: E402
    AnsibleExitJson, AnsibleFailJson, run_module)


class _MP(object):
    """A minimal monkeypatch for ServeLab outside pytest."""

    def __init__(self):
        self.saved = []

    def setenv(self, key, value):
        self.saved.append((key, os.environ.get(key)))
        os.environ[key] = value

    def undo(self):
        for key, value in reversed(self.saved):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def watch_exit(pid, out):
    while sl.alive(pid):
        time.sleep(0.002)
    out["t"] = time.time()


def watch_ready(path, out, stop):
    needle = "The server is fired up and ready to roll!"
    while not stop.is_set():
        try:
            with open(path) as f:
                if needle in f.read():
                    out["t"] = time.time()
                    return
        except OSError:
            pass
        time.sleep(0.002)


def run_gate(lab, lid, poll, **kw):
    args = {"pid": lab.proc.pid, "log_dir": str(lab.log_dir), "launch_id": lid, "base_url": "http://127.0.0.1:%d" % lab.port,
            "served_model_name": sl.MODEL_NAME, "timeout": 120, "poll_interval": poll, "planned_weights_mib": 26417,
            "gpu_baseline_mib": [sl.BASELINE, sl.BASELINE]}
    args.update(kw)
    try:
        run_module(sglang_gate, args)
    except (AnsibleExitJson, AnsibleFailJson) as e:
        return time.time(), e.result
    raise AssertionError("the gate returned nothing")


def one(tmp, n, kind, poll):
    mp = _MP()
    d = os.path.join(tmp, "%s-%d" % (kind, n))
    os.makedirs(d)
    import pathlib
    lab = sl.ServeLab(pathlib.Path(d), mp)
    try:
        lid = "%s%04d" % (kind, n)
        if kind == "fail":
            lab.launch(lid, drill="kv_cache_oom")
            out = {}
            threading.Thread(target=watch_exit, args=(lab.proc.pid, out), daemon=True).start()
            t_end, res = run_gate(lab, lid, poll)
            assert res["phase"] == "kv_cache_oom", res["phase"]
            deadline = time.time() + 10
            while "t" not in out and time.time() < deadline:
                time.sleep(0.01)
            # negative: the gate named the failure from the log before the process had exited
            return t_end - out["t"]
        if kind == "kill":
            # the process dies with nothing in the log (SIGKILL by us, by PID, mid weight-load)
            lab.launch(lid, drill="slow_load:40")
            out = {}

            def killer():
                path = str(lab.log_dir / ("sglang-%s.log" % lid))
                while True:
                    try:
                        with open(path) as f:
                            if "Load weight begin" in f.read():
                                break
                    except OSError:
                        pass
                    time.sleep(0.01)
                time.sleep(0.3)
                os.kill(lab.proc.pid, 9)
                watch_exit(lab.proc.pid, out)
            threading.Thread(target=killer, daemon=True).start()
            t_end, res = run_gate(lab, lid, poll)
            assert res["phase"] != "ready", res["phase"]
            return t_end - out["t"]
        lab.launch(lid)
        out, stop = {}, threading.Event()
        threading.Thread(target=watch_ready, args=(str(lab.log_dir / ("sglang-%s.log" % lid)), out, stop), daemon=True).start()
        t_end, res = run_gate(lab, lid, poll, **({"known_answer_checks": []} if kind == "ready_off" else {}))
        stop.set()
        assert res["phase"] == "ready", (res["phase"], res["remedy"])
        if kind == "ready":
            KNOWN_ANSWER_S.append(res["known_answer"]["elapsed_s"])
        return t_end - out["t"]
    finally:
        lab.cleanup()
        mp.undo()


KNOWN_ANSWER_S = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--speed", default="20", help="KPRO_LAB_SGLANG_SPEED of the stand-in")
    ap.add_argument("--poll-interval", type=float, default=1.0)
    a = ap.parse_args()
    os.environ["KPRO_TEST_SGLANG_SPEED"] = a.speed
    import tempfile
    tmp = tempfile.mkdtemp(prefix="bench-gate-")
    factory = type("F", (), {"mktemp": lambda self, name: __import__("pathlib").Path(tempfile.mkdtemp(prefix=name, dir=tmp))})()
    sl.fakenvml.__wrapped__(factory)     # compile + preload the fake libnvidia-ml
    results = {}
    for kind in ("fail", "kill", "ready", "ready_off"):
        results[kind] = [one(tmp, i, kind, a.poll_interval) for i in range(a.runs)]
    print("gate latency over %d runs (poll_interval %.1f s, stand-in speed %s):" % (a.runs, a.poll_interval, a.speed))
    for kind, label, target in (("fail", "failure detection, kv_cache_oom drill (exit -> failed)", 3.0),
                                ("kill", "failure detection, silent SIGKILL (exit -> failed)", 3.0),
                                ("ready", "readiness (ready line -> gate ok)", 2.0)):
        v = results[kind]
        verdict = "OK" if max(v) < target else "OVER"
        print("  %-56s median %.3f s  max %.3f s  (target < %.0f s) %s" % (label, statistics.median(v), max(v), target, verdict))
    off = results["ready_off"]
    print("  %-56s median %.3f s  max %.3f s" % ("readiness, known-answer check off", statistics.median(off), max(off)))
    added = statistics.median(results["ready"]) - statistics.median(off)
    print("  %-56s %.3f s (medians); the check itself: median %.3f s, max %.3f s (target < 3 s) %s" % (
        "known-answer check adds", added, statistics.median(KNOWN_ANSWER_S), max(KNOWN_ANSWER_S), "OK" if max(KNOWN_ANSWER_S) < 3 else "OVER"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
