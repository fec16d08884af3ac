"""Issue 28, the Proxmox API token as PVE really checks it, in the lab (the API stand-in enforces pve-access-control's
permission model: tests/lab/rootfs/usr/lib/kpro-lab/pve/access.py):

a. a privilege-separated token with VM.Audit but not VM.PowerMgmt on /vms/129, made with the node's pveum: the whole
   playbook stops at kpro5's preflight, which names VM.PowerMgmt, /vms/129 and the pveum command that grants it; the
   node's disk and the lab state are as they were.
b. the lab's own token (root@pam!ansible, no privilege separation) passes the preflight, which names it for what it
   is: every privilege.
c. the README's pveum commands, run verbatim on the node (the existing root@pam!ansible removed first, as the README
   says): the preflight accepts the new token, and the host and lxc_gpu stages run with it; CT 129 is shut down and
   started through the API by that token (its tasks in PVE's task list).

The secrets go to ansible-playbook in a 0600 vars file, never on its command line, and never appear in its output.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import REPO, labctl
from test_gpu_host_stage import disk_digest, play, recap

README = os.path.join(REPO, "README.md")
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


@pytest.fixture(scope="module")
def node(lab):
    """A fresh node; the lab tests after these expect a node as booted, with the lab's own token."""
    labctl("reset")
    yield lab
    labctl("reset")


def token_vars(tmp_path, name, secret):
    path = tmp_path / "token.json"
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"pve_api_token_id": name, "pve_api_token_secret": secret}, f)
    return "@" + str(path)


def flat(out):
    return " ".join(out.split())  # the yaml callback folds long messages


def readme_pveum_commands():
    """The commands of the README's block under "The API token", as an operator copies them."""
    with open(README) as f:
        text = f.read()
    block = text.split("**The API token.**", 1)[1].split("\n\n")[1]
    cmds = [line.strip() for line in block.splitlines() if line.strip()]
    assert cmds and all(c.startswith("pveum ") for c in cmds), block
    return cmds


def ct_tasks(lab):
    r = lab.exec("pvesh", "get", "/nodes/kpro5/tasks", "--output-format", "json")
    return {t["upid"]: t for t in json.loads(r.stdout) if t.get("id") == "129"}


def test_a_token_without_powermgmt_is_refused_before_anything_changes(node, tmp_path):
    lab = node
    lab.exec("pveum", "role", "add", "KproAuditOnly", "--privs", "VM.Audit")
    r = lab.exec("pveum", "user", "token", "add", "root@pam", "weak", "--privsep", "1", "--output-format", "json")
    secret = json.loads(r.stdout)["value"]
    lab.exec("pveum", "acl", "modify", "/vms/129", "--tokens", "root@pam!weak", "--roles", "KproAuditOnly")
    disk, state = disk_digest(), lab.state()

    r = play("-e", token_vars(tmp_path, "weak", secret))
    assert recap(r.stdout)["failed"] == 1 and recap(r.stdout)["changed"] == 0, r.stdout[-3000:]
    assert recap(r.stdout, "ct129")["changed"] == 0, r.stdout[-3000:]
    print("\n".join(line for line in r.stdout.splitlines() if "lacks" in line or "pveum" in line))
    out = flat(r.stdout)
    assert "The API token root@pam!weak lacks VM.PowerMgmt on /vms/129 (to shut down and start CT 129)" in out, out[-3000:]
    assert "pveum acl modify /vms/129 --tokens 'root@pam!weak' --roles KproGpuServing" in out
    assert "lacks VM.Audit" not in out  # it has that one
    assert "TASK [kpro.gpu_serving.gpu_host" not in r.stdout  # the host stage never started
    assert secret not in r.stdout
    assert disk_digest() == disk
    after = lab.state()
    for key in ("guests", "pci", "nvidia", "boot", "kernel"):
        assert after.get(key) == state.get(key), key


def test_the_labs_root_token_without_separation_is_named_for_what_it_is(node):
    r = play("--tags", "preflight")
    assert recap(r.stdout)["failed"] == 0, r.stdout[-3000:]
    assert ("The API token root@pam!ansible has every privilege (Permissions.Modify on /): a root@pam token without "
            "privilege separation (--privsep 0) has every right root@pam has") in flat(r.stdout)


def test_the_readme_commands_make_a_token_the_run_accepts(node, tmp_path):
    lab = node
    lab.exec("pveum", "user", "token", "remove", "root@pam", "ansible")  # the README: an existing token goes first
    secret = None
    for cmd in readme_pveum_commands():
        r = lab.exec("/bin/sh", "-c", cmd, check=False)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        if " token add " in cmd:
            secret = UUID.search(r.stdout).group(0)  # the table's `value` row
    perms = lab.exec("pveum", "user", "token", "permissions", "root@pam", "ansible", "--path", "/", "--output-format",
                     "json")
    assert json.loads(perms.stdout) == {"/": {}}  # privilege-separated: nothing beyond its ACL
    before = ct_tasks(lab)

    r = play("--tags", "gpu_host,lxc_gpu", "-e", token_vars(tmp_path, "ansible", secret))
    assert recap(r.stdout)["failed"] == 0 and recap(r.stdout)["changed"] > 0, r.stdout[-3000:]
    assert "has every privilege" not in r.stdout and "lacks VM." not in r.stdout
    assert secret not in r.stdout
    new = [t for upid, t in ct_tasks(lab).items() if upid not in before]
    assert {(t["type"], t["user"], t["status"]) for t in new} >= {("vzshutdown", "root@pam!ansible", "OK"),
                                                                  ("vzstart", "root@pam!ansible", "OK")}, new
    assert lab.state()["guests"]["129"]["status"] == "running"
