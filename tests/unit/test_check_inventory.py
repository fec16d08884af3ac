# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/check-inventory.yml (make check-inventory), run for real with the checkout's ansible-playbook: offline,
on the controller only.

(a) a copy of inventories/kpro with the example vault as a plain vault.yml: it fails and lists exactly what an operator
    still has to fill in; without a vault it names the vault variables to add;
(b) a clean inventory shaped like the lab's, with literal values: it passes;
and no run opens a connection: ssh (ANSIBLE_SSH_EXECUTABLE, which the ssh and kpro.gpu_serving.pct connections run,
and an ``ssh`` first on PATH) is a script that records its calls and never connects; a control run of an ad hoc ping
over the clean inventory's documentation addresses shows the recorder does see a connection attempt.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KPRO = os.path.join(TOP, "inventories", "kpro")
PLAYBOOK = os.path.join(TOP, "playbooks", "check-inventory.yml")
BIN = os.path.dirname(sys.executable)
COMMIT = "6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5"

pytestmark = pytest.mark.skipif(not os.access(os.path.join(BIN, "ansible-playbook"), os.X_OK),
                                reason="needs the checkout's .venv (ansible-playbook)")


@pytest.fixture
def ssh_recorder(tmp_path):
    """An ssh that records each call and exits 255 (what ssh returns when it cannot connect), sending nothing."""
    d = tmp_path / "fake-bin"
    d.mkdir()
    calls = tmp_path / "ssh.calls"
    script = d / "ssh"
    script.write_text("#!/bin/sh\necho \"$0 $*\" >> %s\nexit 255\n" % calls)
    script.chmod(0o755)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_SSH_EXECUTABLE=str(script),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), PATH="%s:%s" % (d, os.environ.get("PATH", "")))
    env.pop("ANSIBLE_INVENTORY", None)
    return env, calls


def check(env, inventory, *args):
    return subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), PLAYBOOK] + list(args),
                          cwd=TOP, env=env, capture_output=True, text=True, timeout=300, check=False)


def report(stdout):
    """The report's lines: the last msg of the run (a block of lines, or one line)."""
    blocks = re.findall(r"^    msg: \|-\n((?:        .*\n?)+)", stdout, re.M)
    if blocks:
        return [line[8:] for line in blocks[-1].rstrip("\n").split("\n")]
    return re.findall(r"^    msg: '?(.*?)'?$", stdout, re.M)[-1:]


def kpro_copy(tmp_path, vault=True):
    inv = tmp_path / "kpro"
    shutil.copytree(KPRO, inv, ignore=shutil.ignore_patterns("vault.yml", "files"))
    if vault:
        shutil.copy(os.path.join(KPRO, "group_vars", "all", "vault.yml.example"), inv / "group_vars" / "all" / "vault.yml")
    return inv


def kpro_lines(inv):
    vault = "ansible-vault edit %s/group_vars/all/vault.yml" % inv
    nvidia = "https://us.download.nvidia.com/XFree86/Linux-x86_64/580.126.09/NVIDIA-Linux-x86_64-580.126.09.run"
    return {
        "ca": "kpro5: pve_api_ca_path: {0}/files/pve-root-ca.pem does not exist on the controller - copy the node's "
              "/etc/pve/pve-root-ca.pem there (scp root@<node>:/etc/pve/pve-root-ca.pem {0}/files/pve-root-ca.pem)".format(inv),
        "host_checksum": "kpro5: gpu_host_driver_checksum: missing, and the installer is downloaded from %s - set it to "
                         "\"sha256:<64 hex digits>\" (sha256sum NVIDIA-Linux-x86_64-580.126.09.run), or copy the installer "
                         "from the controller with gpu_host_driver_src" % nvidia,
        "ct_checksum": "ct129: gpu_container_driver_checksum: missing, and the installer is downloaded from NVIDIA's server "
                       "(the installer of the host's driver version) - set it to \"sha256:<64 hex digits>\" (sha256sum "
                       "NVIDIA-Linux-x86_64-<version>.run), or copy the installer from the controller with "
                       "gpu_container_driver_src",
        "secret": "kpro5: pve_api_token_secret: is the example's placeholder, not a real value - put the token's secret "
                  "(vault_pve_api_token_secret; `pveum user token add` shows it once) in the vault (%s)" % vault,
        "api_key": "ct129: sglang_server_api_key: is the example's placeholder, not a real value - put a key of your own "
                   "(vault_sglang_api_key) in the vault (%s)" % vault,
        "vault_secret": "kpro5: vault_pve_api_token_secret: undefined (pve_api_token_secret reads it) - add it to "
                        "group_vars/all/vault.yml (%s)" % vault,
        "vault_api_key": "ct129: vault_sglang_api_key: undefined (sglang_server_api_key reads it) - add it to "
                         "group_vars/all/vault.yml (%s)" % vault,
        "python": "ct129: sglang_install_python: /usr/bin/python3: its version is not known offline; SGLang 0.5.11 has "
                  "locks for Python 3.11, 3.12, 3.13 - the preflight reads the container's Python; name it "
                  "(/usr/bin/python3.X) to check it here",
        "revision": "ct129: model_revision: 'main' is a branch or tag, not a commit - pin the commit: curl -s "
                    "https://huggingface.co/api/models/Qwen/Qwen3.6-27B/revision/main | jq -r .sha (the first run "
                    "reports it too)",
    }


def test_the_kpro_inventory_with_the_example_vault_lists_what_is_left_to_fill_in(tmp_path, ssh_recorder):
    env, calls = ssh_recorder
    inv = kpro_copy(tmp_path)
    r = check(env, inv)
    want = kpro_lines(inv)
    assert r.returncode != 0, r.stdout[-4000:]
    assert report(r.stdout) == [
        "5 problem(s) to fix before the run:",
        want["secret"], want["ca"], want["host_checksum"], want["ct_checksum"], want["api_key"],
        "warnings (not blocking):",
        want["python"], want["revision"]], r.stdout[-6000:]
    # the hub token is optional (public model): the example sets none, and none is no problem
    assert "hf_token" not in r.stdout and "_OmitType" not in r.stdout + r.stderr
    assert not calls.exists(), calls.read_text()


def test_without_a_vault_the_vault_variables_to_add_are_named(tmp_path, ssh_recorder):
    env, calls = ssh_recorder
    inv = kpro_copy(tmp_path, vault=False)
    r = check(env, inv)
    want = kpro_lines(inv)
    assert r.returncode != 0
    assert report(r.stdout)[:6] == ["5 problem(s) to fix before the run:", want["vault_secret"], want["ca"],
                                    want["host_checksum"], want["vault_api_key"], want["ct_checksum"]], r.stdout[-6000:]
    assert not calls.exists(), calls.read_text()


def clean_inventory(tmp_path):
    """Shaped like inventories/lab (a node and its container reached with pct, the installer copied from the
    controller), with literal values and files of its own."""
    inv = tmp_path / "clean"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "files").mkdir()
    (inv / "files" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (inv / "files" / "NVIDIA-Linux-x86_64-580.126.09.run").write_text("#!/bin/sh\n")
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    proxmox_hosts:\n      hosts:\n        kpro5:\n          ansible_host: 192.0.2.5\n"
        "    gpu_containers:\n      hosts:\n        ct129:\n          pve_node_host: kpro5\n          pve_vmid: 129\n")
    (inv / "group_vars" / "all" / "vault.yml").write_text(
        "vault_pve_api_token_secret: 3f8c2a91-5b7e-4d0c-9a6f-1e2d3c4b5a69\nvault_sglang_api_key: a-key-of-the-site-0123\n")
    (inv / "group_vars" / "proxmox_hosts.yml").write_text(
        "ansible_user: root\n"
        "pve_api_host: \"{{ hostvars[pve_node_host | default(inventory_hostname)].ansible_host }}\"\n"
        "pve_api_user: root@pam\npve_api_token_id: ansible\n"
        "pve_api_token_secret: \"{{ vault_pve_api_token_secret }}\"\npve_api_validate_certs: true\n"
        "pve_api_ca_path: \"{{ inventory_dir }}/files/ca.pem\"\npve_node: kpro5\n"
        "gpu_host_driver_src: \"{{ inventory_dir }}/files/NVIDIA-Linux-x86_64-580.126.09.run\"\n"
        "gpu_host_driver_checksum: \"sha256:%s\"\n" % ("ab" * 32))
    (inv / "group_vars" / "gpu_containers.yml").write_text(
        "ansible_connection: kpro.gpu_serving.pct\npct_host: \"{{ hostvars[pve_node_host].ansible_host }}\"\n"
        "pct_user: root\ngpu_container_driver_src: \"{{ inventory_dir }}/files/NVIDIA-Linux-x86_64-580.126.09.run\"\n"
        "sglang_install_version: \"0.5.11\"\nsglang_install_python: /usr/bin/python3.11\n"
        "model_repo_id: Qwen/Qwen3.6-27B\nmodel_revision: %s\n"
        "hf_token: \"{{ vault_hf_token | default('') }}\"\nsglang_server_api_key: \"{{ vault_sglang_api_key }}\"\n" % COMMIT)
    return inv


def test_a_clean_inventory_passes_and_nothing_connects(tmp_path, ssh_recorder):
    env, calls = ssh_recorder
    inv = clean_inventory(tmp_path)
    r = check(env, inv, "-vvv")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert report(r.stdout) == ["2 host(s) checked: no problem."], r.stdout[-4000:]
    assert not calls.exists(), calls.read_text()
    # -vvv shows every connection a task opens: none but the local one, if any
    assert not re.search(r"ESTABLISH (?!LOCAL)", r.stdout), re.findall(r".*ESTABLISH.*", r.stdout)
    # the control: the same inventory, a task that does connect, is seen by the recorder (and goes nowhere)
    ping = subprocess.run([os.path.join(BIN, "ansible"), "-i", str(inv), "all", "-m", "ansible.builtin.ping",
                           "-e", "pct_control_persist=no", "-T", "5"], cwd=TOP, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert ping.returncode != 0
    recorded = calls.read_text()
    assert "192.0.2.5" in recorded, recorded + ping.stdout[-2000:]


def test_the_old_omit_default_of_the_token_is_reported_not_crashed_on(tmp_path, ssh_recorder):
    env, calls = ssh_recorder
    inv = clean_inventory(tmp_path)
    gv = inv / "group_vars" / "gpu_containers.yml"
    text = gv.read_text().replace("default('')", "default(omit)").replace("model_revision: " + COMMIT, "model_revision: main")
    gv.write_text(text + "pct_host: 192.0.2.6\n")
    r = check(env, inv)
    assert r.returncode != 0
    lines = report(r.stdout)
    assert lines[:3] == [
        "2 problem(s) to fix before the run:",
        "ct129: hf_token: resolves to omit (default(omit) outside a module's argument: its readers fail on it) - default "
        "it to '' instead of omit",
        "ct129: pct_host: 192.0.2.6 is not kpro5's address 192.0.2.5 - derive it from the node: "
        "pct_host: \"{{ hostvars[pve_node_host].ansible_host }}\""], r.stdout[-4000:]
    assert lines[3:] == ["warnings (not blocking):", "ct129: model_revision: 'main' is a branch or tag, not a commit - pin "
                         "the commit: curl -s https://huggingface.co/api/models/Qwen/Qwen3.6-27B/revision/main | jq -r "
                         ".sha (the first run reports it too)"]
    assert not calls.exists(), calls.read_text()


def _preflight_task(tasks_file, name_start):
    with open(os.path.join(TOP, "roles", "preflight", "tasks", tasks_file)) as f:
        return next(t for t in yaml.safe_load(f) if t["name"].startswith(name_start))


def test_the_preflight_refuses_the_same_inputs_before_reaching_a_host(tmp_path, ssh_recorder):
    """The preflight's input tasks (its first on each side) as written in roles/preflight/tasks, with the role's vars,
    over local hosts: a bad host is refused with the check's lines, a good one passes; nothing connects."""
    env, calls = ssh_recorder
    run = tmp_path / "NVIDIA-Linux-x86_64-580.126.09.run"
    run.write_text("#!/bin/sh\n")
    good_ct = {"model_revision": COMMIT, "sglang_server_api_key": "a-key-of-the-site-0123", "hf_token": "",
               "gpu_container_driver_src": str(run)}
    inv = {"all": {"vars": {"ansible_connection": "local"}, "children": {
        "proxmox_hosts": {"hosts": {"bad-node": {}, "good-node": {"gpu_host_driver_src": str(run)}}},
        "gpu_containers": {"hosts": {
            "bad-ct": {"model_revision": "main", "sglang_server_api_key": "change-me",
                       "hf_token": "hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},
            "good-ct": good_ct}}}}}
    plays = [{"hosts": group, "gather_facts": False, "vars": {"role_path": os.path.join(TOP, "roles", "preflight")},
              "tasks": [{"name": "load", "ansible.builtin.import_role": {"name": "kpro.gpu_serving.preflight"}, "when": False},
                        _preflight_task(tasks_file, start)]}
             for group, tasks_file, start in (("proxmox_hosts", "main.yml", "The driver installer's inputs"),
                                              ("gpu_containers", "container.yml", "The container's inputs"))]
    (tmp_path / "inv.json").write_text(json.dumps(inv))
    (tmp_path / "play.json").write_text(json.dumps(plays))
    r = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inv.json"), str(tmp_path / "play.json")],
                       cwd=TOP, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout
    assert re.search(r"^ok: \[good-node\]", out, re.M) and re.search(r"^ok: \[good-ct\]", out, re.M), out[-4000:]
    assert re.search(r"^fatal: \[bad-node\]", out, re.M) and re.search(r"^fatal: \[bad-ct\]", out, re.M), out[-4000:]
    assert "bad-node: gpu_host_driver_checksum: missing, and the installer is downloaded from https://us.download.nvidia.com" in out
    assert "bad-ct: gpu_container_driver_checksum: missing" in out
    assert "bad-ct: hf_token: is the example's placeholder: the hub refuses it (401)" in out
    assert "bad-ct: sglang_server_api_key: is the example's placeholder" in out
    assert "model_revision" not in out            # a branch is the model stage's warning, not a refusal
    assert not calls.exists(), calls.read_text()
