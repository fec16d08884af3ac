"""The lab's package mirror: two flat apt repositories served by the lab's file server (labsvc).

* ``apt/debian``: the real Debian packages the collection installs, with their dependencies, as
  downloaded against each stock root (rootfs_cache.COLLECTION_PACKAGES, cached in the apt pools);
* ``apt/pve``: lab-built stand-ins of the Proxmox-only packages: ``proxmox-headers-<release>`` for each
  release of the node's ``kernel.headers_available``, ``proxmox-headers-<major.minor>`` and
  ``proxmox-default-headers``, with the dependency chain of the real meta packages (default-headers ->
  headers-6.8 -> the newest headers-6.8.x-y-pve). A header package ships what the real one does for the
  build (``/usr/src/linux-headers-<release>`` and the ``/lib/modules/<release>/build`` link); its postinst
  records the release in the lab state (the installer and dkms stand-ins read it).

The node and container 129 reach them at ``rootfs_cache.APT_URL`` (the controller side of the lab's veth) through Debian's
real apt-get and dpkg, so an unknown package fails with apt's own message. Index files come from
apt-ftparchive (apt-utils), the packages from dpkg-deb. Runs on the controller as root, stdlib only.
"""

import os
import re
import shutil
import subprocess

import rootfs_cache

POSTINST = """#!/bin/sh
# kpro lab: the headers of %(rel)s are installed (the lab state's kernel.headers, read by the stand-ins)
set -e
[ "$1" = configure ] || exit 0
python3 - <<'PY'
import sys
sys.path.insert(0, "/usr/lib/kpro-lab")
import nvlab
with nvlab.modify() as st:
    hs = st.setdefault("kernel", {}).setdefault("headers", [])
    if "%(rel)s" not in hs:
        hs.append("%(rel)s")
PY
"""


def _relkey(rel):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.-]", rel)]


def _deb(workdir, outdir, name, version, files=None, links=None, depends=None, postinst=None):
    """Build one binary package with dpkg-deb (files: {path: text}, links: {path: target})."""
    tree = os.path.join(workdir, name)
    shutil.rmtree(tree, ignore_errors=True)
    for path, text in (files or {}).items():
        os.makedirs(os.path.dirname(tree + path), exist_ok=True)
        with open(tree + path, "w") as f:
            f.write(text)
    for path, target in (links or {}).items():
        os.makedirs(os.path.dirname(tree + path), exist_ok=True)
        os.symlink(target, tree + path)
    os.makedirs(os.path.join(tree, "DEBIAN"))
    control = ("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: kpro lab <lab@localhost>\nPriority: optional\n"
               "Section: devel\n%sDescription: kpro lab stand-in of Proxmox's %s\n"
               % (name, version, "amd64" if files else "all", "Depends: %s\n" % depends if depends else "", name))
    with open(os.path.join(tree, "DEBIAN", "control"), "w") as f:
        f.write(control)
    if postinst:
        with open(os.path.join(tree, "DEBIAN", "postinst"), "w") as f:
            f.write(postinst)
        os.chmod(os.path.join(tree, "DEBIAN", "postinst"), 0o755)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", tree, os.path.join(outdir, name + ".deb")],
                   check=True, stdout=subprocess.DEVNULL)


def header_files(rel):
    """The files of proxmox-headers-<rel> that the installer and dkms look at (nvidia-installer kernel.c
    needs include/linux/kernel.h and a version.h: tests/lab/nvidia/README.md)."""
    src = "/usr/src/linux-headers-%s" % rel
    major, minor = (int(x) for x in rel.split(".")[:2])
    return {src + "/Makefile": "# kpro lab: headers of %s\nVERSION = %d\nPATCHLEVEL = %d\n" % (rel, major, minor),
            src + "/include/linux/kernel.h": "/* kpro lab: headers of %s */\n" % rel,
            src + "/include/generated/uapi/linux/version.h":
                "#define LINUX_VERSION_CODE %d\n" % ((major << 16) + (minor << 8)),
            src + "/include/generated/utsrelease.h": '#define UTS_RELEASE "%s"\n' % rel,
            src + "/.config": "# kpro lab: the configuration of %s\nCONFIG_MODULES=y\nCONFIG_MODULE_SIG=y\n" % rel}


def _headers(workdir, outdir, rel):
    src = "/usr/src/linux-headers-%s" % rel
    _deb(workdir, outdir, "proxmox-headers-" + rel, rel.rsplit("-", 1)[0], files=header_files(rel),
         links={"/lib/modules/%s/build" % rel: src}, postinst=POSTINST % {"rel": rel})


def build_pve(run, releases):
    """apt/pve: the header packages of ``releases`` and the meta packages pointing at the newest."""
    out = os.path.join(run, "build", "apt", "pve")
    work = os.path.join(run, "aptbuild")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(out)
    os.makedirs(work)
    for rel in releases:
        _headers(work, out, rel)
    newest = sorted(releases, key=_relkey)[-1]
    series = ".".join(newest.split(".")[:2])
    _deb(work, out, "proxmox-headers-" + series, newest.rsplit("-", 1)[0], depends="proxmox-headers-" + newest)
    _deb(work, out, "proxmox-default-headers", "1.1.0", depends="proxmox-headers-" + series)
    _index(out)


def build_debian(run):
    """apt/debian: the cached Debian packages of both stock roots' pools (hard links, same filesystem)."""
    out = os.path.join(run, "build", "apt", "debian")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for variant in rootfs_cache.VARIANTS:
        pool = rootfs_cache.pool_dir(variant)
        for name in os.listdir(pool):
            dst = os.path.join(out, name)
            if not os.path.exists(dst):
                try:
                    os.link(os.path.join(pool, name), dst)
                except OSError:
                    shutil.copy(os.path.join(pool, name), dst)
    _index(out)


def _index(d):
    with open(os.path.join(d, "Packages"), "w") as f:
        subprocess.run(["apt-ftparchive", "packages", "."], cwd=d, check=True, stdout=f, stderr=subprocess.DEVNULL)
    with open(os.path.join(d, "Release"), "w") as f:
        subprocess.run(["apt-ftparchive", "release", "."], cwd=d, check=True, stdout=f)
