# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters kpro.gpu_serving.dpkg_query_sh and kpro.gpu_serving.dpkg_listing (docs in their .yml beside this one)."""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import debpkg


def dpkg_query_sh(names):
    """module_utils/common/debpkg.py query_shell(): the shell line a raw probe runs to list ``names`` with dpkg-query."""
    return debpkg.query_shell([str(n) for n in names or []])


def dpkg_listing(names, lines, kernel):
    """deb_packages' result (changed false, missing, would_install [], kernel) read from the probe's dpkg-query lines,
    without a module run: a role installs (or, in check mode, asks apt to plan) only what it lists missing."""
    out = "\n".join(lines) if isinstance(lines, (list, tuple)) else str(lines)
    return debpkg.listing([str(n) for n in names or []], out, str(kernel).strip())


class FilterModule(object):
    def filters(self):
        return {"dpkg_query_sh": dpkg_query_sh, "dpkg_listing": dpkg_listing}
