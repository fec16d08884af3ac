# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""verify_upgrade: the kernels that can boot without the NVIDIA module, the holds and blacklist the deployment set, and
apt's NVIDIA userspace in a container whose userspace came from the .run installer."""

from __future__ import annotations

import os
import re

import yaml

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_upgrade as vu

V, OLD, NEW = "580.126.09", "6.8.12-9-pve", "6.8.12-10-pve"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
# dpkg-query -W -f '${Package}\t${Status}\n': "<want> <eflag> <status>" (dpkg's src/query/main.c)
DPKG = ("proxmox-default-kernel\thold ok installed\nproxmox-kernel-6.8\tinstall ok installed\n"
        "unattended-upgrades\tinstall ok installed\nlibnvidia-ml1:amd64\tdeinstall ok config-files\nvim\tinstall ok installed\n")


class Module(object):
    """The host's tools as the lab's node answers: modinfo finds nvidia for ``built`` kernels only."""

    def __init__(self, tmp, built, headers=(), listing=None):
        self.built, self.listing = built, listing
        for k in (OLD, NEW):
            os.makedirs(os.path.join(tmp, "boot"), exist_ok=True)
            open(os.path.join(tmp, "boot", "vmlinuz-" + k), "w").close()
        for k in headers:
            os.makedirs(os.path.join(tmp, "modules", k, "build", "include"))
        os.makedirs(os.path.join(tmp, "proc/sys/kernel"))
        with open(os.path.join(tmp, "proc/sys/kernel/osrelease"), "w") as f:
            f.write(OLD + "\n")

    def get_bin_path(self, name, required=False):
        return "/usr/sbin/proxmox-boot-tool" if name == "proxmox-boot-tool" and self.listing else (
            None if name == "proxmox-boot-tool" else "/usr/bin/" + name)

    def run_command(self, argv, environ_update=None):
        if argv[0].endswith("proxmox-boot-tool"):
            return 0, self.listing, ""
        if argv[0].endswith("modinfo") and argv[2] in self.built:
            return 0, "filename: /lib/modules/%s/updates/dkms/nvidia.ko\nversion: %s\nvermagic: %s SMP\n" % (
                argv[2], V, argv[2]), ""
        if argv[0].endswith("dpkg-query"):
            assert argv[1:] == ["-W", "-f", "${Package}\t${Status}\n"] and environ_update == {"LC_ALL": "C"}
            return 0, DPKG, ""
        return 1, "", "modinfo: ERROR: Module nvidia not found."


def kernels(tmp, **kw):
    t = str(tmp)
    return vu.kernels(Module(t, **kw), V, os.path.join(t, "proc"), os.path.join(t, "boot"), os.path.join(t, "modules"))


def test_every_bootable_kernel_with_its_module_finds_nothing(tmp_path):
    assert kernels(tmp_path, built=(OLD, NEW)) == []


def test_phase_kernel_module_missing_and_next_boot_module_missing(tmp_path):
    # a new kernel installed without its headers (the lab's drill): the next boot's, an error naming the package
    found = kernels(tmp_path, built=(OLD,))
    assert [(f["check"], f["phase"], f["severity"]) for f in found] == [("kernels", "next_boot_module_missing", "error")]
    assert found[0]["evidence"] == ["kernel %s (next boot) has no nvidia module and no headers: proxmox-headers-%s is not "
                                    "installed, so DKMS cannot build it" % (NEW, NEW)]
    assert found[0]["remedy"].startswith("Before rebooting: apt-get install proxmox-headers-%s && dkms install -m nvidia -v %s -k %s"
                                         % (NEW, V, NEW))
    # pinned to the new one, the running kernel without its module can still be booted from the menu: a warning
    pinned = "Manually selected kernels:\nNone.\n\nAutomatically selected kernels:\n%s\n%s\n\nPinned kernel:\n%s\n" % (OLD, NEW, NEW)
    other = tmp_path / "pinned"
    other.mkdir()
    found = kernels(other, built=(NEW,), headers=(OLD,), listing=pinned)
    assert [(f["phase"], f["severity"]) for f in found] == [("kernel_module_missing", "warning")]
    assert found[0]["evidence"] == ["kernel %s (can boot) has no nvidia module" % OLD]


def test_dpkg_packages_are_the_installed_ones_with_their_selection():
    pkgs = vu.dpkg_packages(Module.run_command.__get__(Module.__new__(Module)), "/usr/bin/dpkg-query")
    assert pkgs == {"proxmox-default-kernel": "hold", "proxmox-kernel-6.8": "install", "unattended-upgrades": "install", "vim": "install"}
    assert vu.dpkg_packages(None, None) == {}


def test_a_hold_gone_is_deployment_drift_and_a_package_not_installed_is_no_finding():
    pkgs = {"proxmox-default-kernel": "install", "unattended-upgrades": "install"}
    found = vu.packages(pkgs, holds=["proxmox-default-kernel", "proxmox-default-headers"])
    assert [(f["check"], f["phase"], f["severity"]) for f in found] == [("packages", "deployment_drift", "warning")]
    assert found[0]["evidence"] == ["proxmox-default-kernel: dpkg selection install, not hold"]
    assert vu.packages(dict(pkgs, **{"proxmox-default-kernel": "hold"}), holds=["proxmox-default-kernel"]) == []


def role_blacklist():
    with open(os.path.join(REPO, "roles", "gpu_host", "defaults", "main.yml")) as f:
        d = yaml.safe_load(f)
    return d["gpu_host_unattended_blacklist"], d["gpu_host_unattended_blacklist_file"]


def test_the_roles_blacklist_stops_every_kernel_and_header_package_and_nothing_else():
    # unattended-upgrades' own test: re.match of each entry (is_pkgname_in_blacklist); an entry that is not also a POSIX
    # expression ("[0-9]") is pinned package by package (pinning_from_regex_list), with the same re.match
    entries, path = role_blacklist()
    assert path.startswith("/etc/apt/apt.conf.d/")
    for name in ("proxmox-default-kernel", "proxmox-default-headers", "proxmox-kernel-6.8", "proxmox-kernel-6.8.12-9-pve-signed",
                 "proxmox-headers-6.17", "proxmox-headers-6.17.13-2-pve", "pve-kernel-6.2", "pve-headers"):
        assert any(re.match(e, name) for e in entries), name
    for name in ("proxmox-kernel-helper", "proxmox-ve", "pve-manager", "linux-base", "proxmox-default-kernel-extra"):
        assert not any(re.match(e, name) for e in entries), name
    assert all(re.compile(e) for e in entries)


def test_the_blacklist_file_as_the_role_writes_it_is_read_back_and_an_entry_gone_is_drift():
    entries, path = role_blacklist()
    with open(os.path.join(REPO, "roles", "gpu_host", "templates", "unattended-upgrades-blacklist.j2")) as f:
        import jinja2
        text = jinja2.Template(f.read()).render(gpu_host_unattended_blacklist=entries)
    assert vu.blacklist_entries(text) == entries
    pkgs = {"unattended-upgrades": "install"}
    assert vu.packages(pkgs, blacklist=entries, blacklist_file=path, blacklist_text=text) == []
    cut = text.replace('"%s";' % entries[0], '// "%s";' % entries[0])
    found = vu.packages(pkgs, blacklist=entries, blacklist_file=path, blacklist_text=cut)
    assert [(f["phase"], f["severity"]) for f in found] == [("deployment_drift", "warning")]
    assert found[0]["evidence"] == ['%s lacks Unattended-Upgrade::Package-Blacklist entries "%s"' % (path, entries[0])]
    # without unattended-upgrades installed the file is not written, and nothing is missing
    assert vu.packages({}, blacklist=entries, blacklist_file=path, blacklist_text=None) == []


def test_phase_nvidia_apt_userspace_only_where_the_installer_put_it():
    pkgs = {"libnvidia-ml1": "install", "nvidia-smi": "hold", "libcuda1": "install", "vim": "install", "libnvme1": "install"}
    found = vu.packages(pkgs, installer_userspace=True)
    assert [(f["check"], f["phase"], f["severity"]) for f in found] == [("packages", "nvidia_apt_userspace", "error")]
    assert found[0]["evidence"] == ["installed from apt: libcuda1, libnvidia-ml1, nvidia-smi"]
    assert vu.packages(pkgs) == []
