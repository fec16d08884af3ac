"""The lab's package mirror: two flat apt repositories served by the lab's file server (labsvc).

* ``apt/debian``: the real Debian packages the collection installs, with their dependencies, as
  downloaded against each stock root (rootfs_cache.COLLECTION_PACKAGES, cached in the apt pools);
  ``apt/trixie`` the same for a PVE 9 node (``labctl.py up --release pve9``; its container stays bookworm);
* ``apt/pve``: lab-built stand-ins of the Proxmox-only packages: ``proxmox-headers-<release>`` for each
  release of the node's ``kernel.headers_available``, ``proxmox-headers-<major.minor>`` and
  ``proxmox-default-headers``, with the dependency chain of the real meta packages (default-headers ->
  headers-6.8 -> the newest headers-6.8.x-y-pve). A header package ships what the real one does for the
  build (``/usr/src/linux-headers-<release>`` with ``scripts/sign-file``, and the ``/lib/modules/<release>/build``
  link); its postinst records the release in the lab state (the installer and dkms stand-ins read it) and
  nothing else: Proxmox's headers postinst runs no hook (see the comment above KERNEL_POSTINST).
  The kernels: ``proxmox-kernel-<release>`` for each release of ``kernel.published`` (default: the installed
  ones), with the meta chain ``proxmox-default-kernel`` -> ``proxmox-kernel-6.8`` -> the newest release
  (pve-kernel-meta's debian/control). A kernel package ships ``/boot/vmlinuz-<rel>``, ``System.map``,
  ``config`` and ``/lib/modules/<rel>``; its postinst records the release in the lab state and runs
  ``/etc/kernel/postinst.d`` with the release and image path, as Proxmox's kernel postinst does.

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


# The headers package's postinst runs NO hook. pve-kernel (branch bookworm-6.8, the 6.8 kernels of PVE 8)
# debian/rules:112 makes proxmox-headers-<rel>'s postinst from debian/proxmox-headers.postinst.in, whose every case
# (lines 6-58) is ":" (unchanged since 2018). Debian's linux-headers postinst runs /etc/kernel/header_postinst.d;
# Proxmox's does not, so dkms's /etc/kernel/header_postinst.d/dkms (dkms v3.0.10 Makefile:61-63, install-debian: the
# same script as /etc/kernel/postinst.d/dkms, Makefile:52; kernel_postinst.d_dkms:37-38 execs
# `dkms_autoinstaller start <rel>`) never runs on a PVE host. Installing a kernel's headers after the kernel builds
# nothing: the module comes from the kernel postinst's postinst.d/dkms (headers unpacked first, as apt full-upgrade
# with headers available does), from `dkms autoinstall -k <rel>` / `dkms install`, or from the gpu_host stage.

# The kernel image package's postinst (pve-kernel bookworm-6.8 debian/proxmox-kernel.postinst.in:7-23, installed as
# proxmox-kernel-<rel>'s postinst by debian/rules:111, and as the signed kernel's by :130): nothing in the installer's
# mode, depmod, "Examining /etc/kernel/postinst.d.", then the postinst.d hooks with the release and the image path
# (run-parts --verbose --exit-on-error) (initramfs-tools builds the initrd, dkms autoinstalls for that kernel when
# its headers are there, zz-proxmox-boot copies it to the ESPs).
# KPGS_LAB_SEED: the stock host's own kernels are registered with dpkg at the lab's first boot; their hooks ran
# when the host was installed (the seed holds their results), so they do not run again.
KERNEL_POSTINST = """#!/bin/sh
# kpro lab stand-in of proxmox-kernel-%(rel)s's postinst
set -e
[ "$1" = configure ] || exit 0
python3 - <<'PY'
import sys
sys.path.insert(0, "/usr/lib/kpro-lab")
import labstate
with labstate.modify() as st:
    labstate.register_kernel(st, "%(rel)s")
PY
[ -n "${KPGS_LAB_SEED:-}" ] && exit 0
[ -e /proxmox_install_mode ] && exit 0
depmod %(rel)s 2>/dev/null || true
if [ -d /etc/kernel/postinst.d ]; then
    echo "Examining /etc/kernel/postinst.d." >&2
    run-parts --verbose --exit-on-error --arg=%(rel)s --arg=/boot/vmlinuz-%(rel)s /etc/kernel/postinst.d || {
        echo "Failed to process /etc/kernel/postinst.d" >&2; exit 1; }
fi
"""

KERNEL_POSTRM = """#!/bin/sh
# kpro lab stand-in of proxmox-kernel-%(rel)s's postrm: the release leaves the lab state's installed kernels
set -e
[ "$1" = remove ] || [ "$1" = purge ] || exit 0
python3 - <<'PY'
import sys
sys.path.insert(0, "/usr/lib/kpro-lab")
import labstate
with labstate.modify() as st:
    labstate.unregister_kernel(st, "%(rel)s")
PY
"""


def _relkey(rel):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.-]", rel)]


def _deb(workdir, outdir, name, version, files=None, links=None, depends=None, postinst=None, postrm=None, modes=None):
    """Build one binary package with dpkg-deb (files: {path: text}, links: {path: target})."""
    tree = os.path.join(workdir, name)
    shutil.rmtree(tree, ignore_errors=True)
    for path, text in (files or {}).items():
        os.makedirs(os.path.dirname(tree + path), exist_ok=True)
        with open(tree + path, "w") as f:
            f.write(text)
        if (modes or {}).get(path):
            os.chmod(tree + path, modes[path])
    for path, target in (links or {}).items():
        os.makedirs(os.path.dirname(tree + path), exist_ok=True)
        os.symlink(target, tree + path)
    os.makedirs(os.path.join(tree, "DEBIAN"))
    control = ("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: kpro lab <lab@localhost>\nPriority: optional\n"
               "Section: devel\n%sDescription: kpro lab stand-in of Proxmox's %s\n"
               % (name, version, "amd64" if files else "all", "Depends: %s\n" % depends if depends else "", name))
    with open(os.path.join(tree, "DEBIAN", "control"), "w") as f:
        f.write(control)
    for script, text in (("postinst", postinst), ("postrm", postrm)):
        if text:
            with open(os.path.join(tree, "DEBIAN", script), "w") as f:
                f.write(text)
            os.chmod(os.path.join(tree, "DEBIAN", script), 0o755)
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
            src + "/.config": "# kpro lab: the configuration of %s\nCONFIG_MODULES=y\nCONFIG_MODULE_SIG=y\n"
                              "CONFIG_MODULE_SIG_HASH=\"sha512\"\n" % rel,
            # dkms signs with /lib/modules/<rel>/build/scripts/sign-file when it exists (dkms 3.0.10
            # prepare_signing(), /usr/sbin/dkms:915-936); Proxmox's headers ship it. The lab's dkms stand-in
            # signs itself; this file is what it looks for.
            src + "/scripts/sign-file": "#!/bin/sh\n# kpro lab: stand-in of the kernel's scripts/sign-file\nexit 0\n"}


def _headers(workdir, outdir, rel):
    src = "/usr/src/linux-headers-%s" % rel
    _deb(workdir, outdir, "proxmox-headers-" + rel, rel.rsplit("-", 1)[0], files=header_files(rel),
         links={"/lib/modules/%s/build" % rel: src}, postinst=POSTINST % {"rel": rel},
         modes={src + "/scripts/sign-file": 0o755})


def kernel_files(rel):
    """The files of proxmox-kernel-<rel> that anything in the lab looks at (placeholders)."""
    return {"/boot/vmlinuz-%s" % rel: "kpro lab: the image of Linux %s\n" % rel,
            "/boot/System.map-%s" % rel: "kpro lab: System.map of %s\n" % rel,
            "/boot/config-%s" % rel: "# kpro lab: the configuration of %s\nCONFIG_MODULES=y\nCONFIG_MODULE_SIG=y\n" % rel,
            "/lib/modules/%s/modules.builtin" % rel: "",
            "/lib/modules/%s/modules.order" % rel: ""}


def _kernel(workdir, outdir, rel):
    _deb(workdir, outdir, "proxmox-kernel-" + rel, rel.rsplit("-", 1)[0], files=kernel_files(rel),
         postinst=KERNEL_POSTINST % {"rel": rel}, postrm=KERNEL_POSTRM % {"rel": rel})


def build_pve(run, releases, kernels=None):
    """apt/pve: the header packages of ``releases``, the kernel packages of ``kernels`` and the meta packages
    pointing at the newest of each."""
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
    if kernels:
        for rel in kernels:
            _kernel(work, out, rel)
        newest = sorted(kernels, key=_relkey)[-1]
        series = ".".join(newest.split(".")[:2])
        # pve-kernel-meta: proxmox-kernel-6.8 depends on the signed image or the unsigned one of the newest ABI;
        # the lab builds the unsigned name only (apt takes the alternative that exists)
        _deb(work, out, "proxmox-kernel-" + series, newest.rsplit("-", 1)[0],
             depends="proxmox-kernel-%s-signed | proxmox-kernel-%s" % (newest, newest))
        _deb(work, out, "proxmox-default-kernel", "1.1.0", depends="proxmox-kernel-" + series)
    _index(out)


def build_debian(run, variants=("pve8", "ct")):
    """One repository per Debian suite of ``variants`` (the lab's node and container roots): apt/debian (bookworm) and
    apt/trixie, each the cached Debian packages of its roots' pools (hard links, same filesystem). A suite's repository
    holds only its own suite's packages: apt would take trixie's newer versions into a bookworm container."""
    repos = {}
    for variant in variants:
        repos.setdefault(rootfs_cache.REPO_OF_SUITE[rootfs_cache.SUITES[variant]], []).append(variant)
    for repo in rootfs_cache.REPO_OF_SUITE.values():
        shutil.rmtree(os.path.join(run, "build", "apt", repo), ignore_errors=True)
    for repo, members in repos.items():
        out = os.path.join(run, "build", "apt", repo)
        os.makedirs(out)
        for variant in members:
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
