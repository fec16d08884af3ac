"""`--check --diff` of the whole migration over a fresh lab (issue 7): it runs end to end, shows the
changes it would make (diffs of the boot files; what the stages after the driver cannot compute yet
is reported as a change), and leaves the node's disk
and the container's disk byte-identical."""

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
