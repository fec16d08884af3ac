"""A temp node root laid out like a stock Proxmox VE 8 (Debian 12) host that the real NVIDIA
installer accepts: what it looks for, where the Debian packages put it, with Debian's
absolute alternatives links (they must resolve inside the root, not on this machine).

Used by the installer stand-in's tests; everything else comes from conftest's ``root``.
"""

import os
import subprocess

import pytest

from conftest import RELEASE

# The collection's command lines (plugins/module_utils/host/nvidia_installer.py installer_args).
HOST = ["--silent", "--no-x-check", "--kernel-module-type=open", "--dkms", "--disable-nouveau", "--no-rebuild-initramfs",
        "--kernel-name=%s" % RELEASE]
USERSPACE = ["--silent", "--no-x-check", "--no-kernel-modules", "--no-dkms", "--no-nouveau-check"]

# lab path -> the Debian 12 package that ships it
TOOLS = {
    "/usr/sbin/ldconfig": "libc-bin", "/usr/bin/grep": "grep", "/usr/bin/dmesg": "util-linux",
    "/usr/bin/tail": "coreutils", "/usr/bin/tr": "coreutils", "/usr/bin/sed": "sed", "/usr/bin/tar": "tar",
    "/usr/sbin/modprobe": "kmod", "/usr/sbin/rmmod": "kmod", "/usr/sbin/lsmod": "kmod", "/usr/sbin/depmod": "kmod",
    "/usr/bin/x86_64-linux-gnu-gcc-12": "gcc-12", "/usr/bin/make": "make",
    "/usr/bin/x86_64-linux-gnu-ld.bfd": "binutils-x86-64-linux-gnu",
}
LINKS = {  # as Debian 12's gcc, gcc-12 and binutils lay them out (cc through update-alternatives)
    "/usr/bin/cc": "/etc/alternatives/cc", "/etc/alternatives/cc": "/usr/bin/gcc", "/usr/bin/gcc": "gcc-12",
    "/usr/bin/gcc-12": "x86_64-linux-gnu-gcc-12", "/usr/bin/ld": "x86_64-linux-gnu-ld",
    "/usr/bin/x86_64-linux-gnu-ld": "x86_64-linux-gnu-ld.bfd",
    "/lib/modules/%s/build" % RELEASE: "/usr/src/linux-headers-%s" % RELEASE,
}
HEADERS = ["/usr/include/stdio.h",  # libc6-dev
           "/usr/src/linux-headers-%s/include/linux/kernel.h" % RELEASE,  # proxmox-headers-<release>
           "/usr/src/linux-headers-%s/include/generated/uapi/linux/version.h" % RELEASE]
# The environment the stand-in reads besides its flags: the caller's must not leak in.
INSTALLER_ENV = ("CC", "SYSSRC", "SYSOUT")


def write(root, rel, text="", mode=0o644):
    path = root.p(rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def stock(root):
    """build-essential, kmod, dkms, tar and the running kernel's headers, as on a prepared host."""
    for rel in TOOLS:
        write(root, rel, "#!/bin/sh\nexit 0\n", 0o755)
    for rel in HEADERS:
        write(root, rel, "/* kpro lab */\n")
    for rel, target in LINKS.items():
        os.makedirs(os.path.dirname(root.p(rel)), exist_ok=True)
        os.symlink(target, root.p(rel))
    os.makedirs(root.p("/etc/modprobe.d"), exist_ok=True)
    return root


def drop(root, *rels):
    for rel in rels:
        os.unlink(root.p(rel))


def install(root, *args, run=None, **env):
    """The .run with ``args``; ``env`` (CC=..., PATH=...) on top of the test's environment, less INSTALLER_ENV."""
    full = root.env()
    for name in INSTALLER_ENV:
        full.pop(name, None)
    full.update(env)
    return subprocess.run(["sh", str(run or root.build["run"])] + list(args), env=full, capture_output=True,
                          text=True, cwd=root.path, check=False)


def log(root, name="/var/log/nvidia-installer.log"):
    with open(root.p(name)) as f:
        return f.read()


@pytest.fixture
def host(root):
    return stock(root)
