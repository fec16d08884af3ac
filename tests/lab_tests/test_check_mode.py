"""`--check --diff` of the whole migration over a fresh lab (issue 7): it runs end to end, shows the
changes it would make (diffs of the boot files; what the stages after the driver cannot compute yet
is reported as a change), and leaves the node's disk
and the container's disk byte-identical. The gpu_host/lxc_gpu check run of the host stage test is part of it
(same diffs, same byte-identical node). On the same untouched node: a running VM holding the GPU is refused
before anything changes."""

from __future__ import annotations

import os

from conftest import RUN, labctl
from test_gpu_host_stage import disk_digest, play, recap

CT_DISK = os.path.join(RUN, "ct", "129", "upper")


def test_check_diff_over_a_fresh_lab_changes_nothing(lab):
    labctl("reset")
    before = (disk_digest(), disk_digest(CT_DISK))
    r = play("--check", "--diff")
    host, ct = recap(r.stdout), recap(r.stdout, "ct129")
    assert host["failed"] == 0 and ct["failed"] == 0, r.stdout[-4000:]
    assert host["changed"] >= 4 and ct["changed"] >= 4, r.stdout[-4000:]
    # the changes are shown: the vfio ids leaving the kernel command line, the passthrough entering the CT config
    assert "-root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt vfio-pci.ids=10de:2230,10de:1aef,1b21:1242" in r.stdout
    assert "+root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt vfio-pci.ids=1b21:1242" in r.stdout
    # CT 129's passthrough needs the driver's device nodes: check mode says so instead of guessing
    assert "so the passthrough for container 129 cannot be computed" in r.stdout
    assert "would be set up and launched once stages 4-6" in r.stdout
    assert (disk_digest(), disk_digest(CT_DISK)) == before


def test_running_vm_with_the_gpu_is_refused_and_nothing_changes(lab):
    # the fresh node the check-mode test above left byte-identical (asserted there): no reset needed
    conf = os.path.join(lab.root, "etc/pve/qemu-server/105.conf")
    text = open(conf).read()
    with open(conf, "w") as f:
        f.write(text.replace("\nname:", "\nhostpci0: 0000:65:00,pcie=1\nname:", 1) if "\nname:" in text else text + "hostpci0: 0000:65:00,pcie=1\n")
    before = disk_digest()
    r = play("--tags", "gpu_host")
    assert recap(r.stdout)["failed"] == 1
    assert "VM 105" in r.stdout and "0000:65:00" in r.stdout and "running" in r.stdout, r.stdout[-3000:]
    assert disk_digest() == before
    with open(conf, "w") as f:
        f.write(text)
