#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Cost of one task in container 129 over kpro.gpu_serving.pct against one task on the node over SSH.

    .venv/bin/python tests/bench/bench_pct.py [--runs 3] [--tasks 30] [--unshared] [--keep]

(from the checkout, after ``make setup``; root, for the lab.) Brings the lab up when it is down
(container 129 must be running: converge once, e.g. with tests/bench/bench_noop.py --keep), then
runs a play of N ``ansible.builtin.stat`` tasks against ct129 (pct) and against kpro5 (the
ansible.builtin.ssh connection), and a play of no task as the baseline (ansible's start-up), each
--runs times, alternating. Per-task cost = (median of the N-task play - median of the empty play) / N.
Every run starts with no shared SSH connection (a fresh ANSIBLE_SSH_CONTROL_PATH_DIR), so
opening it is counted. --unshared adds a row for pct with ``pct_control_persist=no`` (a new
SSH connection per task, as before the shared connection). Not a unit test: timings depend on
the machine (docs/performance.md figures: 2 cores). Aim: pct within 1.2x of SSH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlab
from benchlab import BIN, REPO

INVENTORY = os.path.join(REPO, "inventories", "lab")


def write_play(path, tasks):
    lines = ["---", "- name: bench", "  hosts: \"{{ bench_target }}\"", "  gather_facts: false", "  tasks:"]
    if not tasks:
        lines[-1] = "  tasks: []"
    for i in range(tasks):
        lines += ["    - name: stat %d" % i, "      ansible.builtin.stat:", "        path: /etc/hostname"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def run_play(play, target, extra=None):
    # a fresh control path directory: the run opens its shared SSH connections itself (ssh and pct alike)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_SSH_CONTROL_PATH_DIR=tempfile.mkdtemp(prefix="cp-", dir=os.path.dirname(play)))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", INVENTORY, play, "-e", "bench_target=%s" % target]
    for k, v in (extra or {}).items():
        argv += ["-e", "%s=%s" % (k, v)]
    t = time.time()
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, check=False)
    secs = time.time() - t
    if r.returncode != 0:
        sys.stdout.write(r.stdout[-3000:])
        raise SystemExit("the bench play failed against %s" % target)
    return secs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--unshared", action="store_true", help="also measure pct with pct_control_persist=no")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="kpgs-bench-pct-")
    try:
        with benchlab.lab_up(args.keep):
            return measure(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(args, tmp):
    full, empty = os.path.join(tmp, "tasks.yml"), os.path.join(tmp, "empty.yml")
    write_play(full, args.tasks)
    write_play(empty, 0)
    rows = [("pct (ct129)", "ct129", {}), ("ssh (kpro5)", "kpro5", {})]
    if args.unshared:
        rows.append(("pct, no shared connection", "ct129", {"pct_control_persist": "no"}))
    times = {label: [] for label, _t, _e in rows}
    base = []
    for dummy in range(args.runs):
        base.append(run_play(empty, "kpro5"))
        for label, target, extra in rows:
            times[label].append(run_play(full, target, extra))
    b = statistics.median(base)
    print("empty play (ansible start-up): median %.2f s over %d runs" % (b, args.runs))
    per = {}
    for label, _t, _e in rows:
        m = statistics.median(times[label])
        per[label] = (m - b) / args.tasks
        print("%-28s %d stat tasks: median %.2f s (%s) -> %.3f s per task"
              % (label, args.tasks, m, ", ".join("%.2f" % t for t in times[label]), per[label]))
    ratio = per["pct (ct129)"] / per["ssh (kpro5)"]
    print("per-task cost, pct / ssh: %.2fx (aim: <= 1.2x)" % ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
