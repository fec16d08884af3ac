# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_host's reboot path (roles/gpu_host/tasks/reboot.yml): after the reboot, the running kernel must be the one the
stage expected to boot (gpu_host_driver.next_boot_kernel), checked before NVML.

The two tasks that read and compare the kernel are taken from reboot.yml as written and run by ansible-playbook on
this machine (connection local; /proc/sys/kernel/osrelease is only read): one host expects the kernel this machine runs, the other
another one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
OTHER = "6.8.12-10-pve"
with open("/proc/sys/kernel/osrelease") as _f:
    RUNNING = _f.read().strip()

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason="needs the checkout's .venv (ansible-playbook)")


def _reboot_block():
    """reboot.yml's tasks (main.yml includes the file only when a reboot into a pending kernel is allowed and due)."""
    with open(os.path.join(TOP, "roles", "gpu_host", "tasks", "reboot.yml")) as f:
        return list(yaml.safe_load(f))


def _kernel_tasks(tasks):
    """The tasks between the reboot and the NVML check."""
    names = [next(iter(k for k in t if k.startswith("ansible.builtin.") or k.startswith("kpro."))) for t in tasks]
    start, nvml = names.index("ansible.builtin.reboot"), names.index("kpro.gpu_serving.gpu_facts")
    return tasks[start + 1:nvml]


def test_the_kernel_is_checked_right_after_the_reboot_before_nvml():
    kernel = _kernel_tasks(_reboot_block())
    assert [next(k for k in t if k.startswith("ansible.builtin.")) for t in kernel] == ["ansible.builtin.slurp", "ansible.builtin.assert"]
    assert "gpu_host_driver.next_boot_kernel" in kernel[1]["ansible.builtin.assert"]["that"]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reboot")
    inv = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}, "hosts": {
        "same": {"gpu_host_driver": {"next_boot_kernel": RUNNING, "kernel_release": "6.8.12-9-pve"}},
        "other": {"gpu_host_driver": {"next_boot_kernel": OTHER, "kernel_release": "6.8.12-9-pve"}},
    }}}
    play = [{"hosts": "all", "gather_facts": False, "tasks": _kernel_tasks(_reboot_block()) + [
        {"name": "PASSED", "ansible.builtin.debug": {"msg": "PASSED"}}]}]
    (tmp / "inventory.json").write_text(json.dumps(inv))
    (tmp / "play.json").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"))
    p = subprocess.run([PLAYBOOK, "-i", str(tmp / "inventory.json"), str(tmp / "play.json")],
                       cwd=TOP, env=env, capture_output=True, text=True, timeout=300, check=False)
    return p.returncode, p.stdout + p.stderr


def test_the_expected_kernel_passes(outcome):
    rc, out = outcome
    assert 'ok: [same] => {\n    "msg": "PASSED"\n}' in out, out[-4000:]


def test_another_kernel_fails_naming_both_and_the_pin(outcome):
    rc, out = outcome
    assert rc != 0 and "fatal: [other]" in out, out[-4000:]
    msg = out[out.index("fatal: [other]"):]
    assert "rebooted into kernel %s, not %s" % (RUNNING, OTHER) in msg
    assert "proxmox-boot-tool kernel pin %s" % OTHER in msg and "GRUB_DEFAULT" in msg
    assert 'ok: [other] => {\n    "msg": "PASSED"' not in out
