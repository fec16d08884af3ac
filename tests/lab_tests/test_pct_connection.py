# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kpro.gpu_serving.pct for real: OpenSSH to the lab node kpro5 (one shared connection), then `pct exec 129`.

Needs the lab with container 129 (skips when `pct status 129` does not say running). Runs the
real ansible CLI with and without pipelining: ping, a tricky command, copy (put_file), fetch
(fetch_file), check of the host-key policy (an empty known_hosts is refused), the standard
connection variables (ansible_user, ansible_private_key_file) and the shared connection.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SSH_DIR = os.path.join(TOP, "tests", "lab", ".run", "ssh")
ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")
VMID = 129


@pytest.fixture(scope="module")
def ct(lab, tmp_path_factory):
    r = lab.ssh("pct status %d" % VMID, check=False)
    if r.returncode != 0 or "running" not in r.stdout:
        pytest.skip("container %d is not running in the lab (pct status: %s)" % (VMID, (r.stdout + r.stderr).strip()))
    root = tmp_path_factory.mktemp("pct")
    return root


def inventory(root, **extra):
    host = {"ansible_connection": "kpro.gpu_serving.pct", "pct_host": "10.213.5.2", "pct_vmid": VMID,
            "pct_private_key_file": os.path.join(SSH_DIR, "id_ed25519"),
            "pct_known_hosts_file": os.path.join(SSH_DIR, "known_hosts"),
            "ansible_python_interpreter": "/usr/bin/python3"}
    host.update(extra)
    host = {k: v for k, v in host.items() if v is not None}
    path = root / ("inv-%d.json" % len(os.listdir(str(root))))
    path.write_text(json.dumps({"all": {"hosts": {"ct129": host}}}))
    return str(path)


def ansible(inv, module, args=None, check=True):
    argv = [ANSIBLE, "-i", inv, "ct129", "-m", module, "-o"] + (["-a", args] if args is not None else [])
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    p = subprocess.run(argv, cwd=TOP, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


@pytest.mark.parametrize("pipelining", [True, False])
def test_ping_command_copy_fetch(ct, pipelining):
    inv = inventory(ct, ansible_pipelining=pipelining)
    assert "pong" in ansible(inv, "ansible.builtin.ping").stdout
    out = ansible(inv, "ansible.builtin.shell", "printf '%s|' \"a b\" 'c\"d' $((2+3)) ~").stdout
    assert 'a b|c"d|5|/root|' in out
    src = ct / ("payload-%s" % pipelining)
    src.write_bytes(os.urandom(200000))
    ansible(inv, "ansible.builtin.copy", "src=%s dest=/tmp/kpro-pct-test mode=0600" % src)
    back = ct / ("back-%s" % pipelining)
    ansible(inv, "ansible.builtin.fetch", "src=/tmp/kpro-pct-test dest=%s flat=true" % back)
    assert back.read_bytes() == src.read_bytes()
    # it really is the container: its own hostname, not the node's
    assert "kpro5" not in ansible(inv, "ansible.builtin.command", "cat /etc/hostname").stdout.split(">>")[-1]


def test_standard_variables_and_one_shared_connection(ct):
    cp = ct / "cp"
    inv = inventory(ct, pct_user=None, pct_private_key_file=None, ansible_user="root",
                    ansible_private_key_file=os.path.join(SSH_DIR, "id_ed25519"), pct_control_path_dir=str(cp))
    assert "kpro5" not in ansible(inv, "ansible.builtin.command", "cat /etc/hostname").stdout.split(">>")[-1]
    sockets = [p for p in os.listdir(str(cp)) if p.startswith("pct-")]
    assert len(sockets) == 1
    # the next task goes through the same SSH connection: the master is still there and answers
    ansible(inv, "ansible.builtin.ping")
    r = subprocess.run(["ssh", "-o", "ControlPath=" + str(cp / sockets[0]), "-O", "check", "10.213.5.2"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    subprocess.run(["ssh", "-o", "ControlPath=" + str(cp / sockets[0]), "-O", "exit", "10.213.5.2"], capture_output=True, check=False)


def test_unknown_host_key_is_refused(ct):
    empty = ct / "empty_known_hosts"
    empty.write_text("")
    p = ansible(inventory(ct, pct_known_hosts_file=str(empty)), "ansible.builtin.ping", check=False)
    assert p.returncode != 0 and "UNREACHABLE" in p.stdout and "ssh-keyscan" in p.stdout


def test_wrong_vmid_is_unreachable(ct):
    p = ansible(inventory(ct, pct_vmid=999), "ansible.builtin.ping", check=False)
    assert p.returncode != 0 and "UNREACHABLE" in p.stdout
