"""The lxc_gpu stage against the lab, method lxc_raw: only the module's lines change, the
container restarts once, and a new nvidia-uvm major updates exactly those lines."""

from __future__ import annotations

import difflib
import os

import pytest

from conftest import labctl
from test_gpu_host_stage import play, recap


@pytest.fixture(autouse=True, scope="module")
def fresh_node_afterwards():
    """These tests install the driver; the lab tests after them expect a node as booted."""
    yield
    labctl("reset")


def conf(lab):
    with open(os.path.join(lab.root, "etc/pve/lxc/129.conf")) as f:
        return f.read().splitlines()


def changed_lines(before, after):
    return [d for d in difflib.ndiff(before, after) if d[:2] in ("- ", "+ ")]


def test_lxc_raw_passthrough_then_uvm_major_change(lab):
    labctl("reset")
    assert recap(play("--tags", "gpu_host").stdout)["failed"] == 0
    before = conf(lab)
    pid_before = lab.state()["guests"]["129"].get("pid")
    r = play("--tags", "lxc_gpu", "-e", "lxc_gpu_method=lxc_raw")
    assert recap(r.stdout)["failed"] == 0 and recap(r.stdout)["changed"] >= 1, r.stdout[-3000:]
    after = conf(lab)
    diff = changed_lines(before, after)
    # only additions, all of them raw lxc lines for NVIDIA devices, all in the main section
    assert diff and all(d.startswith("+ lxc.") for d in diff), diff
    assert all("nvidia" in d or "devices.allow" in d for d in diff), diff
    assert after.index([ln for ln in after if ln.startswith("lxc.")][-1]) < after.index("[pre-gpu]")
    pid_after = lab.state()["guests"]["129"].get("pid")
    assert pid_after and pid_after != pid_before  # restarted
    out = lab.exec("pct", "exec", "129", "--", "ls", "/dev/nvidia0", "/dev/nvidia-uvm").stdout
    assert "/dev/nvidia0" in out

    again = play("--tags", "lxc_gpu", "-e", "lxc_gpu_method=lxc_raw")
    assert recap(again.stdout)["changed"] == 0
    assert lab.state()["guests"]["129"].get("pid") == pid_after  # not restarted

    old = lab.state()["majors"]["nvidia-uvm"]
    labctl("uvm-reload")
    new = lab.state()["majors"]["nvidia-uvm"]
    assert new != old
    third = play("--tags", "lxc_gpu", "-e", "lxc_gpu_method=lxc_raw")
    assert recap(third.stdout)["failed"] == 0 and recap(third.stdout)["changed"] >= 1
    diff = changed_lines(after, conf(lab))
    assert diff and all(("%d" % old) in d for d in diff if d.startswith("- ")), diff
    assert all(("%d" % new) in d for d in diff if d.startswith("+ ")), diff


def test_devn_passthrough_changes_only_its_lines_and_restarts_once(lab):
    labctl("reset")
    assert recap(play("--tags", "gpu_host").stdout)["failed"] == 0
    before = conf(lab)
    pid_before = lab.state()["guests"]["129"].get("pid")
    r = play("--tags", "lxc_gpu")
    assert recap(r.stdout)["failed"] == 0 and recap(r.stdout)["changed"] >= 1, r.stdout[-3000:]
    after = conf(lab)
    diff = changed_lines(before, after)
    assert diff and all(d.startswith("+ dev") and "/dev/nvidia" in d for d in diff), diff
    pid_after = lab.state()["guests"]["129"].get("pid")
    assert pid_after and pid_after != pid_before
    again = play("--tags", "lxc_gpu")
    assert recap(again.stdout)["changed"] == 0
    assert lab.state()["guests"]["129"].get("pid") == pid_after and conf(lab) == after
    # a stopped container (a rebuilt host with onboot 0, an operator's pct stop) is started, once
    lab.exec("pct", "stop", "129")
    assert lab.state()["guests"]["129"]["status"] == "stopped"
    third = play("--tags", "lxc_gpu")
    assert recap(third.stdout)["failed"] == 0 and recap(third.stdout)["changed"] == 1, third.stdout[-3000:]
    assert lab.state()["guests"]["129"]["status"] == "running" and conf(lab) == after
    assert "running" in lab.exec("pct", "status", "129").stdout
    assert recap(play("--tags", "lxc_gpu").stdout)["changed"] == 0
