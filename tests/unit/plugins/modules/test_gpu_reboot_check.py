# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_reboot_check: read-only, "ready to reboot into <kernel>" or a named failure with every problem."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_installer as ni
from ansible_collections.kpro.gpu_serving.plugins.modules import gpu_reboot_check as mod

from ansible_collections.kpro.gpu_serving.tests.unit.plugins import fake_sysfs
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

V, NEW = "580.126.09", "6.8.12-10-pve"


def tree(tmp_path, built=True):
    for d in ("lxc", "systemd", "boot", "proc/sys/kernel", "modules", "etc/pve/qemu-server"):
        (tmp_path / d).mkdir(parents=True)
    fake_sysfs.build(str(tmp_path))  # kpro5's GPUs: 0000:17:00.0/.1 and 0000:73:00.0/.1
    for k in ("6.8.12-9-pve", NEW):
        (tmp_path / "boot" / ("vmlinuz-" + k)).write_text("")
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.8.12-9-pve\n")
    (tmp_path / "lxc" / "129.conf").write_text("dev0: /dev/nvidia0,mode=0666\ndev1: /dev/nvidiactl,mode=0666\n")
    (tmp_path / "systemd" / ni.DEVICE_NODES_UNIT).write_text(ni.device_nodes_unit(2))
    return dict(version=V, vmid=129, config_dir=str(tmp_path / "lxc"), systemd_dir=str(tmp_path / "systemd"),
                boot_dir=str(tmp_path / "boot"), proc_root=str(tmp_path / "proc"), modules_root=str(tmp_path / "modules"),
                efivars_dir=str(tmp_path / "efi"), dkms_framework_conf=str(tmp_path / "framework.conf"),
                sysfs_root=str(tmp_path / "sys"), etc_root=str(tmp_path / "etc"), node="kpro5")


def fake_host(monkeypatch, built):
    ran = []

    def run_command(self, argv, **kw):
        ran.append(argv)
        if "modinfo" in argv[0]:
            if built and argv[2] == NEW:
                return 0, "filename: /lib/modules/%s/updates/dkms/nvidia.ko\nversion: %s\nvermagic: %s SMP\n" % (NEW, V, NEW), ""
            return 1, "", "modinfo: ERROR: Module nvidia not found."
        return 0, "UnitFileState=enabled\nBefore=pve-guests.service\n", ""
    monkeypatch.setattr(mod.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(mod.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None if name == "proxmox-boot-tool" else "/usr/bin/" + name)
    return ran


def result(args):
    with pytest.raises((AnsibleExitJson, AnsibleFailJson)) as e:
        run_module(mod, args, check_mode=True)
    return e.value.result, isinstance(e.value, AnsibleFailJson)


def test_ready_to_reboot_into_the_next_kernel(tmp_path, monkeypatch):
    args = tree(tmp_path)
    fake_host(monkeypatch, built=True)
    r, failed = result(args)
    assert not failed and not r["changed"] and r["msg"] == "ready to reboot into %s" % NEW


def test_no_module_for_the_next_kernel_names_it_and_the_headers(tmp_path, monkeypatch):
    args = tree(tmp_path)
    fake_host(monkeypatch, built=False)
    r, failed = result(args)
    assert failed and r["phase"] == "next_boot_module_missing" and not r["changed"]
    assert r["msg"].startswith("next_boot_module_missing: not ready to reboot into %s" % NEW)
    assert "proxmox-headers-%s" % NEW in r["msg"] and "dkms install -m nvidia -v %s -k %s" % (V, NEW) in r["remedy"]
    assert r["facts"]["next_boot_kernel"] == NEW and r["problems"][0]["phase"] == "next_boot_module_missing"
    assert os.listdir(str(tmp_path / "modules")) == []


def test_an_onboot_vm_with_the_gpus_is_not_ready(tmp_path, monkeypatch):
    args = tree(tmp_path)
    fake_host(monkeypatch, built=True)
    conf = tmp_path / "etc/pve/qemu-server/110.conf"
    conf.write_text("hostpci0: 0000:17:00,pcie=1\nname: ws-gpu\nonboot: 1\n")
    r, failed = result(args)
    assert failed and r["phase"] == "guest_takes_gpus_at_boot" and not r["changed"]
    assert "VM 110 (ws-gpu) has onboot 1 and hostpci0: 0000:17:00,pcie=1" in r["msg"] and "qm set 110 --onboot 0" in r["remedy"]
    assert r["facts"]["vms_referencing_gpus"][0]["references"][0]["key"] == "hostpci0"
    assert conf.read_text() == "hostpci0: 0000:17:00,pcie=1\nname: ws-gpu\nonboot: 1\n"  # read-only
    conf.write_text("hostpci0: 0000:17:00,pcie=1\nname: ws-gpu\nonboot: 0\n")
    r, failed = result(args)
    assert not failed and r["msg"] == "ready to reboot into %s" % NEW
