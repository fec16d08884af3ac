# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""reboot_check: "ready to reboot into <kernel>", or the kernel, the missing piece and the fixing command."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_installer as ni
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import reboot_check as rc
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.tests.unit.plugins import fake_sysfs

V, NEW = "580.126.09", "6.8.12-10-pve"
MODULE = {"filename": "/lib/modules/%s/updates/dkms/nvidia.ko" % NEW, "version": V,
          "vermagic": "%s SMP preempt mod_unload modversions" % NEW}
SHOW = "Before=pve-guests.service shutdown.target\nUnitFileState=enabled\n"
CT = ("arch: amd64\ndev0: /dev/nvidia0,mode=0666\ndev1: /dev/nvidia1,mode=0666\ndev2: /dev/nvidiactl,mode=0666\n"
      "dev3: /dev/nvidia-uvm,mode=0666\ndev4: /dev/nvidia-uvm-tools,mode=0666\nhostname: kpro5\n"
      "[snap1]\ndev9: /dev/nvidia-caps/nvidia-cap1\n")


def test_ready_to_reboot_names_the_kernel():
    problems = rc.module_problems(NEW, V, MODULE, "proxmox-headers-" + NEW, True)
    problems += rc.unit_problems(ni.DEVICE_NODES_UNIT, rc.parse_systemctl_show(SHOW), ni.device_nodes_unit(2))
    problems += rc.ct_problems(129, rc.devn_paths(CT), rc.unit_nodes(ni.device_nodes_unit(2)))
    assert rc.verdict(NEW, problems) == "ready to reboot into %s" % NEW


def test_the_units_nodes_are_nvidia_modprobes():
    assert rc.unit_nodes(ni.device_nodes_unit(2)) == {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                                      "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
    assert rc.devn_paths(CT) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_phase_next_boot_module_missing_names_kernel_and_headers_package():
    with pytest.raises(Failure) as e:
        rc.verdict(NEW, rc.module_problems(NEW, V, {}, "proxmox-headers-" + NEW, False))
    f = e.value
    assert f.phase == "next_boot_module_missing" and NEW in f.msg and "proxmox-headers-%s" % NEW in f.msg
    assert f.remedy.startswith("apt-get install proxmox-headers-%s && dkms install -m nvidia -v %s -k %s" % (NEW, V, NEW))
    wrong = dict(MODULE, version="575.57.08")
    assert rc.module_problems(NEW, V, wrong, "p", True)[0][1].endswith("is version 575.57.08, not %s" % V)
    other = dict(MODULE, vermagic="6.8.12-9-pve SMP")
    assert "built for 6.8.12-9-pve" in rc.module_problems(NEW, V, other, "p", True)[0][1]


def test_phase_device_nodes_unit_not_ready():
    unordered = ni.device_nodes_unit(2).replace("Before=pve-guests.service\n", "")
    problems = rc.unit_problems(ni.DEVICE_NODES_UNIT, rc.parse_systemctl_show("Before=\nUnitFileState=disabled\n"), unordered)
    # the unit file's own Before= counts where systemd's view has not been reloaded yet
    assert rc.unit_problems(ni.DEVICE_NODES_UNIT, {"UnitFileState": "enabled", "Before": ""}, ni.device_nodes_unit(2)) == []
    assert [p[0] for p in problems] == ["device_nodes_unit_not_ready"] * 2
    assert problems[0][2] == "systemctl enable nvidia-device-nodes.service"
    with pytest.raises(Failure) as e:
        rc.verdict(NEW, rc.unit_problems(ni.DEVICE_NODES_UNIT, {}, None))
    assert e.value.phase == "device_nodes_unit_not_ready" and "not installed" in e.value.msg
    assert len(e.value.details["problems"]) == 1


def test_phase_ct_passthrough_unresolvable():
    ct = CT.replace("dev4: /dev/nvidia-uvm-tools", "dev4: /dev/nvidia-caps/nvidia-cap1")
    with pytest.raises(Failure) as e:
        rc.verdict(NEW, rc.ct_problems(129, rc.devn_paths(ct), rc.unit_nodes(ni.device_nodes_unit(1))))
    assert e.value.phase == "ct_passthrough_unresolvable"
    assert "/dev/nvidia1, /dev/nvidia-caps/nvidia-cap1" in e.value.msg and "CT 129" in e.value.msg


def test_phase_signing_key_not_enrolled_and_dkms_own_key_named():
    cert = {"serial": "5A3C", "issuer_cn": "kpro MOK"}
    signed = dict(MODULE, signer="kpro MOK", sig_key="5A:3C")
    assert rc.signing_problems(NEW, signed, cert, "/root/MOK.der", "/root/MOK.priv", True) == []
    p = rc.signing_problems(NEW, signed, cert, "/root/MOK.der", "/root/MOK.priv", False)
    assert p[0][0] == "signing_key_not_enrolled" and p[0][2].startswith("mokutil --import /root/MOK.der")
    with pytest.raises(Failure) as e:
        rc.verdict(NEW, p)
    assert e.value.phase == "signing_key_not_enrolled"
    dkms = dict(MODULE, signer="DKMS module signing key", sig_key="11:22")
    p = rc.signing_problems(NEW, dkms, cert, "/root/MOK.der", "/var/lib/dkms/mok.key", True)
    assert p[0][0] == "module_wrong_key" and "/var/lib/dkms/mok.key" in p[0][1] and "DKMS module signing key" in p[0][1]
    assert rc.signing_problems(NEW, MODULE, None, None, "/var/lib/dkms/mok.key", None)[0][0] == "module_unsigned"


class Module(object):
    def __init__(self, tmp, **params):
        self.params = dict(version=V, vmid=129, module_signing_cert=None, device_nodes_unit=ni.DEVICE_NODES_UNIT,
                           config_dir=os.path.join(tmp, "lxc"), systemd_dir=os.path.join(tmp, "systemd"),
                           efivars_dir=os.path.join(tmp, "efi"), dkms_framework_conf=os.path.join(tmp, "framework.conf"),
                           boot_dir=os.path.join(tmp, "boot"), modules_root=os.path.join(tmp, "modules"),
                           proc_root=os.path.join(tmp, "proc"), ids=[], node="kpro5",
                           sysfs_root=os.path.join(tmp, "sys"), etc_root=os.path.join(tmp, "etc"))
        self.params.update(params)
        for d in ("lxc", "systemd", "boot", "modules", "proc/sys/kernel", "etc/pve/qemu-server", "etc/pve/mapping"):
            os.makedirs(os.path.join(tmp, d))
        fake_sysfs.build(tmp)  # kpro5: A6000s at 17:00.0 and 73:00.0 (with their audio .1), a USB controller at 03:00.0
        for k in ("6.8.12-9-pve", NEW):
            open(os.path.join(tmp, "boot", "vmlinuz-" + k), "w").close()
        with open(os.path.join(tmp, "proc/sys/kernel/osrelease"), "w") as f:
            f.write("6.8.12-9-pve\n")
        with open(os.path.join(tmp, "lxc", "129.conf"), "w") as f:
            f.write(CT)
        with open(os.path.join(tmp, "systemd", ni.DEVICE_NODES_UNIT), "w") as f:
            f.write(ni.device_nodes_unit(2))
        self.ran = []

    def get_bin_path(self, name, required=False):
        return None if name == "proxmox-boot-tool" else "/usr/bin/" + name

    def run_command(self, argv, environ_update=None):
        self.ran.append(argv)
        if argv[0].endswith("modinfo"):
            if argv[2] != NEW:
                return 1, "", "modinfo: ERROR: Module nvidia not found."
            return 0, "".join("%s: %s\n" % kv for kv in MODULE.items()), ""
        if argv[0].endswith("systemctl"):
            return 0, SHOW, ""
        return 1, "", ""


def test_check_host_reads_only_and_finds_the_next_kernel(tmp_path):
    m = Module(str(tmp_path))
    facts, problems = rc.check_host(m)
    assert problems == [] and facts["next_boot_kernel"] == NEW and facts["running_kernel"] == "6.8.12-9-pve"
    assert facts["ct_devices"][0] == "/dev/nvidia0" and facts["unit"]["UnitFileState"] == "enabled"
    assert all(a[0].endswith(("modinfo", "systemctl")) for a in m.ran)
    assert ["/usr/bin/systemctl", "show", ni.DEVICE_NODES_UNIT, "-p", "UnitFileState", "-p", "Before"] in m.ran


WS_GPU = ("boot: order=scsi0\nhostpci0: {hostpci}\nmachine: pc-q35-8.1\nmemory: 65536\nname: ws-gpu\nonboot: {onboot}\n"
          "ostype: win11\n")
PCI_CFG = "a6000-2\n\tmap node=kpro5,path=0000:73:00,id=10de:2230\n\tmap node=kpro6,path=0000:17:00,id=10de:2230\n"


def guests(tmp_path, hostpci="0000:17:00,pcie=1,x-vga=1", onboot=1, pci_cfg=None):
    """check_host on kpro5's sysfs with VM 110 (ws-gpu) as configured; (facts, problems)."""
    m = Module(str(tmp_path))
    qs = tmp_path / "etc" / "pve" / "qemu-server"
    (qs / "110.conf").write_text(WS_GPU.format(hostpci=hostpci, onboot=onboot))
    (qs / "111.conf").write_text("name: gitlab-runner\nonboot: 1\nostype: l26\n")
    if pci_cfg is not None:
        (tmp_path / "etc" / "pve" / "mapping" / "pci.cfg").write_text(pci_cfg)
    return rc.check_host(m)


def test_phase_guest_takes_gpus_at_boot(tmp_path):
    facts, problems = guests(tmp_path)
    with pytest.raises(Failure) as e:
        rc.verdict(NEW, problems)
    f = e.value
    assert f.phase == "guest_takes_gpus_at_boot" and len(problems) == 1
    assert f.msg.startswith("not ready to reboot into %s: VM 110 (ws-gpu) has onboot 1 and hostpci0: 0000:17:00,pcie=1,"
                            "x-vga=1 (" % NEW)
    assert "0000:17:00.0, 0000:17:00.1)" in f.msg and "pve-guests.service" in f.msg
    assert f.remedy == ("set gpu_host_detach_stopped_vms: onboot and re-run the gpu_host stage, or qm set 110 --onboot 0")
    assert facts["gpu_functions"] == ["0000:17:00.0", "0000:17:00.1", "0000:73:00.0", "0000:73:00.1"]
    assert [vm["vmid"] for vm in facts["vms_referencing_gpus"]] == [110]


def test_an_onboot_0_vm_with_the_gpus_is_no_problem(tmp_path):
    facts, problems = guests(tmp_path, onboot=0)
    assert problems == [] and facts["vms_referencing_gpus"][0]["onboot"] is False


def test_an_onboot_vm_with_another_device_is_no_problem(tmp_path):
    facts, problems = guests(tmp_path, hostpci="0000:03:00.0")  # the USB controller, not a GPU's companion
    assert problems == [] and facts["vms_referencing_gpus"] == []


def test_an_onboot_vm_with_the_gpus_through_a_pci_mapping(tmp_path):
    _facts, problems = guests(tmp_path, hostpci="mapping=a6000-2,pcie=1", pci_cfg=PCI_CFG)
    assert [p[0] for p in problems] == ["guest_takes_gpus_at_boot"]
    assert "VM 110 (ws-gpu) has onboot 1 and hostpci0: mapping=a6000-2,pcie=1 (" in problems[0][1]
    assert "0000:73:00.0, 0000:73:00.1)" in problems[0][1] and "0000:17:00" not in problems[0][1]


def test_onboot_vms_with_gpus_of_other_ids_are_not_counted(tmp_path):
    facts, problems = guests(tmp_path, onboot=1)
    assert problems
    # an id on no function of the host names no GPU: refused like vfio_release refuses it (issue 30), not "no VM holds it"
    m = Module(str(tmp_path / "ids"), ids=["10de:ffff"])
    assert rc.guest_problems(m.params, {})[0][0] == "bad_input"
    bad = Module(str(tmp_path / "bad"), ids=["nvidia"])
    assert rc.guest_problems(bad.params, {})[0][0] == "bad_input"
