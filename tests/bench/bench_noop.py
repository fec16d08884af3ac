#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wall time of the idempotent no-op re-run of the whole migration playbook against the lab.

    .venv/bin/python tests/bench/bench_noop.py [--runs 3] [--keep] [--compare CHECKOUT]

(from the checkout, after ``make setup``; root, for the lab.) Brings the lab up when it is down,
converges once (not measured), then runs ``ansible-playbook -i inventories/lab
playbooks/migrate-kpro6-to-kpro5.yml`` N times and prints, per run, the wall time, the number of
tasks per host and the recap's changed count (must be 0). Prints the median and max. The lab is
brought down afterwards if this script brought it up (unless --keep). Not a unit test: timings
depend on the machine (docs/performance.md figures: 2 cores, 24 GiB). Aim: 12 s or less.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import benchlab

from benchlab import BIN, REPO


def play(extra_vars=(), repo=REPO):
    """One run of ``repo``'s playbook (its roles and modules: its ansible.cfg resolves kpro.gpu_serving to it) against
    this checkout's lab."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(repo, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               KPGS_LAB_RUN=os.environ.get("KPGS_LAB_RUN") or os.path.join(REPO, "tests", "lab", ".run"))
    t = time.time()
    r = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", os.path.join(repo, "inventories", "lab"),
                        os.path.join(repo, "playbooks", "migrate-kpro6-to-kpro5.yml")] + ["-e%s" % e for e in extra_vars],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=repo, check=False)
    return time.time() - t, r


def recaps(out):
    return {m.group(1): dict(ok=int(m.group(2)), changed=int(m.group(3)), failed=int(m.group(4)))
            for m in re.finditer(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", out, re.M)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    ap.add_argument("-e", "--extra-vars", action="append", default=[],
                    help="passed to ansible-playbook, e.g. -e pct_control_persist=no (a new SSH connection per task in CT 129)")
    ap.add_argument("--compare", metavar="CHECKOUT",
                    help="another checkout of the collection (e.g. an export of main): its playbook, roles and modules are "
                         "re-run on the same lab, alternating with this checkout's, and its figures printed beside")
    args = ap.parse_args(argv)
    with benchlab.lab_up(args.keep):
        return measure(args.runs, args.extra_vars, args.compare)


def measure(runs, extra_vars=(), compare=None):
    secs, r = play(extra_vars)
    if r.returncode != 0:
        print(r.stdout[-4000:])
        return 1
    print("converge (not measured): %.1f s" % secs)
    repos = [("this", REPO)] + ([("compare", os.path.abspath(compare))] if compare else [])
    times = dict((name, []) for name, _repo in repos)
    for i in range(runs):
        for name, repo in (repos if i % 2 == 0 else repos[::-1]):   # alternated: both see the same load
            secs, r = play(extra_vars, repo)
            rc = recaps(r.stdout)
            tasks = len(re.findall(r"^TASK \[", r.stdout, re.M))
            print("run %d (%s): %.1f s, %d tasks, %s, load %.2f" % (
                i + 1, name, secs, tasks, ", ".join("%s ok=%d changed=%d" % (h, v["ok"], v["changed"]) for h, v in sorted(rc.items())),
                os.getloadavg()[0]))
            if r.returncode != 0 or any(v["changed"] or v["failed"] for v in rc.values()):
                print("the re-run was not a no-op:\n" + r.stdout[-4000:])
                return 1
            times[name].append(secs)
    for name, repo in repos:
        print("no-op re-run of the whole playbook (%s, %s): median %.1f s (%.1f-%.1f s) over %d runs (aim: <= 12 s)"
              % (name, repo, statistics.median(times[name]), min(times[name]), max(times[name]), len(times[name])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
