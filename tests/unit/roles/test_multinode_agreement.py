# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The multi-node agreement check reads the options each node runs with (issue 29), resolved by Ansible itself.

The playbook's own plan play (read from playbooks/deploy.yml) runs over local hosts: two containers of
one multi-node server whose TP sizes differ only through roles/shared's sglang_install_tp, the recommended way (the
serve stage's tp_size follows it), are refused before anything changes; the same TP on both passes. No host is
contacted (every host is ansible_connection local, and the plan play only sets facts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLAYBOOK = os.path.join(TOP, "playbooks", "deploy.yml")  # the migration imports it
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")

pytestmark = pytest.mark.skipif(not os.access(ANSIBLE_PLAYBOOK, os.X_OK), reason="needs the checkout's .venv (ansible-playbook)")

SERVER = {"nnodes": 2, "dist_init_addr": "192.0.2.31:20000"}


def _plan_play():
    with open(PLAYBOOK) as f:
        plays = yaml.safe_load(f)
    return [p for p in plays if p["name"].startswith("The rollout")]


def _run(tmp, ct_vars):
    """The plan play over two Proxmox hosts, each with one container of the server (``ct_vars``: each one's own)."""
    hosts = {"proxmox_hosts": {"hosts": {"gpu-c": {}, "gpu-d": {}}},
             "gpu_containers": {"hosts": dict((name, dict({"pve_node_host": host, "pve_vmid": 301 + rank,
                                                           "sglang_server_options": dict(SERVER, node_rank=rank)}, **ct_vars[rank]))
                                              for rank, (name, host) in enumerate((("ct301", "gpu-c"), ("ct302", "gpu-d"))))}}
    (tmp / "inventory.json").write_text(json.dumps({"all": {"vars": {"ansible_connection": "local"}, "children": hosts}}))
    (tmp / "play.json").write_text(json.dumps(_plan_play()))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"))
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.json"), str(tmp / "play.json")],
                          cwd=TOP, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_two_nodes_with_different_tp_through_roles_shared_are_refused(tmp_path):
    r = _run(tmp_path, [{"sglang_install_tp": 4}, {"sglang_install_tp": 2}])
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-2000:]
    assert "the multi-node server at 192.0.2.31:20000: tp_size differs between the nodes (ct301=4, ct302=2)" in r.stdout, r.stdout[-3000:]


def test_a_served_model_name_set_on_one_node_only_is_refused(tmp_path):
    r = _run(tmp_path, [{"sglang_install_tp": 4, "sglang_server_served_model_name": "a"}, {"sglang_install_tp": 4}])
    assert r.returncode == 2, r.stdout[-3000:]
    assert "served_model_name differs between the nodes (ct301=a, ct302=qwen3.6-27b)" in r.stdout, r.stdout[-3000:]


def test_the_same_tp_through_roles_shared_passes(tmp_path):
    r = _run(tmp_path, [{"sglang_install_tp": 4}, {"sglang_install_tp": 4}])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "differs between the nodes" not in r.stdout
