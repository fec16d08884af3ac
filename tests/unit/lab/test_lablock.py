# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/tools/lablock.py, the lab's lock (one lab at a time on a machine): held while the command runs; a command
already under it (flock FILE make test, or lablock inside lablock) goes on at once; another one waits for it, and
says for whom."""

from __future__ import annotations

import os
import subprocess
import sys
import time

LABLOCK = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "lablock.py")


def _run(lock, *cmd, **kw):
    env = dict(os.environ, KPGS_LAB_LOCK=str(lock))
    return subprocess.run([sys.executable, LABLOCK] + list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=30, check=False, **kw)


def test_the_lock_is_held_while_the_command_runs(tmp_path):
    lock = tmp_path / "lab.lock"
    r = _run(lock, "sh", "-c", "cat /proc/locks; echo me=$$")
    me = r.stdout.strip().splitlines()[-1].split("=")[1]
    assert r.returncode == 0 and any(line.split()[4] == me for line in r.stdout.splitlines() if "FLOCK" in line), r.stdout


def test_a_command_under_the_lock_goes_on_and_another_waits(tmp_path):
    lock = tmp_path / "lab.lock"
    t = time.time()
    nested = _run(lock, sys.executable, LABLOCK, "sh", "-c", "echo nested")   # lablock inside lablock: no wait
    assert nested.stdout.strip() == "nested" and time.time() - t < 10 and "waiting" not in nested.stderr
    holder = subprocess.Popen(["flock", str(lock), "sleep", "2"])
    try:
        time.sleep(0.5)
        t = time.time()
        other = _run(lock, "true")
        waited = time.time() - t
    finally:
        holder.wait()
    assert other.returncode == 0 and waited >= 1.0, waited
    assert "waiting for the lab lock %s, held by PID" % lock in other.stderr and "flock %s sleep 2" % lock in other.stderr
    under = subprocess.run(["flock", str(lock), sys.executable, LABLOCK, "true"], env=dict(os.environ, KPGS_LAB_LOCK=str(lock)),
                           timeout=10, check=False)
    assert under.returncode == 0        # flock FILE lablock ...: its ancestor holds the lock, no wait for itself
