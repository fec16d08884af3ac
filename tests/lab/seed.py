"""The seed of the simulated node kpro5: its configuration files and its initial state.

``seed(root)`` writes, into a fresh node root (the overlay's upper layer before first
boot), what a PVE 8 host (``release="pve9"``: a PVE 9.1 host, its kernels in KERNELS) that had its two RTX A6000
on vfio-pci for a VM looks like:
boot configuration (systemd-boot on ZFS, so /etc/kernel/cmdline + proxmox-boot-tool,
and a GRUB default file as well), modprobe.d, /etc/modules, the guests' configs under
/etc/pve, and ``var/lib/kpro-lab/state.json`` (the hardware; then a first boot).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "rootfs", "usr", "lib", "kpro-lab"))

import labstate  # noqa: E402

VFIO_IDS = "10de:2230,10de:1aef,1b21:1242"
# The kernels each release's host has installed (the ISO's, then the one an update brought; the newest runs), with
# their headers in the Proxmox repository. PVE 8: 8.2's ISO kernel 6.8.4-2 is long gone from the lab's story, the lab
# keeps 6.8.12-4/-9 (labstate.initial_state). PVE 9: the 9.1 ISO's 6.17.2-1-pve (pve-kernel trixie-6.17 changelog,
# 2025-10-21) and 6.17.13-2-pve (2026-03-13; "Proxmox VE 9.1 ... 6.17.13-2-pve", NVIDIA/open-gpu-kernel-modules #1143).
KERNELS = {"pve8": ("6.8.12-4-pve", "6.8.12-9-pve"), "pve9": ("6.17.2-1-pve", "6.17.13-2-pve")}

FILES = {
    "etc/hostname": "kpro5\n",
    "etc/hosts": "127.0.0.1 localhost.localdomain localhost\n10.213.5.2 kpro5.lab.kpro kpro5\n\n"
                 "# The following lines are desirable for IPv6 capable hosts\n::1     ip6-localhost ip6-loopback\n"
                 "fe00::0 ip6-localnet\nff00::0 ip6-mcastprefix\nff02::1 ip6-allnodes\nff02::2 ip6-allrouters\n",
    "etc/default/grub": (
        "# If you change this file, run 'update-grub' afterwards to update\n"
        "# /boot/grub/grub.cfg.\n"
        "# For full documentation of the options in this file, see:\n"
        "#   info -f grub -n 'Simple configuration'\n\n"
        "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
        "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
        "GRUB_CMDLINE_LINUX_DEFAULT=\"quiet intel_iommu=on iommu=pt vfio-pci.ids=%s\"\n"
        "GRUB_CMDLINE_LINUX=\"root=ZFS=rpool/ROOT/pve-1 boot=zfs\"\n\n"
        "# Disable os-prober, it might add menu entries for each guest\nGRUB_DISABLE_OS_PROBER=true\n\n"
        "# Uncomment to enable BadRAM filtering, modify to suit your needs\n"
        "#GRUB_BADRAM=\"0x01234567,0xfefefefe,0x89abcdef,0xefefefef\"\n\n"
        "# Uncomment to disable graphical terminal\n#GRUB_TERMINAL=console\n" % VFIO_IDS),
    "etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt vfio-pci.ids=%s\n" % VFIO_IDS,
    "etc/kernel/proxmox-boot-uuids": "5E1A-2B3C\n5E1A-9F0D\n",
    "etc/modprobe.d/vfio.conf": (
        "options vfio-pci ids=%s disable_vga=1\n"
        "softdep nvidia pre: vfio-pci\nsoftdep nouveau pre: vfio-pci\nsoftdep snd_hda_intel pre: vfio-pci\n" % VFIO_IDS),
    "etc/modprobe.d/blacklist-gpu.conf": (
        "# GPU passthrough: keep the host's GPU drivers off the A6000s (VM 110)\n"
        "blacklist nouveau\nblacklist nvidia\nblacklist nvidiafb\nblacklist nvidia_drm\n"),
    "etc/modprobe.d/zfs.conf": "options zfs zfs_arc_max=34359738368\n",
    "etc/modprobe.d/pve-blacklist.conf": (
        "# This file contains a list of modules which are not supported by Proxmox VE\n\n"
        "# nvidiafb see bugreport https://bugzilla.proxmox.com/show_bug.cgi?id=701\nblacklist nvidiafb\n"),
    "etc/modules": (
        "# /etc/modules: kernel modules to load at boot time.\n#\n"
        "# This file contains the names of kernel modules that should be loaded\n"
        "# at boot time, one per line. Lines beginning with \"#\" are ignored.\n"
        "# Parameters can be specified after the module name.\n\n"
        "vfio\nvfio_iommu_type1\nvfio_pci\ncoretemp\n"),
    "etc/initramfs-tools/modules": (
        "# List of modules that you want to include in your initramfs.\n"
        "# They will be loaded at boot time in the order below.\n#\n"
        "# Syntax:  module_name [args ...]\n#\n"
        "# You must run update-initramfs(8) to effect this change.\n#\n"
        "# Examples:\n#\n# raid1\n# sd_mod\nvfio\nvfio_iommu_type1\nvfio_pci\n"),
    "etc/pve/.version": '{"kvstore": 1, "vmlist": 3}\n',
    "etc/pve/datacenter.cfg": "keyboard: en-us\n",
    "etc/pve/storage.cfg": ("dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\n"
                            "zfspool: local-zfs\n\tpool rpool/data\n\tsparse\n\tcontent images,rootdir\n"),
    "etc/pve/nodes/kpro5/qemu-server/110.conf": (
        "#Windows workstation with the first A6000 (passthrough)\n"
        "agent: 1\nbios: ovmf\nboot: order=scsi0;ide2;net0\ncores: 16\ncpu: host\n"
        "efidisk0: local-zfs:vm-110-disk-0,efitype=4m,pre-enrolled-keys=1,size=1M\n"
        "hostpci0: 0000:17:00,pcie=1,x-vga=1\n"
        "ide2: none,media=cdrom\nmachine: pc-q35-8.1\nmemory: 65536\nmeta: creation-qemu=8.1.5,ctime=1712139871\n"
        "name: ws-gpu\nnet0: virtio=BC:24:11:5A:6E:10,bridge=vmbr0,firewall=1\nnuma: 0\nonboot: 1\nostype: win11\n"
        "scsi0: local-zfs:vm-110-disk-1,cache=writeback,discard=on,iothread=1,size=512G,ssd=1\n"
        "scsihw: virtio-scsi-single\nsmbios1: uuid=2f6bd0a4-0c93-4b7e-9b55-5b0e8f0e8a10\nsockets: 1\n"
        "tpmstate0: local-zfs:vm-110-disk-2,size=4M,version=v2.0\nvmgenid: 6c3f3a3e-8d38-4f55-9a4e-1f4f3f9e1b10\n"),
    "etc/pve/nodes/kpro5/qemu-server/105.conf": (
        "boot: order=scsi0;net0\ncores: 4\ncpu: x86-64-v2-AES\nmemory: 8192\nmeta: creation-qemu=8.1.5,ctime=1709031123\n"
        "name: gitlab-runner\nnet0: virtio=BC:24:11:2D:91:05,bridge=vmbr0,firewall=1\nnuma: 0\nonboot: 1\nostype: l26\n"
        "scsi0: local-zfs:vm-105-disk-0,iothread=1,size=64G\nscsihw: virtio-scsi-single\n"
        "smbios1: uuid=8a1c2b3d-4e5f-4a6b-8c7d-9e0f1a2b3c05\nsockets: 1\nvmgenid: 0d9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b05\n"),
    # ostype debian: the container is built from Proxmox's debian-12-standard package set (tests/lab/stock/ct.txt), and
    # PVE sets up a container by its ostype (pve-container src/PVE/LXC/Setup.pm: Debian or Ubuntu), so it must say so
    "etc/pve/nodes/kpro5/lxc/129.conf": (
        "#SGLang inference container (migrated from kpro6)\n"
        "#\n"
        "#Owner%3A ml-team\n"
        "arch: amd64\ncores: 32\nfeatures: nesting=1\nhostname: sglang\nmemory: 131072\n"
        "net0: name=eth0,bridge=vmbr0,firewall=1,gw=10.213.6.1,hwaddr=BC:24:11:7C:12:9A,ip=10.213.6.129/24,type=veth\n"
        "onboot: 1\nostype: debian\nparent: pre-gpu\nrootfs: local-zfs:subvol-129-disk-0,size=200G\nswap: 8192\nunprivileged: 1\n"
        "\n[pre-gpu]\n"
        "#before GPU passthrough\n"
        "arch: amd64\ncores: 32\nfeatures: nesting=1\nhostname: sglang\nmemory: 131072\n"
        "net0: name=eth0,bridge=vmbr0,firewall=1,gw=10.213.6.1,hwaddr=BC:24:11:7C:12:9A,ip=10.213.6.129/24,type=veth\n"
        "onboot: 1\nostype: debian\nrootfs: local-zfs:subvol-129-disk-0,size=200G\nsnaptime: 1736432410\nswap: 8192\nunprivileged: 1\n"),
}

LINKS = {
    "etc/pve/local": "nodes/kpro5",
    "etc/pve/qemu-server": "nodes/kpro5/qemu-server",
    "etc/pve/lxc": "nodes/kpro5/lxc",
}


def files(node=None, addr=None, vmid=None):
    """FILES, or with ``KPGS_LAB_NOUVEAU=1`` a host that does not blacklist nouveau (udev then loads it at boot
    next to vfio-pci, and it takes the A6000s at the first probe after their release). ``node``/``addr``/``vmid``:
    another lab node (labctl up --nodes 2), the same host under its own name, address and container ID."""
    out = dict(FILES)
    if node:
        out = {_renamed(k, node, addr, vmid): _renamed(v, node, addr, vmid) for k, v in out.items()}
    if os.environ.get("KPGS_LAB_NOUVEAU") == "1":
        rel = "etc/modprobe.d/blacklist-gpu.conf"
        out[rel] = "".join(line for line in out[rel].splitlines(True) if line != "blacklist nouveau\n")
    return out


def _renamed(text, node, addr, vmid):
    text = text.replace("kpro5", node).replace("10.213.5.2 ", addr + " ")
    return text.replace("129", vmid) if vmid else text


def seed_files(root, node=None, addr=None, vmid=None):
    for rel, text in files(node, addr, vmid).items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    for rel, target in LINKS.items():
        target = target.replace("kpro5", node) if node else target
        path = os.path.join(root, rel)
        if not os.path.lexists(path):
            os.symlink(target, path)
    os.makedirs(os.path.join(root, "var/lib/kpro-lab"), exist_ok=True)
    with open(os.path.join(root, "var/lib/kpro-lab/calls.log"), "a"):
        pass


def seed_state(root, node=None, vmid=None, release="pve8"):
    """The initial state: hardware, kernels installed (with initramfs/ESP as last refreshed), then a first boot."""
    kernels = KERNELS[release]
    st = labstate.initial_state(kernels[-1])
    st["kernel"]["installed"] = list(kernels)
    st["kernel"]["headers_available"] = list(kernels)
    if node:
        st["node"] = node
    if vmid:
        st["guests"][vmid] = st["guests"].pop("129")
    labstate.initramfs_update(st, root, st["kernel"]["installed"])
    labstate.boot_refresh(st, root)
    labstate.update_grub(st, root)
    labstate.boot(st, root)
    # The boot stops every guest; kpro5 was running VM 105 and CT 129 when we found it.
    st["guests"]["105"]["status"] = "running"
    st["guests"][vmid or "129"]["status"] = "running"
    with labstate.locked(root):
        labstate.save(st, root)
    return st


def seed(root, node=None, addr=None, vmid=None, release="pve8"):
    seed_files(root, node, addr, vmid)
    return seed_state(root, node, vmid, release)


if __name__ == "__main__":
    print(seed(sys.argv[1])["pci"]["devices"]["0000:17:00.0"])
