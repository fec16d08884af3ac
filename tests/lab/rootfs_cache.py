"""Build (once) and cache the lab's lower layers: Debian roots as a fresh install has them.

Three roots, each from a stock package list under ``tests/lab/stock/`` (the source of each list is
named in its header):

* ``pve8``: the simulated node kpro5, the Debian part of a fresh Proxmox VE 8 install (bookworm; no
  compiler, no dkms, no python3-proxmoxer, no NVIDIA software);
* ``pve9``: the same node as a fresh Proxmox VE 9 install (Debian 13 trixie, Python 3.13, apt sources in
  deb822 files; no python3-requests either), for ``labctl.py up --release pve9``;
* ``ct``: container 129, Proxmox's stock ``debian-12-standard`` template (on either release).

Each starts from a cached ``debootstrap --variant=minbase`` of its suite. While a root is built, apt downloads
(never installs) what the collection will install on it, resolved against that root's own package
state, into ``apt-pool-<variant>/``: the lab's package mirror (tests/lab/aptrepo.py) serves those
real Debian packages, so the collection's ``apt`` tasks install the real bytes with the real apt and
dpkg, and a package the collection did not install is not there.

``ensure_rootfs(variant)`` returns the cached directory; each is built in a temporary directory and
renamed into place only when complete, with a stamp naming its inputs, so an interrupted build never
leaves a half root behind. Runs on the controller (root), Python 3.12, stdlib only.
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIRROR = "http://deb.debian.org/debian"
# The Debian suite of each root (the container is Debian 12 on either node release).
SUITES = {"pve8": "bookworm", "ct": "bookworm", "pve9": "trixie"}
STAMP_VERSION = "2"
# The lab's package mirror (aptrepo.py, served by labsvc's file server on the controller side of the veth):
# a root's apt sources, as a site with its own mirror has them. The node also has the Proxmox repository.
APT_URL = "http://10.213.5.1:18600/apt"
SOURCES = {
    "etc/apt/sources.list": "# kpro lab: Debian bookworm through the lab's mirror\ndeb [trusted=yes] %s/debian ./\n" % APT_URL,
    "etc/apt/sources.list.d/pve-no-subscription.list": (
        "# kpro lab: Proxmox VE no-subscription through the lab's mirror (lab-built proxmox-headers-*)\n"
        "deb [trusted=yes] %s/pve ./\n" % APT_URL),
}
# PVE 9 keeps its sources in deb822 files (pve-manager a819411d, "move to deb822 format"; pve-docs
# pve-package-repos.adoc: debian.sources, and proxmox.sources for pve-no-subscription) and has no sources.list. A flat
# repository in deb822 is "Suites: ./" without Components. The Debian packages of trixie are their own repository.
TRIXIE_SOURCES = {
    "etc/apt/sources.list.d/debian.sources": (
        "# kpro lab: Debian trixie through the lab's mirror\nTypes: deb\nURIs: %s/trixie\nSuites: ./\nTrusted: yes\n" % APT_URL),
    "etc/apt/sources.list.d/proxmox.sources": (
        "# kpro lab: Proxmox VE no-subscription through the lab's mirror (lab-built proxmox-headers-*)\n"
        "Types: deb\nURIs: %s/pve\nSuites: ./\nTrusted: yes\n" % APT_URL),
}
VARIANT_SOURCES = {"pve8": list(SOURCES), "ct": ["etc/apt/sources.list"], "pve9": list(TRIXIE_SOURCES)}
VARIANTS = ("pve8", "ct", "pve9")
# The node's root of each lab release (labctl.py up --release); the container's root is "ct" for both.
RELEASES = {"pve8": "pve8", "pve9": "pve9"}
# The lab mirror's Debian repository of each suite (aptrepo.build_debian): the node and the container of one lab can
# be of different suites, and apt must not mix them.
REPO_OF_SUITE = {"bookworm": "debian", "trixie": "trixie"}
# What the collection installs on each, from Debian (the Proxmox-only packages, proxmox-headers-*,
# are lab-built stand-ins: aptrepo.py). python3-apt: ansible.builtin.apt installs it when missing.
COLLECTION_PACKAGES = {
    "pve8": ["build-essential", "dkms", "python3-proxmoxer", "python3-requests", "python3-apt"],
    "pve9": ["build-essential", "dkms", "python3-proxmoxer", "python3-requests", "python3-apt"],
    # gcc, g++ and python3-dev: the runtime toolchain sglang_install installs (Triton's C launcher, nvcc's host
    # compiler, the venv Python's headers; roles/sglang_install/defaults/main.yml sglang_install_runtime_packages)
    "ct": ["python3", "python3-apt", "python3-venv", "kmod", "ca-certificates", "gcc", "g++", "python3-dev"],
}


def cache_dir():
    return os.environ.get("KPGS_LAB_CACHE", "/var/cache/kpgs-lab")


def stock_packages(variant):
    """The stock list of a variant: one package a line, ``#`` comments (the sources)."""
    with open(os.path.join(HERE, "stock", variant + ".txt")) as f:
        return [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]


def sources(variant):
    """{path in the root: text} of the variant's apt sources."""
    return {rel: (TRIXIE_SOURCES if SUITES[variant] == "trixie" else SOURCES)[rel] for rel in VARIANT_SOURCES[variant]}


def _inputs_hash(variant):
    # the bookworm roots hash what they always did (their caches stay valid); trixie's its own sources
    srcs = SOURCES if SUITES[variant] == "bookworm" else sources(variant)
    inputs = "v%s %s | %s | %s | %s" % (STAMP_VERSION, SUITES[variant], " ".join(stock_packages(variant)),
                                        " ".join(COLLECTION_PACKAGES[variant]), srcs)
    return hashlib.sha256(inputs.encode()).hexdigest()[:12]


# The inputs' hash is in the names: checkouts with other lists (branches, CI) share the cache without
# rebuilding each other's roots.
def rootfs_dir(variant):
    return os.path.join(cache_dir(), "rootfs-%s-%s-%s" % (SUITES[variant], variant, _inputs_hash(variant)))


def pool_dir(variant):
    return os.path.join(cache_dir(), "apt-pool-%s-%s" % (variant, _inputs_hash(variant)))


def _stamp_text(variant):
    return "kpgs-lab rootfs %s %s %s\n" % (SUITES[variant], variant, _inputs_hash(variant))


def is_built(variant):
    try:
        with open(os.path.join(rootfs_dir(variant), ".kpgs-lab-stamp")) as f:
            return f.read() == _stamp_text(variant) and os.path.isdir(pool_dir(variant))
    except OSError:
        return False


def _run(cmd, log):
    log("  $ %s" % " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr, stderr=sys.stderr)


def _in_chroot(root, script, log):
    """Run a shell script chrooted in ``root`` with /proc, in a private mount namespace (no host mount leaks)."""
    outer = "set -e; mount -t proc proc %(t)s/proc; chroot %(t)s sh -ec '%(s)s'; umount %(t)s/proc" % {
        "t": root, "s": "export DEBIAN_FRONTEND=noninteractive; " + script}
    _run(["unshare", "--mount", "--propagation", "private", "sh", "-c", outer], log)


def _fresh(path):
    if os.path.lexists(path):
        subprocess.run(["umount", "-l", os.path.join(path, "proc")], stderr=subprocess.DEVNULL, check=False)
        shutil.rmtree(path)


def _minbase(suite, log):
    """debootstrap minbase of ``suite``, cached: the common start of its roots (~1 min, network)."""
    final = os.path.join(cache_dir(), "debootstrap-%s-minbase" % suite)
    if os.path.isfile(os.path.join(final, ".kpgs-lab-stamp")):
        return final
    tmp = final + ".building"
    _fresh(tmp)
    _run(["debootstrap", "--variant=minbase", suite, tmp, MIRROR], log)
    with open(os.path.join(tmp, ".kpgs-lab-stamp"), "w") as f:
        f.write("minbase\n")
    _fresh(final)
    os.rename(tmp, final)
    return final


def _build(variant, log):
    tmp = rootfs_dir(variant) + ".building"
    _fresh(tmp)
    _run(["cp", "-a", _minbase(SUITES[variant], log), tmp], log)
    os.unlink(os.path.join(tmp, ".kpgs-lab-stamp"))
    _write_policy_rc(tmp)  # no service starts inside the chroot (exit 101)
    script = "apt-get update -qq; apt-get install -y -qq --no-install-recommends %s; apt-get clean; " \
             "apt-get install -y -qq --no-install-recommends --download-only %s"
    _in_chroot(tmp, script % (" ".join(stock_packages(variant)), " ".join(COLLECTION_PACKAGES[variant])), log)
    pool = pool_dir(variant)
    _fresh(pool + ".new")
    shutil.move(os.path.join(tmp, "var/cache/apt/archives"), pool + ".new")
    os.makedirs(os.path.join(tmp, "var/cache/apt/archives/partial"))
    for name in os.listdir(pool + ".new"):
        if not name.endswith(".deb"):
            shutil.rmtree(os.path.join(pool + ".new", name), ignore_errors=True)
    # A fresh install has no lists from the lab's mirror; the lab's up runs apt-get update once on the node.
    shutil.rmtree(os.path.join(tmp, "var/lib/apt/lists"))
    os.makedirs(os.path.join(tmp, "var/lib/apt/lists/partial"))
    if SUITES[variant] == "trixie" and os.path.exists(os.path.join(tmp, "etc/apt/sources.list")):
        os.unlink(os.path.join(tmp, "etc/apt/sources.list"))  # debootstrap's; a PVE 9 host has debian.sources
    for rel, text in sources(variant).items():
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
        with open(os.path.join(tmp, rel), "w") as f:
            f.write(text)
    for name in os.listdir(os.path.join(tmp, "etc/ssh")) if os.path.isdir(os.path.join(tmp, "etc/ssh")) else []:
        if name.startswith("ssh_host_"):  # the lab brings its own host keys
            os.unlink(os.path.join(tmp, "etc/ssh", name))
    return tmp, pool


def ensure_rootfs(variant, log=lambda m: print(m, file=sys.stderr)):
    """Return the cached root of ``variant``, building it first if needed (a few minutes the first time)."""
    os.makedirs(cache_dir(), exist_ok=True)
    final = rootfs_dir(variant)
    with open(os.path.join(cache_dir(), ".build.lock"), "a") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        if is_built(variant):
            return final
        t0 = time.time()
        log("building the lab's %s root (debootstrap %s + tests/lab/stock/%s.txt) into %s" % (
            variant, SUITES[variant], variant, final))
        tmp, pool = _build(variant, log)
        with open(os.path.join(tmp, ".kpgs-lab-stamp"), "w") as f:
            f.write(_stamp_text(variant))
        _fresh(pool)
        os.rename(pool + ".new", pool)
        _fresh(final)
        os.rename(tmp, final)
        log("%s root built in %.1fs (%d packages in its apt pool)" % (variant, time.time() - t0, len(os.listdir(pool))))
        return final


def _write_policy_rc(tmp):
    path = os.path.join(tmp, "usr/sbin/policy-rc.d")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 101\n")
    os.chmod(path, 0o755)


if __name__ == "__main__":
    for v in sys.argv[1:] or VARIANTS:
        print(ensure_rootfs(v))
