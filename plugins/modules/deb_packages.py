#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deb_packages
short_description: Install the Debian packages a stage needs, on a stock host, with a truthful check mode
version_added: "0.1.0"
description:
  - Finds which of O(name) are not installed (C(dpkg-query)), asks apt what installing them means
    (C(apt-get -s), dependencies included) and installs them with C(apt-get install --no-install-recommends).
  - Works on a root without python3-apt (a stock Proxmox VE host, Proxmox's standard Debian template), in
    check mode too, where M(ansible.builtin.apt) cannot run.
  - When apt cannot find a package, refreshes its lists once (C(apt-get update), not in check mode), then fails
    before installing anything, with apt's message and the repository that has the package
    (RV(phase=packages_unavailable)).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  name:
    description:
      - Package names. C({kernel}) in a name stands for the running kernel's release
        (C(proxmox-headers-{kernel})), read from C(/proc/sys/kernel/osrelease).
    type: list
    elements: str
    required: true
attributes:
  check_mode:
    support: full
    description: Reports apt's plan (RV(would_install)) and changes nothing, apt's lists included.
  diff_mode:
    support: full
    description: The packages that would be installed, one per line.
"""

EXAMPLES = r"""
- name: What the NVIDIA installer and DKMS need on a stock Proxmox VE host
  kpro.gpu_serving.deb_packages:
    name: [build-essential, dkms, "proxmox-headers-{kernel}", proxmox-default-headers]
"""

RETURN = r"""
missing:
  description: The requested packages that were not installed.
  returned: always
  type: list
  elements: str
would_install:
  description: apt's plan for them, dependencies included (C(name), C(version)); installed unless in check mode.
  returned: always
  type: list
  elements: dict
kernel:
  description: The running kernel's release that C({kernel}) stood for.
  returned: always
  type: str
phase:
  description: C(packages_unavailable) when apt cannot install a package, C(apt_failed) when apt fails otherwise.
  returned: failure
  type: str
evidence:
  description: apt's error lines.
  returned: failure
  type: list
  elements: str
remedy:
  description: What to do, for a package apt cannot find the repository that has it.
  returned: failure
  type: str
"""

import glob

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import debpkg
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail

OSRELEASE = "/proc/sys/kernel/osrelease"


def check_mode_unknown(module, sim):
    """Check mode on a root whose apt lists were never fetched (a fresh template): apt knows nothing yet."""
    return module.check_mode and sim["unavailable"] and not glob.glob("/var/lib/apt/lists/*Packages*")


def plan(module, apt_get, names):
    """apt's plan for ``names``; lists refreshed once when apt cannot find one (not in check mode)."""
    refreshed, update_err = False, ""
    while True:
        rc, out, err = module.run_command([apt_get, "-s"] + debpkg.SIMULATE_OPTIONS + debpkg.install_argv(apt_get, names)[1:],
                                          environ_update=debpkg.APT_ENV)
        sim = debpkg.simulation(out, err)
        if rc == 0:
            return sim["new"]
        if check_mode_unknown(module, sim):
            module.warn("apt's lists are empty: %s would be looked up after apt-get update" % ", ".join(sim["unavailable"]))
            return [{"name": n, "version": "?"} for n in names]
        if refreshed or module.check_mode or not sim["unavailable"]:
            raise debpkg.plan_failure(names, rc, sim, update_err + err, refreshed)
        # A failed source (pve-enterprise without a subscription answers 401) does not stop the others;
        # apt's words about it become evidence if the package is still missing.
        update_err = module.run_command([apt_get, "update", "-q"], environ_update=debpkg.APT_ENV)[2]
        refreshed = True


def main():
    module = AnsibleModule(argument_spec=dict(name=dict(type="list", elements="str", required=True)),
                           supports_check_mode=True)
    with open(OSRELEASE) as f:
        kernel = f.read().strip()
    names = debpkg.expand(module.params["name"], kernel)
    # dpkg-query without names would list every package: nothing asked, nothing to query.
    out = module.run_command(["dpkg-query", "-W", "-f", debpkg.DPKG_QUERY_FORMAT] + names)[1] if names else ""
    result = debpkg.listing(names, out, kernel)
    missing = result["missing"]
    if not missing:
        module.exit_json(**result)
    apt_get = module.get_bin_path("apt-get", required=True)
    try:
        result["would_install"] = plan(module, apt_get, missing)
        result["changed"] = True
        result["diff"] = {"before": "", "after": "".join("%(name)s %(version)s\n" % p for p in result["would_install"])}
        if not module.check_mode:
            rc, _out, err = module.run_command(debpkg.install_argv(apt_get, missing), environ_update=debpkg.APT_ENV)
            if rc != 0:
                raise debpkg.apt_failed("install", missing, rc, err)
    except Failure as e:
        fail(module, e, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
