# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the lab benchmarks (bench_noop.py, bench_pct.py) share: the lab up for the benchmark, down after it."""

from __future__ import annotations

import contextlib
import os
import subprocess

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(REPO, ".venv", "bin")
LABCTL = os.path.join(REPO, "tests", "lab", "labctl.py")


def labctl(*args, check=False):
    return subprocess.run([os.path.join(BIN, "python"), LABCTL] + list(args), stdout=subprocess.DEVNULL, check=check)


@contextlib.contextmanager
def lab_up(keep=False):
    """Bring the lab up when it is down; bring it down afterwards if it was down (unless keep)."""
    started = labctl("status").returncode != 0
    if started:
        labctl("up", check=True)
    try:
        yield
    finally:
        if started and not keep:
            labctl("down")
