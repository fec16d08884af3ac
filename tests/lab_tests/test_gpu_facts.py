# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_facts against the lab node kpro5, through the real ansible CLI and SSH.

Needs the lab up (`make lab-up`). Uses the `lab` fixture of tests/lab_tests/conftest.py when
there is one; otherwise skips unless the node's netns and SSH key exist.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUN = os.path.join(TOP, "tests", "lab", ".run")
NETNS = "%s-kpro5" % os.environ.get("KPGS_LAB_ID", "kpgs")
A6000, HDMI_AUDIO = "10de:2230", "10de:1aef"


def _lab_is_up():
    if not os.path.exists(os.path.join(RUN, "ssh", "id_ed25519")):
        return False
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.split()[0] == NETNS for line in out.splitlines() if line.strip())


@pytest.fixture
def lab_up(request):
    try:
        return request.getfixturevalue("lab")
    except pytest.FixtureLookupError:
        if not _lab_is_up():
            pytest.skip("the lab is not up (make lab-up)")
        return None


def ansible_module(host, module, args="", extra=()):
    """Run an ad-hoc module with the checkout's ansible.cfg; return (rc, result dict)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0")
    cmd = [os.path.join(TOP, ".venv", "bin", "ansible"), host, "-m", module]
    if args:
        cmd += ["-a", args]
    cmd += list(extra)
    proc = subprocess.run(cmd, cwd=TOP, env=env, capture_output=True, text=True, timeout=300, check=False)
    head, sep, body = proc.stdout.partition(" => ")
    assert sep, "no result in ansible output:\n%s\n%s" % (proc.stdout, proc.stderr)
    return proc.returncode, json.loads(body[:body.rindex("}") + 1])


def test_gpu_facts_reports_both_a6000_and_audio_on_vfio(lab_up):
    rc, r = ansible_module("kpro5", "kpro.gpu_serving.gpu_facts")
    assert rc == 0, r
    assert r["changed"] is False
    gpus = [g for g in r["gpus"] if g["id"] == A6000]
    audio = [g for g in r["gpus"] if g["id"] == HDMI_AUDIO]
    assert len(gpus) == 2 and len(audio) == 2, r["gpus"]
    for g in gpus + audio:
        assert g["driver"] == "vfio-pci", g
        assert g["iommu_group"] is not None and g["bdf"] in g["iommu_group_members"]
    for g in gpus:
        assert g["name"] == "NVIDIA RTX A6000" and g["selected_by"] == "id"
        sibling = g["slot"] + ".1"
        assert sibling in [a["bdf"] for a in audio]
        assert sibling in g["iommu_group_members"]
    # both GPUs on vfio-pci: the nvidia driver cannot see them (named state, not a failure)
    assert r["nvml"]["available"] is False or r["nvml"].get("gpu_count") == 0
    assert r["ansible_facts"]["kpro_gpus"]["drivers"] == r["drivers"]


def test_gpu_facts_selection_by_id_in_check_mode(lab_up):
    rc, r = ansible_module("kpro5", "kpro.gpu_serving.gpu_facts", "vendor_device_ids=10de:2230 nvml=false", extra=["--check"])
    assert rc == 0, r
    assert sorted(set(g["id"] for g in r["gpus"])) == [HDMI_AUDIO, A6000]
    assert r["source"] == "none"
