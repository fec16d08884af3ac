# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's PVE management plane on kpro5, with the real proxmoxer over HTTPS and SSH.

Needs the lab up (``make lab-up``); skips otherwise. Mutating tests work on a scratch CT
(``SCRATCH_VMID``, a copy of 129's config created over SSH and removed afterwards), so CT 129
and the lab state other tests rely on are left as they were; read-only checks use 129.
Credentials: ``tests/lab/.run/pve-credentials.json`` (build.d/20-pve-pki.sh).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from test_gpu_facts import RUN, lab_up  # noqa: F401  (fixture re-used)

proxmoxer = pytest.importorskip("proxmoxer")
from proxmoxer.core import ResourceException  # noqa: E402
from proxmoxer.tools import Tasks  # noqa: E402

HOST = "10.213.5.2"
NODE = "kpro5"
SCRATCH_VMID = 1290
KEY = os.path.join(RUN, "ssh", "id_ed25519")
KNOWN_HOSTS = os.path.join(RUN, "ssh", "known_hosts")
CONF = "/etc/pve/lxc/%d.conf" % SCRATCH_VMID
DEVN_REFUSED = "Permission check failed (configuring device passthrough is only allowed for root@pam)"


def ssh(cmd, check=True):
    argv = ["ssh", "-i", KEY, "-o", "UserKnownHostsFile=" + KNOWN_HOSTS, "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "root@" + HOST, cmd]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert proc.returncode == 0, "%s: rc=%d\n%s%s" % (cmd, proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture
def cred(lab_up):  # noqa: F811
    path = os.path.join(RUN, "pve-credentials.json")
    if not os.path.exists(path):
        pytest.skip("%s missing: the lab was built without build.d/20-pve-pki.sh" % path)
    with open(path) as f:
        cred = json.load(f)
    if os.environ.get("KPGS_TEST_PVE_PORT"):  # a second API server on the node (testing a changed fake)
        cred["port"] = int(os.environ["KPGS_TEST_PVE_PORT"])
    return cred


@pytest.fixture
def token_api(cred):
    return proxmoxer.ProxmoxAPI(cred["host"], port=cred["port"], user=cred["token_user"], token_name=cred["token_name"],
                                token_value=cred["token_secret"], verify_ssl=cred["ca_path"], timeout=30)


@pytest.fixture
def ticket_api(cred):
    return proxmoxer.ProxmoxAPI(cred["host"], port=cred["port"], user=cred["user"], password=cred["password"],
                                verify_ssl=cred["ca_path"], timeout=30)


@pytest.fixture
def ssh_api(cred):
    # proxmoxer's SshParamikoSession takes no known_hosts (AutoAddPolicy); the collection's proxmox_api.connect
    # adds strict checking, see test_collection_connect_ssh_strict_known_hosts.
    return proxmoxer.ProxmoxAPI(cred["host"], backend="ssh_paramiko", user="root", private_key_file=KEY, port=22,
                                timeout=60)


@pytest.fixture
def scratch(cred):
    """CT SCRATCH_VMID: 129's config plus a comment line in the middle, stopped; removed afterwards."""
    ssh("set -e; pct status %d >/dev/null 2>&1 && pct stop %d >/dev/null 2>&1 || true; "
        "{ sed -n '1,/^\\[/p' /etc/pve/lxc/129.conf | sed '/^\\[/d;/^$/d;/^dev[0-9]*:/d;/^lock:/d;/^lxc\\./d'; "
        "echo '#note: added by test_pve_api'; echo 'lxc.apparmor.profile = unconfined'; echo 'hostname: pveapi'; } "
        "| awk '!/^hostname: / || /pveapi/' > %s.tmp.$$ && mv %s.tmp.$$ %s" % (SCRATCH_VMID, SCRATCH_VMID, CONF, CONF, CONF))
    yield SCRATCH_VMID
    ssh("pct stop %d >/dev/null 2>&1; rm -f %s; python3 -c %s" % (
        SCRATCH_VMID, CONF, shlex.quote(
            "import sys; sys.path.insert(0, '/usr/lib/kpro-lab'); import labstate\n"
            "with labstate.modify() as st:\n    st.get('guests', {}).pop('%d', None)\n" % SCRATCH_VMID)), check=False)


def conf_text():
    return ssh("cat %s" % CONF).stdout


def test_version_and_reads_with_token(token_api):
    assert token_api.version.get()["version"]
    assert NODE in [n["node"] for n in token_api.nodes.get()]
    assert 129 in [c["vmid"] for c in token_api.nodes(NODE).lxc.get()]
    st = token_api.nodes(NODE).lxc(129).status.current.get()
    assert st["status"] in ("running", "stopped") and st["vmid"] == 129
    conf = token_api.nodes(NODE).lxc(129).config.get()
    assert len(conf["digest"]) == 40 and conf["arch"] == "amd64"
    assert isinstance(token_api.nodes(NODE).qemu.get(), list)
    assert isinstance(token_api.cluster.mapping.pci.get(), list)


def test_unknown_vmid_message(token_api):
    with pytest.raises(ResourceException) as e:
        token_api.nodes(NODE).lxc(999).config.get()
    assert e.value.status_code == 500 and "Configuration file 'nodes/kpro5/lxc/999.conf' does not exist" in str(e.value)


def test_config_put_rewrites_pve_style(token_api, scratch):
    ct = token_api.nodes(NODE).lxc(scratch)
    digest = ct.config.get()["digest"]
    ct.config.put(cores=7, digest=digest)
    text = conf_text()
    lines = text.splitlines()
    assert lines[0].startswith("#")  # description first
    assert "#note%3A added by test_pve_api" in lines[:lines.index("arch: amd64")]
    assert "cores: 7" in lines
    main = text.split("\n[")[0].splitlines()
    keys = [ln.split(":")[0] for ln in main if not ln.startswith("#") and not ln.startswith("lxc.")]
    assert keys == sorted(keys)
    assert main[-1] == "lxc.apparmor.profile: unconfined"  # 'key = value' normalised, at the end of the section


def test_devn_token_refused_ticket_and_pct_accepted(token_api, ticket_api, scratch):
    ssh("test -c /dev/null")
    with pytest.raises(ResourceException) as e:
        token_api.nodes(NODE).lxc(scratch).config.put(dev0="/dev/null,mode=0666")
    assert e.value.status_code == 403 and DEVN_REFUSED in str(e.value)
    ticket_api.nodes(NODE).lxc(scratch).config.put(dev0="/dev/null,mode=0666")
    assert "dev0: /dev/null,mode=0666" in conf_text()
    r = ssh("pct set %d -dev1 /dev/zero,gid=44 --delete dev0" % scratch)
    assert r.returncode == 0
    text = conf_text()
    assert "dev1: /dev/zero,gid=44" in text and "dev0:" not in text
    r = ssh("pct set %d -dev2 /dev/kpgs-no-such-node" % scratch, check=False)
    assert r.returncode == 255 and "Device /dev/kpgs-no-such-node does not exist" in r.stderr
    with pytest.raises(ResourceException) as e:
        token_api.nodes(NODE).lxc(scratch).config.put(**{"lxc.cgroup2.devices.allow": "c 195:* rwm"})
    assert e.value.status_code == 400


def test_start_stop_upid_and_task_wait(token_api, scratch):
    ct = token_api.nodes(NODE).lxc(scratch)
    upid = ct.status.start.post()
    info = Tasks.decode_upid(upid)
    assert info["node"] == NODE and info["type"] == "vzstart" and info["id"] == str(scratch)
    st = Tasks.blocking_status(token_api, upid, timeout=60, polling_interval=0.5)
    assert st and st["status"] == "stopped" and st["exitstatus"] == "OK", st
    assert ct.status.current.get()["status"] == "running"
    st = Tasks.blocking_status(token_api, ct.status.stop.post(), timeout=60, polling_interval=0.5)
    assert st["exitstatus"] == "OK"
    assert ct.status.current.get()["status"] == "stopped"


def test_start_fails_on_missing_device_node(token_api, scratch):
    ssh("sed -i '1a dev0: /dev/kpgs-no-such-node' %s" % CONF)
    st = Tasks.blocking_status(token_api, token_api.nodes(NODE).lxc(scratch).status.start.post(), timeout=60,
                               polling_interval=0.5)
    assert st["exitstatus"] == "Device /dev/kpgs-no-such-node does not exist"
    assert token_api.nodes(NODE).lxc(scratch).status.current.get()["status"] == "stopped"


def test_locked_container_refused(token_api, scratch):
    ct = token_api.nodes(NODE).lxc(scratch)
    ct.config.put(lock="backup")
    with pytest.raises(ResourceException) as e:
        ct.config.put(cores=3)
    assert "CT is locked (backup)" in str(e.value)
    st = Tasks.blocking_status(token_api, ct.status.start.post(), timeout=60, polling_interval=0.5)
    assert st["exitstatus"] == "CT is locked (backup)"
    ssh("pct unlock %d" % scratch)
    assert "lock" not in ct.config.get()


def test_ssh_paramiko_backend_uses_pvesh(ssh_api, scratch):
    assert ssh_api.version.get()["version"]
    ct = ssh_api.nodes(NODE).lxc(scratch)
    ct.config.put(dev0="/dev/null")  # pvesh acts as root@pam
    assert "dev0: /dev/null" in conf_text()
    st = Tasks.blocking_status(ssh_api, ct.status.start.post(), timeout=60, polling_interval=0.5)
    assert st["exitstatus"] == "OK"
    with pytest.raises(ResourceException) as e:
        ct.status.start.post()
    assert "CT %d already running" % scratch in str(e.value)
    Tasks.blocking_status(ssh_api, ct.status.stop.post(), timeout=60, polling_interval=0.5)


def test_collection_connect_ssh_strict_known_hosts(cred):
    pytest.importorskip("ansible_collections.kpro.gpu_serving.plugins.module_utils.host.proxmox_api")
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api
    s = proxmox_api.connect(dict(api_backend="ssh_paramiko", api_host=cred["host"], ssh_private_key_file=KEY,
                                 ssh_known_hosts=KNOWN_HOSTS, ssh_host_key_checking=True, api_timeout=60))
    assert s.authuser == "root@pam"
    assert s.api.nodes(NODE).lxc(129).status.current.get()["vmid"] == 129
