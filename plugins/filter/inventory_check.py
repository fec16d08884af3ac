# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters kpro.gpu_serving.inventory_problems and inventory_address_problems (docs in the .yml files beside this
one): the offline inventory check's decisions (module_utils/controller/inventory_check.py), for playbooks/check-inventory.yml and
the preflight."""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import inventory_check


def inventory_problems(inputs, host, defaults=None, lock_dir=""):
    """Every problem of one host's inputs (the lookup kpro.gpu_serving.inventory_inputs' result). A failure of the
    check itself is one more problem of the host, so that the other hosts are still checked and listed."""
    try:
        return inventory_check.host_problems(inputs, str(host), defaults, str(lock_dir or ""))
    except Exception as e:  # pylint: disable=broad-except
        return [inventory_check.problem(str(host), "-", "the check itself failed: %s: %s" % (type(e).__name__, e),
                                        "report it (kpro.gpu_serving.inventory_problems)")]


def inventory_address_problems(hosts):
    """Across the run's hosts: addresses present and distinct, each pct container's pct_host its node's address."""
    return inventory_check.address_problems(dict(hosts or {}))


def sglang_lock_pythons(lock_dir, version, arch="*"):
    """The Pythons the collection has a lock for (module_utils/controller/inventory_check.py lock_pythons): the preflight's list."""
    return inventory_check.lock_pythons(str(lock_dir), str(version), str(arch))


class FilterModule(object):
    def filters(self):
        return {"inventory_problems": inventory_problems, "inventory_address_problems": inventory_address_problems,
                "sglang_lock_pythons": sglang_lock_pythons}
