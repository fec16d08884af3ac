# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
from unittest import mock

import pytest
from ansible.module_utils import basic

from ansible_collections.kpro.gpu_serving.plugins.modules import lxc_gpu_passthrough as mod
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import lxc_config as lc

from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "lxc")
DEVICES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


@pytest.fixture
def env(tmp_path):
    cfg = tmp_path / "lxc"
    cfg.mkdir()
    for n in ("129.conf", "130.conf", "131.conf", "140.conf"):
        shutil.copy(os.path.join(FIX, n), str(cfg / n))
    (tmp_path / "proc").mkdir()
    shutil.copy(os.path.join(FIX, "proc_devices"), str(tmp_path / "proc" / "devices"))
    return tmp_path


def args(env, **kw):
    a = dict(vmid=129, config_dir=str(env / "lxc"), method="devN", devices=DEVICES, restart=False,
             proc_root=str(env), backup_dir=str(env / "bk"), lock_dir=str(env / "lock"))
    a.update(kw)
    return a


def digest(env):
    h = {}
    for root, dummy, files in os.walk(str(env)):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                h[p] = hashlib.sha256(fh.read()).hexdigest()
    return h


def ok(a, check_mode=False, diff=False):
    if diff:
        a = dict(a, _ansible_diff=True)
    with pytest.raises(AnsibleExitJson) as e:
        run_module(mod, a, check_mode=check_mode)
    return e.value.result


def failed(a):
    with pytest.raises(AnsibleFailJson) as e:
        run_module(mod, a)
    return e.value.result


def removed_added(before, after):
    r, a = [], []
    for d in difflib.ndiff(before.splitlines(), after.splitlines()):
        if d.startswith("- "):
            r.append(d[2:])
        elif d.startswith("+ "):
            a.append(d[2:])
    return r, a


@pytest.mark.parametrize("vmid,method", [(129, "devN"), (129, "lxc_raw"), (130, "devN"), (130, "lxc_raw"),
                                         (131, "devN"), (131, "lxc_raw")])
def test_changed_then_not_changed_only_owned_lines(env, vmid, method):
    path = env / "lxc" / ("%d.conf" % vmid)
    before = path.read_text()
    r1 = ok(args(env, vmid=vmid, method=method), diff=True)
    assert r1["changed"] and r1["writer"] == "file" and r1["restart_required"]
    after = path.read_text()
    assert r1["diff"]["before"] == before and r1["diff"]["after"] == after
    removed, added = removed_added(before, after)
    for line in removed + added:
        assert "/dev/nvidia" in line or line.startswith("lxc.cgroup2.devices.allow: c 195:") or \
            line.startswith("lxc.cgroup2.devices.allow: c 50"), line
    assert open(r1["backup_file"]).read() == before
    r2 = ok(args(env, vmid=vmid, method=method))
    assert not r2["changed"] and path.read_text() == after and "backup_file" not in r2


def test_devn_result_and_idmap_snapshots_kept(env):
    r = ok(args(env))
    assert r["devn"] == {"dev0": "/dev/nvidia0,mode=0666", "dev1": "/dev/nvidia1,mode=0666", "dev2": "/dev/nvidiactl,mode=0666",
                         "dev3": "/dev/nvidia-uvm,mode=0666", "dev4": "/dev/nvidia-uvm-tools,mode=0666"}
    text = (env / "lxc" / "129.conf").read_text()
    assert text.count("lxc.idmap:") == 6 + 4 and "[pve:pending]\ndelete: swap\nmemory: 196608\n" in text
    assert text.endswith(open(os.path.join(FIX, "129.conf")).read().split("\n[pve:pending]")[1])


def test_lxc_raw_uses_proc_devices_majors(env):
    r = ok(args(env, method="lxc_raw"))
    assert r["majors"]["nvidia-uvm"] == 509
    assert "lxc.cgroup2.devices.allow: c 509:* rwm" in r["lxc_lines"]


def test_check_mode_writes_nothing(env):
    h = digest(env)
    r = ok(args(env), check_mode=True, diff=True)
    assert r["changed"] and "dev0: /dev/nvidia0,mode=0666" in r["diff"]["after"]
    assert digest(env) == h and not (env / "bk").exists()


def test_no_backup(env):
    r = ok(args(env, backup=False))
    assert r["changed"] and "backup_file" not in r and not (env / "bk").exists()


def test_ad_hoc_style_list_string(env):
    # `devices=['/dev/nvidia0','/dev/nvidiactl']` in an ad hoc -a string arrives split on commas
    r = ok(args(env, devices=["['/dev/nvidia0'", "'/dev/nvidiactl']"]))
    assert sorted(r["devn"].values()) == ["/dev/nvidia0,mode=0666", "/dev/nvidiactl,mode=0666"]


def test_dev_gid_uid(env):
    r = ok(args(env, devices=["/dev/nvidia0"], dev_gid=44, dev_uid=0))
    assert r["devn"] == {"dev0": "/dev/nvidia0,gid=44,mode=0666,uid=0"}


# ------------------------------------------------------------------ bad input writes nothing


def assert_nothing_written(env, a, *needles):
    h = digest(env)
    r = failed(a)
    for n in needles:
        assert n in r["msg"], r["msg"]
    assert digest(env) == h
    assert not (env / "bk").exists()
    return r


def test_unknown_vmid(env):
    assert_nothing_written(env, args(env, vmid=999), "CT 999 does not exist here", "pct list")


def test_locked_container(env):
    assert_nothing_written(env, args(env, vmid=140), "CT 140 is locked (lock: backup)", "pct unlock 140", "nothing was written")


def test_missing_device_node_explicit(env):
    dev = env / "root" / "dev"
    dev.mkdir(parents=True)
    assert_nothing_written(env, args(env, dev_root=str(env / "root")), "Device /dev/nvidia0 does not exist")


def test_missing_uvm_on_discovery(env, monkeypatch):
    dev = env / "root" / "dev"
    dev.mkdir(parents=True)
    for n in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / n).write_text("")
    real = lc.stat_device

    def fake(path, dev_root="/"):
        if not os.path.exists(lc._host_path(dev_root, path)):
            return real(path, dev_root)
        return {"path": path, "major": 195, "minor": 0}
    monkeypatch.setattr(lc, "stat_device", fake)
    a = args(env, dev_root=str(env / "root"))
    del a["devices"]
    assert_nothing_written(env, a, "Device /dev/nvidia-uvm does not exist", "nvidia-modprobe -u -c=0")


def test_devn_with_api_token_refused(env):
    a = args(env, writer="api", api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x")
    assert_nothing_written(env, a, "devN can only be changed by root@pam; an API token (root@pam!ansible) is refused by PVE",
                           "method=lxc_raw")


def test_restart_without_connection(env):
    assert_nothing_written(env, args(env, restart=True), "restart=true needs a PVE API connection")


def test_bad_mode_and_gpus(env):
    assert_nothing_written(env, args(env, dev_mode="666"), "dev_mode")
    a = args(env, gpus=["zero"])
    del a["devices"]
    assert_nothing_written(env, a, "gpus must be GPU indices")


def test_invalid_device_path(env):
    assert_nothing_written(env, args(env, devices=["/etc/passwd"]), "not a valid device path")


# ------------------------------------------------------------------ restart through a fake API


def test_restart_when_changed_only(env, monkeypatch):
    calls = running_ct(monkeypatch, pid=None)
    a = args(env, restart=True, api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x")
    r = ok(a)
    assert r["changed"] and r["restarted"] and not r["restart_required"]
    assert calls == [("kpro5", 129, 180, 60)]
    r = ok(a)
    assert not r["changed"] and not r["restarted"] and len(calls) == 1


class FakeCt(object):
    """A container's power state behind the API calls the module makes."""

    def __init__(self, status):
        self.status = status
        self.calls = []

    def install(self, monkeypatch):
        from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa

        class S(object):
            backend = "https"
        monkeypatch.setattr(pa, "HAS_PROXMOXER", True)
        monkeypatch.setattr(pa, "connect", lambda p: S())
        monkeypatch.setattr(pa, "find_node", lambda s, v: "kpro5")
        monkeypatch.setattr(pa, "ct_status", lambda s, n, v: {"status": self.status})

        def start(s, n, v, t):
            self.calls.append(("start", n, v))
            self.status = "running"
            return {"exitstatus": "OK"}

        def restart(s, n, v, t, st):
            if self.status != "running":
                return []
            self.calls.append(("restart", n, v))
            return [{"exitstatus": "OK"}] * 2
        monkeypatch.setattr(pa, "ct_start", start)
        monkeypatch.setattr(pa, "ct_restart", restart)
        return self


def test_ensure_running_starts_a_stopped_container_once(env, monkeypatch):
    ct = FakeCt("stopped").install(monkeypatch)
    a = args(env, restart=True, ensure_running=True, api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x")
    # check mode: the config change and the start are reported, nothing is done
    before = digest(env)
    r = ok(a, check_mode=True)
    assert r["changed"] and ct.calls == [] and ct.status == "stopped" and digest(env) == before
    # the config is written, then the stopped container is started (which applies it): no restart needed
    r = ok(a)
    assert r["changed"] and r["started"] and not r["restarted"] and not r["restart_required"] and r["status"] == "running"
    assert ct.calls == [("start", "kpro5", 129)]
    # running and converged: nothing to do
    r = ok(a)
    assert not r["changed"] and not r["started"] and r["status"] == "running" and len(ct.calls) == 1
    # stopped again with the config already right: started, and only that
    ct.status = "stopped"
    r = ok(a)
    assert r["changed"] and r["started"] and r["devn_set"] == {} and ct.calls[-1] == ("start", "kpro5", 129)


def test_without_ensure_running_a_stopped_container_stays_stopped(env, monkeypatch):
    ct = FakeCt("stopped").install(monkeypatch)
    warned = []
    monkeypatch.setattr(mod.AnsibleModule, "warn", lambda self, w: warned.append(w))
    a = args(env, restart=True, api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x")
    r = ok(a)
    assert r["changed"] and not r["started"] and not r["restarted"] and ct.calls == [] and ct.status == "stopped"
    assert any("is stopped" in w for w in warned), warned


def test_ensure_running_needs_a_connection(env):
    assert_nothing_written(env, args(env, ensure_running=True), "ensure_running=true needs a PVE API connection")


# ------------------------------------------------------------------ writer=pct with a stand-in pct


def fake_pct(env, monkeypatch, rc=0, stderr=""):
    bindir = env / "bin"
    bindir.mkdir()
    log = env / "pct.log"
    script = bindir / "pct"
    script.write_text("#!/bin/sh\necho \"$@\" >> %s\n%s\nexit %d\n" % (log, "echo '%s' >&2" % stderr if stderr else "", rc))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ.get("PATH", "")))
    return log


def test_writer_pct_passes_devn_and_writes_raw_leftovers_to_file(env, monkeypatch):
    log = fake_pct(env, monkeypatch)
    before = (env / "lxc" / "130.conf").read_text()
    r = ok(args(env, vmid=130, writer="pct"))
    assert r["changed"] and r["writer"] == "pct"
    assert log.read_text().split() == ["set", "130", "--dev0", "/dev/nvidia0,mode=0666", "--dev1", "/dev/nvidia1,mode=0666",
                                       "--dev2", "/dev/nvidiactl,mode=0666", "--dev3", "/dev/nvidia-uvm,mode=0666",
                                       "--dev4", "/dev/nvidia-uvm-tools,mode=0666"]
    after = (env / "lxc" / "130.conf").read_text()
    removed, added = removed_added(before, after)
    assert added == [] and all("/dev/nvidia" in x or " 195:" in x or " 508:" in x for x in removed) and len(removed) == 8


def test_writer_pct_error_is_explained_and_file_untouched(env, monkeypatch):
    fake_pct(env, monkeypatch, rc=255, stderr="Device /dev/nvidia-uvm does not exist")
    before = (env / "lxc" / "129.conf").read_text()
    r = failed(args(env, writer="pct"))
    assert "Device /dev/nvidia-uvm does not exist" in r["msg"] and "nvidia-modprobe" in r["msg"]
    assert (env / "lxc" / "129.conf").read_text() == before


# ------------------------------------------------------------------ checks before changes (issue 12)


def test_credentials_checked_before_any_write(env, monkeypatch):
    """A wrong token secret fails on an authenticated read before pct writes devN (as [pve:pending])."""
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
    log = fake_pct(env, monkeypatch)
    monkeypatch.setattr(pa, "HAS_PROXMOXER", True)

    class Denied(object):
        def __call__(self, *a, **k):
            raise pa.ProxmoxApiError(pa.describe_error(Exception("401 Unauthorized: authentication failure"),
                                                       "listing cluster resources"))
    monkeypatch.setattr(pa, "connect", Denied())
    h = digest(env)
    r = failed(args(env, writer="pct", restart=True, api_host="10.213.5.2", api_token_id="ansible",
                    api_token_secret="s3cr3t-value"))
    assert "authentication failure" in r["msg"] and "nothing was written" in r["msg"], r["msg"]
    assert "s3cr3t-value" not in repr(r)
    assert not log.exists() and digest(env) == h and not (env / "bk").exists()


def test_missing_ca_file_is_named(env, monkeypatch):
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
    monkeypatch.setattr(pa, "HAS_PROXMOXER", True)

    def factory(*a, **k):
        raise OSError("Could not find a suitable TLS CA certificate bundle, invalid path: /nope/ca.pem")
    real = pa.connect
    monkeypatch.setattr(pa, "connect", lambda p: real(p, api_factory=factory))
    monkeypatch.setattr(pa, "find_node", lambda s, v: "kpro5")
    h = digest(env)
    r = failed(args(env, restart=True, api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x",
                    ca_path="/nope/ca.pem"))
    assert "/nope/ca.pem" in r["msg"] and "ca_path names no readable CA file" in r["msg"], r["msg"]
    assert digest(env) == h


def running_ct(monkeypatch, pid=4242):
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
    calls = []

    class S(object):
        backend = "https"
    monkeypatch.setattr(pa, "HAS_PROXMOXER", True)
    monkeypatch.setattr(pa, "connect", lambda p: S())
    monkeypatch.setattr(pa, "find_node", lambda s, v: "kpro5")
    monkeypatch.setattr(pa, "ct_status", lambda s, n, v: {"status": "running", "pid": pid})
    monkeypatch.setattr(pa, "ct_restart", lambda s, n, v, t, st: calls.append((n, v, t, st)) or [{"exitstatus": "OK"}] * 2)
    return calls


class FakeStat(object):
    def __init__(self, nodes):
        self.nodes = nodes  # path under /dev -> (major, minor)

    def __call__(self, path):
        import stat as st
        for dev, (major, minor) in self.nodes.items():
            if path.endswith("/root" + dev):
                return type("S", (), {"st_mode": st.S_IFCHR | 0o666, "st_rdev": os.makedev(major, minor)})()
        raise FileNotFoundError(2, "No such file or directory", path)


NODES = [{"path": "/dev/nvidia0", "major": 195, "minor": 0}, {"path": "/dev/nvidiactl", "major": 195, "minor": 255},
         {"path": "/dev/nvidia-uvm", "major": 508, "minor": 0}]


def test_drifted_node_restarts_the_container(env, monkeypatch):
    """nvidia-uvm got a new major on the host (uvm-reload): the CT's node is stale, a re-run restarts it."""
    import functools
    calls = running_ct(monkeypatch)
    real = lc.node_drift
    ct_nodes = {"/dev/nvidia0": (195, 0), "/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (508, 0)}
    monkeypatch.setattr(lc, "node_drift", functools.partial(real, stat_fn=FakeStat(ct_nodes)))
    a = args(env, devices=NODES, restart=True, api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x")
    r = ok(a)
    assert r["changed"] and calls == [("kpro5", 129, 180, 60)]
    r = ok(a)
    assert not r["changed"] and len(calls) == 1 and "node_drift" not in r  # nodes agree: nothing to do
    ct_nodes["/dev/nvidia-uvm"] = (509, 0)  # stale after the host's uvm-reload to 508
    h = digest(env)
    r = ok(a, check_mode=True)
    assert r["changed"] and r["restart_required"] and len(calls) == 1 and digest(env) == h
    r = ok(a)
    assert r["changed"] and r["restarted"] and len(calls) == 2 and digest(env) == h
    assert r["node_drift"] == [{"path": "/dev/nvidia-uvm", "host": "508:0", "container": "509:0"}]
    assert "/dev/nvidia-uvm host 508:0, container 509:0" in r["restart_reason"]


def test_drifted_node_without_restart_is_reported(env, monkeypatch):
    import functools
    running_ct(monkeypatch)
    warned = []
    monkeypatch.setattr(mod.AnsibleModule, "warn", lambda self, w: warned.append(w))
    ok(args(env, devices=NODES))  # config converged
    monkeypatch.setattr(lc, "node_drift", functools.partial(lc.node_drift, stat_fn=FakeStat({})))
    r = ok(args(env, devices=NODES, ensure_running=True, api_host="10.213.5.2", api_token_id="ansible",
                api_token_secret="x"))
    assert not r["changed"] and r["restart_required"] and len(r["node_drift"]) == 3
    assert any("differ from the host's" in w for w in warned), warned


def locked_converged(env):
    ok(args(env))
    path = env / "lxc" / "129.conf"
    text = path.read_text()
    path.write_text(text.replace("arch: amd64\n", "arch: amd64\nlock: backup\n", 1))


def test_noop_run_reports_the_lock_and_goes_on(env, monkeypatch):
    """A backup holds the CT (lock: backup, PVE's flock): a run with nothing to change reports it and succeeds."""
    import fcntl
    locked_converged(env)
    warned = []
    monkeypatch.setattr(mod.AnsibleModule, "warn", lambda self, w: warned.append(w))
    h = digest(env)
    r = ok(args(env))
    assert not r["changed"] and r["lock"] == "backup" and digest(env) == h
    assert any("locked (lock: backup) but nothing needs to change" in w for w in warned), warned
    # the flock alone (a backup between its config updates)
    path = env / "lxc" / "129.conf"
    path.write_text(path.read_text().replace("lock: backup\n", ""))
    (env / "lock").mkdir(exist_ok=True)
    with open(str(env / "lock" / "pve-config-129.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        import subprocess
        import sys
        code = ("import sys; sys.path[:0] = %r; from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import "
                "lxc_config as lc; print(lc.config_lock_held(129, %r))" % (sys.path, str(env / "lock")))
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, universal_newlines=True, check=False).stdout
        assert out.strip() == "True"
    assert not lc.config_lock_held(129, str(env / "lock"))


def test_locked_container_with_a_change_still_fails(env):
    locked_converged(env)
    h = digest(env)
    r = failed(args(env, dev_mode="0660"))
    assert "CT 129 is locked (lock: backup)" in r["msg"] and "nothing was written" in r["msg"] and digest(env) == h


# ------------------------------------------------------------------ the failure contract (failure.py)


@pytest.mark.parametrize("phase", ["bad_input", "device_missing", "ct_locked", "ct_config_refused", "pve_api_error", "library_missing"])
def test_each_known_failure_names_its_phase(env, monkeypatch, phase):
    a = args(env)
    if phase == "bad_input":
        a = args(env, dev_mode="666")
    elif phase == "device_missing":
        a = args(env, devices=["/dev/nvidia7"], dev_root=str(env), require_nodes=True)
    elif phase == "ct_locked":
        locked_converged(env)
        a = args(env, dev_mode="0660")
    elif phase == "ct_config_refused":
        a = args(env, vmid=999)  # no such CT
    else:  # restart=true through the API: proxmoxer is missing, or the API refuses the credentials
        from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
        monkeypatch.setattr(pa, "HAS_PROXMOXER", phase != "library_missing")

        def denied(*a, **k):
            raise pa.ProxmoxApiError("401 Unauthorized: authentication failure")
        monkeypatch.setattr(pa, "connect", denied)
        a = args(env, restart=True, api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x")
    h = digest(env)
    r = failed(a)
    assert r["phase"] == phase and r["msg"].startswith(phase + ": ") and "evidence" in r and digest(env) == h, r


def test_ca_content_is_put_at_ca_path_before_the_api_and_check_mode_uses_a_copy(env, monkeypatch):
    """The module writes the CA itself (the role's directory and copy tasks before): the API verifies against the
    written file; --check writes nothing and verifies against a temporary copy; a second run changes nothing."""
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
    seen = []
    monkeypatch.setattr(pa, "HAS_PROXMOXER", True)

    def factory(host, **kw):
        seen.append((kw["verify_ssl"], open(kw["verify_ssl"]).read()))
        raise OSError("stop after the CA was used")
    real = pa.connect
    monkeypatch.setattr(pa, "connect", lambda p: real(p, api_factory=factory))
    ca, dest = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", env / "etc" / "kpro" / "pve-ca.pem"
    a = args(env, restart=True, api_host="10.213.5.2", api_token_id="ansible", api_token_secret="x", ca_path=str(dest),
             ca_content=ca)
    failed(dict(a, _ansible_check_mode=True))
    assert not dest.exists() and seen[0][1] == ca and seen[0][0] != str(dest)
    ok(dict(args(env), ca_path=str(dest), ca_content=ca), check_mode=True)  # no API: the CA alone is the change
    assert not dest.exists()
    r = ok(dict(args(env), ca_path=str(dest), ca_content=ca), diff=True)
    assert r["changed"] and r["ca_changed"] and dest.read_text() == ca
    assert [d["after_header"] for d in r["diff"]] == [r["config_file"], str(dest)] and r["diff"][1]["after"] == ca
    failed(a)
    assert seen[-1] == (str(dest), ca)
    r2 = ok(dict(args(env), ca_path=str(dest), ca_content=ca))
    assert not r2["changed"] and not r2["ca_changed"]


# ------------------------------------------------------------------ /dev/nvidia-caps: present now, not made at boot


def caps_host(env, monkeypatch):
    """A /dev with the boot unit's nodes and the two MIG capability nodes nvidia-smi leaves (nvidia-modprobe -f)."""
    dev = env / "root" / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    for n in DEVICES + ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]:
        (dev / n[5:]).write_text("")
    monkeypatch.setattr(lc, "stat_device", lambda path, dev_root="/": {
        "path": path, "major": 510 if "caps" in path else 195, "minor": int(path[-1]) if path[-1].isdigit() else 0})
    a = args(env, dev_root=str(env / "root"))
    del a["devices"]
    return a


def warned_ok(a):
    warned = []
    with mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: warned.append(msg)):
        return ok(a), warned


def test_caps_nodes_present_are_not_passed(env, monkeypatch):
    r, warned = warned_ok(caps_host(env, monkeypatch))
    assert [d["path"] for d in r["devices"]] == DEVICES
    assert r["left_out"] == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    assert "nvidia-caps" not in (env / "lxc" / "129.conf").read_text()
    assert not [w for w in warned if "nvidia-caps" in w], warned


def test_caps_entries_of_an_earlier_run_are_removed_with_a_warning(env, monkeypatch):
    path = env / "lxc" / "129.conf"
    text = path.read_text()
    path.write_text(text.replace("swap: 0\n", "swap: 0\ndev7: /dev/nvidia-caps/nvidia-cap1,mode=0666\n"
                                 "dev8: /dev/nvidia-caps/nvidia-cap2,mode=0666\n", 1))
    r, warned = warned_ok(caps_host(env, monkeypatch))
    after = path.read_text()
    assert r["changed"] and "nvidia-caps" not in after.split("[pve:pending]")[0], after
    assert [w for w in warned if "(/dev/nvidia-caps/nvidia-cap" in w and "removed: nothing makes that node at boot" in w
            and "refuse to start" in w], warned
    again, warned = warned_ok(caps_host(env, monkeypatch))
    assert not again["changed"] and not [w for w in warned if "nvidia-caps" in w], warned


def test_explicit_caps_device_is_passed_with_a_warning(env, monkeypatch):
    a = dict(caps_host(env, monkeypatch), devices=DEVICES + ["/dev/nvidia-caps/nvidia-cap1"])
    r, warned = warned_ok(a)
    assert any(v.startswith("/dev/nvidia-caps/nvidia-cap1,") for v in r["devn"].values()), r["devn"]
    assert [w for w in warned if "/dev/nvidia-caps/nvidia-cap1 passed as devN, but the device-node unit does not make it at "
            "boot" in w], warned
    _raw, warned = warned_ok(dict(a, method="lxc_raw"))  # bind mounts are optional: a missing source does not stop a start
    assert not [w for w in warned if "device-node unit" in w], warned
