# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Debian packages a stage needs, through dpkg-query and apt-get: what is missing, what apt would do.

Why not ``ansible.builtin.apt``: it needs python3-apt, which a stock Proxmox VE host or Proxmox's
standard Debian template may lack, and in check mode it refuses to run without it. ``dpkg-query``
and ``apt-get -s`` are on every Debian root, need no Python binding, and ``apt-get -s`` prints
apt's own plan (dependencies included), so ``--check`` shows exactly what a run installs.
"""

from __future__ import annotations

import re
import shlex

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

DPKG_QUERY_FORMAT = "${Package}\\t${db:Status-Status}\\n"
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
# apt-get -s still writes its binary cache and its planner log (EIPP); a simulation must change nothing,
# so both go nowhere (apt-pkg/pkgcachegen.cc: an empty Dir::Cache::pkgcache builds the cache in memory).
SIMULATE_OPTIONS = ["-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "-o", "Dir::Log::Planner=/dev/null"]
# apt-get's messages for a package it cannot install (apt-pkg/cachefile.cc, cmdline/apt-get.cc):
_UNAVAILABLE = (re.compile(r"^E: Unable to locate package (\S+)"),
                re.compile(r"^E: Package '([^']+)' has no installation candidate"),
                re.compile(r"^E: Version '[^']*' for '([^']+)' was not found"))
_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\(([^ )]+)")
# Where a package comes from, for the remedy when apt cannot find it.
_REPOSITORY_HINTS = (
    ("proxmox-", "the Proxmox VE repository (pve-no-subscription, or pve-enterprise with a subscription) in "
                 "/etc/apt/sources.list.d, then apt-get update"),
    ("pve-", "the Proxmox VE repository (pve-no-subscription, or pve-enterprise with a subscription) in "
             "/etc/apt/sources.list.d, then apt-get update"),
)
DEBIAN_HINT = ("Debian's main repository of the host's release (or a mirror of it): bookworm in /etc/apt/sources.list on "
               "PVE 8, trixie in /etc/apt/sources.list.d/debian.sources on PVE 9; then apt-get update")


def expand(names, kernel):
    """``{kernel}`` in a name is the running kernel's release (proxmox-headers-{kernel})."""
    return [n.replace("{kernel}", kernel) for n in names]


def installed(dpkg_query_out):
    """Names dpkg reports as installed (``db:Status-Status`` is ``installed``; ``config-files`` is not)."""
    out = set()
    for line in dpkg_query_out.splitlines():
        name, status = (line.split("\t", 1) + [""])[:2]
        if status.strip() == "installed":
            out.add(name.split(":")[0])
    return out


def missing(wanted, present):
    return [n for n in wanted if n not in present]


def listing(names, dpkg_query_out, kernel):
    """deb_packages' result before apt is asked: which of ``names`` dpkg lists missing (nothing installed yet)."""
    names = expand(names, kernel)
    return dict(changed=False, missing=missing(names, installed(dpkg_query_out)), would_install=[], kernel=kernel)


def query_shell(names):
    """A shell line that prints dpkg-query's lines (DPKG_QUERY_FORMAT) for ``names``, ``{kernel}`` expanded there: a
    preflight's raw probe reads the packages in the round trip it makes anyway. A name dpkg does not know prints
    nothing (it is missing); the line's status is always 0."""
    if not names:
        return "true"
    return ("{ printf '%%s\\n' %s | sed \"s/{kernel}/$(uname -r)/g\" | xargs -r dpkg-query -W -f %s 2>/dev/null; } || true"
            % (" ".join(shlex.quote(n) for n in names), shlex.quote(DPKG_QUERY_FORMAT)))


def simulation(stdout, stderr):
    """apt-get -s: ``new`` [(name, version)] it would install, ``unavailable`` names it cannot find."""
    new = [m.groups() for m in map(_INST.match, stdout.splitlines()) if m]
    unavailable = []
    for line in stderr.splitlines():
        for rx in _UNAVAILABLE:
            m = rx.match(line)
            if m:
                unavailable.append(m.group(1))
    return {"new": [{"name": n, "version": v} for n, v in new], "unavailable": unavailable}


def unavailable_failure(unavailable, stderr, refreshed):
    """The cause (apt's own words) and, per package, the repository that has it."""
    hints = sorted({next((h for p, h in _REPOSITORY_HINTS if n.startswith(p)), DEBIAN_HINT) for n in unavailable})
    when = "after apt-get update" if refreshed else "with apt's current lists (check mode does not refresh them)"
    return Failure("packages_unavailable",
                   "apt cannot install %s %s." % (", ".join(unavailable), when),
                   "Enable " + "; or ".join(hints) + ".",
                   evidence=[ln for ln in stderr.splitlines() if ln.startswith(("E:", "W:"))])


def apt_failed(what, names, rc, stderr):
    return Failure("apt_failed", "apt-get %s %s failed (rc %d)." % (what, " ".join(names), rc),
                   "Run it on the host and fix what apt reports.", stderr.splitlines()[-10:])


def plan_failure(names, rc, sim, stderr, refreshed):
    """Why apt's plan failed: packages it cannot find (with their repositories), or apt's own error."""
    if sim["unavailable"]:
        return unavailable_failure(sim["unavailable"], stderr, refreshed)
    return apt_failed("-s install", names, rc, stderr)


def install_argv(apt_get, names):
    # Recommends stay out: dkms recommends linux-headers-amd64, Debian's kernel headers, not Proxmox's.
    return [apt_get, "install", "-y", "-q", "--no-install-recommends", "-o", "Dpkg::Options::=--force-confdef",
            "-o", "Dpkg::Options::=--force-confold"] + list(names)
