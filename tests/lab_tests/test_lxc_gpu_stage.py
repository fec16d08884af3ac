"""The lxc_gpu stage against the lab, method lxc_raw: only the module's lines change, the
container restarts once, and a new nvidia-uvm major updates exactly those lines."""

from __future__ import annotations

import difflib
import os

import pytest

from conftest import labctl
from test_gpu_host_stage import play, recap


@pytest.fixture(scope="module")
def host_done(lab):
    """A fresh node with the host stage done, once for this module (a driver install costs about a minute);
    the lab tests after these expect a node as booted."""
    labctl("reset")
    assert recap(play("--tags", "gpu_host").stdout)["failed"] == 0
    with open(os.path.join(lab.root, "etc/pve/lxc/129.conf")) as f:
        base = f.read()
    yield lab, base
    labctl("reset")


@pytest.fixture
def no_passthrough(host_done):
    """Container 129 as the host stage left it: its config without any passthrough line, running (restarted
    when a test before this one changed its config)."""
    lab, base = host_done
    path = os.path.join(lab.root, "etc/pve/lxc/129.conf")
    with open(path) as f:
        current = f.read()
    if current != base:
        lab.exec("pct", "stop", "129")
        with open(path, "w") as f:
            f.write(base)
        lab.exec("pct", "start", "129")
    return lab


def conf(lab):
    with open(os.path.join(lab.root, "etc/pve/lxc/129.conf")) as f:
        return f.read().splitlines()


def changed_lines(before, after):
    return [d for d in difflib.ndiff(before, after) if d[:2] in ("- ", "+ ")]


def test_lxc_raw_passthrough_then_uvm_major_change(no_passthrough):
    lab = no_passthrough
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


def test_devn_passthrough_changes_only_its_lines_and_restarts_once(no_passthrough):
    lab = no_passthrough
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
