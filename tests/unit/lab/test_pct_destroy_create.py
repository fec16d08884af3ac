"""The lab's pct destroy/create and the mpN bind mounts of its container runtime (issue 32), on a temp node root."""

import os

from conftest import lablib
from test_pve_fake import pveroot  # noqa: F401  pylint: disable=unused-import

TEMPLATE = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"


def test_destroy_keeps_a_bind_mount_and_create_makes_a_stock_ct(pveroot):  # noqa: F811
    disk = pveroot.p("var/lib/kpro-lab/ct/130/upper/etc")
    os.makedirs(disk)
    models = pveroot.p("var/lib/vz/kpro-models")
    os.makedirs(models)
    assert pveroot.tool("pct", "set", "130", "-mp0", "/var/lib/vz/kpro-models,mp=/srv/models").returncode == 0
    assert pveroot.tool("pct", "start", "130").returncode == 0
    r = pveroot.tool("pct", "destroy", "130")
    assert r.returncode == 255 and r.stderr == "unable to destroy CT 130 - container is running\n"
    assert pveroot.tool("pct", "stop", "130").returncode == 0
    r = pveroot.tool("pct", "destroy", "130")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(pveroot.p("etc/pve/lxc/130.conf")) and not os.path.exists(disk)
    assert os.path.isdir(models)  # a bind mount point is no volume of the CT's
    r = pveroot.tool("pct", "create", "130", "local:vztmpl/ubuntu.tar.zst")
    assert r.returncode == 255 and "only container template" in r.stderr
    r = pveroot.tool("pct", "create", "130", TEMPLATE, "--hostname", "sglang", "--rootfs", "local-zfs:200")
    assert r.returncode == 0, r.stderr
    conf = open(pveroot.p("etc/pve/lxc/130.conf")).read()
    assert conf == ("arch: amd64\nhostname: sglang\nostype: debian\nrootfs: local-zfs:subvol-130-disk-0,size=200G\n"
                    "unprivileged: 1\n")
    assert pveroot.tool("pct", "status", "130").stdout == "status: stopped\n"
    r = pveroot.tool("pct", "create", "130", TEMPLATE)
    assert r.returncode == 255 and r.stderr == "CT 130 already exists on node 'kpro5'\n"


def test_runtime_mount_points_bind_only_and_missing_directory_refused(tmp_path):
    conf, runtime = lablib("ct.conf"), lablib("ct.runtime")
    cfg = conf.parse("mp1: local-zfs:subvol-1-disk-1,mp=/data\nmp0: /var/lib/vz/m,mp=/srv/models,ro=1\n")
    assert [(m["key"], m["volume"], m["mp"], m["ro"]) for m in conf.mount_points(cfg)] == [
        ("mp0", "/var/lib/vz/m", "/srv/models", True), ("mp1", "local-zfs:subvol-1-disk-1", "/data", False)]
    try:
        runtime._validate_mount_points(conf.parse("mp0: /var/lib/vz/m,mp=/srv/models\n"), str(tmp_path))
    except runtime.CTError as e:
        assert str(e) == "directory '/var/lib/vz/m' does not exist"
    else:
        raise AssertionError("a missing bind source must fail the start")
    os.makedirs(str(tmp_path / "var/lib/vz/m"))
    assert runtime._validate_mount_points(conf.parse("mp0: /var/lib/vz/m,mp=/srv/models\n"), str(tmp_path))[0]["mp"] == "/srv/models"


def test_bind_mount_point_is_root_at_pam_only():
    ctconf = lablib("pve.ctconf")
    ctconf.check_modify_perm("root@pam", {"mp0": "/var/lib/vz/m,mp=/srv/models"})
    ctconf.check_modify_perm("ansible@pve", {"mp0": "local-zfs:subvol-129-disk-1,mp=/data"})  # a volume: Disk privilege
    ctconf.check_modify_perm("ansible@pve", ["mp0"])  # a delete
    try:
        ctconf.check_modify_perm("ansible@pve", {"mp0": "/var/lib/vz/m,mp=/srv/models"})
    except Exception as e:  # noqa: B902  PVEError
        assert str(e.msg if hasattr(e, "msg") else e).startswith(
            "Permission check failed (mount point type bind is only allowed for root@pam)")
    else:
        raise AssertionError("a bind mount point by a token must be refused")
