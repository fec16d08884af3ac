"""The gpu_host stage (issue: release from vfio-pci, host driver) against a fresh lab node.

Each test resets the node (`labctl reset`, about 3 s) and runs the real playbook with
the lab inventory, as the operator would.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

import pytest

from conftest import REPO, labctl


@pytest.fixture(autouse=True, scope="module")
def fresh_node_afterwards():
    """These tests install the driver; the lab tests after them expect a node as booted."""
    yield
    labctl("reset")


PLAYBOOK = os.path.join(REPO, "playbooks", "migrate-kpro6-to-kpro5.yml")
UPPER = os.path.join(REPO, "tests", "lab", ".run", "kpro5", "upper")
ANSIBLE_PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")


def play(*args):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", os.path.join(REPO, "inventories", "lab"), PLAYBOOK] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False, cwd=REPO)


def recap(out, host="kpro5"):
    m = re.search(r"^%s\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host), out, re.M)
    assert m, out[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups())))


LAB_LOGS = "var/log/kpro-lab"  # the lab's own daemons' logs (sshd), not the node's state


def disk_digest(upper=UPPER):
    """Every file of the node's disk (the overlay's upper layer) with its bytes' hash."""
    out = {}
    for top, dirs, files in os.walk(upper):
        if os.path.relpath(top, upper).startswith(LAB_LOGS) or os.path.basename(top) == "__pycache__":
            continue  # the lab's own logs and its fakes' bytecode caches
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            if os.path.islink(path):
                out[os.path.relpath(path, upper)] = "-> " + os.readlink(path)
                continue
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                out[os.path.relpath(path, upper)] = hashlib.sha256(f.read()).hexdigest()
    return out


def fresh(lab):
    labctl("reset")
    return lab


def test_converge_then_no_change_then_kernel_upgrade_rebuilds_only_the_module(lab):
    fresh(lab)
    first = play("--tags", "gpu_host")
    assert recap(first.stdout)["failed"] == 0 and recap(first.stdout)["changed"] > 0, first.stdout[-3000:]
    assert "install: no NVIDIA driver 580.126.09" in first.stdout
    state = lab.state()
    assert state["nvidia"]["installed"]["version"] == "580.126.09"
    drivers = {bdf: d.get("driver") for bdf, d in state["pci"]["devices"].items()}
    assert drivers["0000:17:00.0"] == drivers["0000:65:00.0"] == "nvidia"
    assert drivers["0000:17:00.1"] != "vfio-pci" and drivers["0000:65:00.1"] != "vfio-pci"
    calls = open(os.path.join(lab.root, "var/lib/kpro-lab/calls.log")).read()
    assert calls.count("update-initramfs") == 1, calls

    second = play("--tags", "gpu_host")
    assert recap(second.stdout)["changed"] == 0 and recap(second.stdout)["failed"] == 0, second.stdout[-3000:]

    labctl("kernel-upgrade")
    third = play("--tags", "gpu_host")
    assert recap(third.stdout)["failed"] == 0, third.stdout[-3000:]
    assert "rebuild_module:" in third.stdout, third.stdout[-3000:]
    assert "install: no NVIDIA driver" not in third.stdout
    state = lab.state()
    release = state["kernel"]["release"]
    assert release in json.dumps(state["nvidia"].get("kernel_modules", {}))
