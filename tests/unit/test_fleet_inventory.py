# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet: inventories/fleet-example and the rolling play, without a lab and without contacting any host.

The playbook runs over the example fleet with ``--tags always --skip-tags preflight``: only the rollout's own tasks
(the plan, the roles' argument checks, the per-host guard, the summaries) run, all on the controller. A host made to
fail (an invalid setting its role's argument check refuses) stops the rollout after its batch; the hosts before it
are done, the ones after are never touched, and the fleet's status shows every unit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FLEET = os.path.join(TOP, "inventories", "fleet-example")
PLAYBOOK = os.path.join(TOP, "playbooks", "migrate-kpro6-to-kpro5.yml")
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")

pytestmark = pytest.mark.skipif(not os.access(ANSIBLE_PLAYBOOK, os.X_OK), reason="needs the checkout's .venv (ansible-playbook)")


def play(inventory, *args, **extra_env):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default",
               **extra_env)
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", inventory, PLAYBOOK, "--tags", "always", "--skip-tags", "preflight",
                           "-e", "vault_pve_api_token_secret=x", "-e", "vault_sglang_api_key=y"] + list(args),
                          capture_output=True, text=True, env=env, timeout=300, cwd=TOP, check=False)


def fleet_with(tmp_path, host, line):
    """A copy of the example fleet with one more line in a host's variables."""
    inv = str(tmp_path / "fleet")
    shutil.copytree(FLEET, inv)
    with open(os.path.join(inv, "host_vars", host + ".yml"), "a") as f:
        f.write(line + "\n")
    return inv


def recap(out):
    return dict((m.group(1), (int(m.group(2)), int(m.group(3))))
                for m in re.finditer(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", out, re.M))


def batches(out):
    """The hosts of each run of the rollout play, in order."""
    runs = out.split("PLAY [Stages 1-7")[1:]
    return [sorted(set(re.findall(r"^(?:ok|skipping|fatal): \[([\w-]+)\]", r.split("PLAY [")[0], re.M))) for r in runs]


def test_the_example_inventory_uses_documentation_addresses_only():
    for root, _dirs, files in os.walk(FLEET):
        for name in files:
            with open(os.path.join(root, name)) as f:
                text = f.read()
            for addr in re.findall(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", text):
                assert addr.startswith(("192.0.2.", "198.51.100.", "203.0.113.")), (name, addr)


def test_the_two_node_server_has_ranks_0_and_1_and_one_init_address():
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_multinode as mn
    with open(os.path.join(FLEET, "hosts.yml")) as f:
        hosts = yaml.safe_load(f)["all"]["children"]["gpu_containers"]["children"]["two_node_server"]["hosts"]
    with open(os.path.join(FLEET, "group_vars", "two_node_server.yml")) as f:
        gv = yaml.safe_load(f)
    options = dict(gv["sglang_server_options"], tp_size=gv["sglang_install_tp"])  # as the role merges them
    members = dict((name, dict(options, node_rank=h["sglang_node_rank"])) for name, h in hosts.items())
    assert mn.group_problems(members) == []
    assert all(mn.problems(o) == [] for o in members.values())


def test_one_host_at_a_time_each_batch_a_host_with_its_containers():
    r = play(FLEET)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert batches(r.stdout) == [["ct201", "gpu-a"], ["ct202", "gpu-b"], ["ct301", "ct302", "gpu-c", "gpu-d"]]
    assert all(c == 0 and f == 0 for c, f in recap(r.stdout).values())
    assert "gpu-c + ct301 + gpu-d + ct302: serving" in r.stdout


def test_serial_from_the_variables():
    r = play(FLEET, "-e", "kpro_rollout_serial=0")
    assert r.returncode == 0, r.stdout[-3000:]
    assert batches(r.stdout) == [["ct201", "ct202", "ct301", "ct302", "gpu-a", "gpu-b", "gpu-c", "gpu-d"]]


def test_a_failed_host_stops_the_rollout_and_the_summary_shows_every_host(tmp_path):
    r = play(fleet_with(tmp_path, "ct202", "sglang_server_state: bogus"))
    assert r.returncode == 2
    assert batches(r.stdout) == [["ct201", "gpu-a"], ["ct202", "gpu-b"]]      # gpu-c/gpu-d never touched
    rc = recap(r.stdout)
    # gpu-c's part of the run: the plan play's read of its containers' options only (skipped on a Proxmox host)
    assert rc["ct202"][1] == 1 and rc["gpu-a"] == (0, 0) and rc["ct201"] == (0, 0) and rc.get("gpu-c", (0, 0)) == (0, 0)
    assert "gpu-a + ct201: serving" in r.stdout
    assert "gpu-b + ct202: FAILED on ct202" in r.stdout
    assert "gpu-c + ct301 + gpu-d + ct302: not touched (the rollout stopped before it)" in r.stdout
    assert "ct202 failed at" in r.stdout and "sglang_server_state" in r.stdout


def test_the_lab_inventory_is_one_batch_as_before():
    out = subprocess.run([ANSIBLE_PLAYBOOK, "-i", os.path.join(TOP, "inventories", "lab"), PLAYBOOK, "--list-tasks"],
                         capture_output=True, text=True, timeout=120, cwd=TOP, check=False,
                         env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"))).stdout
    plays = re.findall(r"play #\d+ \(([^)]*)\): ([^\t]*)", out)
    # one preflight play over the hosts and the containers (strategy free), the rollout's plan, the rollout
    assert [h for h, _n in plays] == ["proxmox_hosts:gpu_containers", "proxmox_hosts:gpu_containers", "kpro_rollout"]
    for tag in ("gpu_host", "lxc_gpu", "container", "gpu_container", "sglang_install", "model", "serve", "sglang_server"):
        assert "%s]" % tag in out or "%s," % tag in out, tag


def test_a_container_does_not_run_its_stages_after_its_host_failed(tmp_path):
    """The host fails in its own stages (gpu_host's argument check): while it is in the block's rescue Ansible does
    not count it failed yet, so the container's guard must read a fact the host sets only when its stages succeeded."""
    r = play(fleet_with(tmp_path, "gpu-b", "gpu_host_all_kernels: bogus"))
    assert r.returncode == 2
    assert batches(r.stdout) == [["ct201", "gpu-a"], ["ct202", "gpu-b"]]
    ct202 = r.stdout.split("PLAY [Stages 1-7")[2]
    ran = re.findall(r"^TASK \[(?:kpro\.gpu_serving\.)?([\w]+) : [^\]]*\][^\n]*\n(?:ok|changed|fatal): \[ct202\]", ct202, re.M)
    assert ran == [], ran           # no task of gpu_container, sglang_install, model or sglang_server ran on ct202
    assert "The Proxmox host gpu-b of this container failed its stages" in ct202
    assert "gpu-b + ct202: FAILED on gpu-b" in r.stdout
    rc = recap(r.stdout)
    assert rc["gpu-b"][1] == 1 and rc["ct202"][1] == 1 and rc.get("gpu-c", (0, 0)) == (0, 0)


def test_a_limited_run_plans_exactly_the_limited_units():
    r = play(FLEET, "--limit", "gpu-b:ct202")                     # docs/scaling.md
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert batches(r.stdout) == [["ct202", "gpu-b"]]
    assert set(recap(r.stdout)) == {"gpu-b", "ct202"}
    # the batches are made of the limited units only: two units, serial 2, one batch
    r = play(FLEET, "--limit", "gpu-a:ct201:gpu-c:ct301:gpu-d:ct302", "-e", "kpro_rollout_serial=2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert batches(r.stdout) == [["ct201", "ct301", "ct302", "gpu-a", "gpu-c", "gpu-d"]]
    assert "gpu-a + ct201: serving" in r.stdout and "gpu-c + ct301 + gpu-d + ct302: serving" in r.stdout
    assert "gpu-b" not in r.stdout


def test_the_plan_is_made_once():
    r = play(FLEET)
    plan = r.stdout.split("TASK [Plan the rollout of the hosts of this run]")[1].split("TASK [")[0]
    assert re.findall(r"^ok: \[([\w-]+)\]", plan, re.M) == ["gpu-a"], plan


@pytest.mark.parametrize("limit, missing", [("gpu-b", "gpu-b + ct202: name all of it (add ct202)"),
                                            ("ct202", "gpu-b + ct202: name all of it (add gpu-b)"),
                                            ("gpu-c:ct301", "gpu-c + ct301 + gpu-d + ct302: name all of it (add gpu-d:ct302)")])
def test_a_limit_naming_part_of_a_unit_is_refused(limit, missing):
    r = play(FLEET, "--limit", limit)
    assert r.returncode == 2, r.stdout[-3000:]
    assert "--limit names part of the rollout unit " + missing in r.stdout
    assert batches(r.stdout) == []                                 # the rollout play never ran
    # the plan's host fails (run_once); the others only had their options read
    assert [h for h, (_c, f) in recap(r.stdout).items() if f] == [limit.split(":")[0]]


def test_the_lab_inventory_runs_one_batch_with_changed_0(tmp_path):
    """The single-host lab inventory (its host given an address nothing listens on, its lab files stand-ins): the
    rollout's own tasks run as one batch, the host before its container, nothing changed."""
    inv = str(tmp_path / "lab")
    shutil.copytree(os.path.join(TOP, "inventories", "lab"), inv)
    with open(os.path.join(inv, "hosts.yml")) as f:
        text = f.read()
    with open(os.path.join(inv, "hosts.yml"), "w") as f:
        f.write(text.replace("ansible_host: 10.213.5.2", "ansible_host: 127.0.0.254\n          ansible_port: 9"))
    run = tmp_path / "run"
    (run / "build").mkdir(parents=True)
    (run / "pve-credentials.json").write_text("{}")
    (run / "hub-token").write_text("t")
    (run / "sglang-api-key").write_text("k")
    (run / "build" / "NVIDIA-Linux-x86_64-580.126.09.run.sha256").write_text("0" * 64 + "  x\n")
    r = play(inv, KPGS_LAB_RUN=str(run))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert batches(r.stdout) == [["ct129", "kpro5"]]
    assert recap(r.stdout) == {"kpro5": (0, 0), "ct129": (0, 0)}
    assert "TASK [kpro.gpu_serving.sglang_server : " in r.stdout.split("PLAY [Stages 1-7")[1]
