# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The newest kernel each NVIDIA 580 driver release builds its module for: one table, read by the preflight.

nvidia-installer has no upper kernel bound of its own: a kernel newer than the release knows fails in the module
build, as a compiler error in make.log (DKMS's, or the installer's), after the installer ran. The bound is in the
driver's source: kernel-open/conftest.sh probes each kernel API change the release handles, and one it does not yet
probe is a compile error. A row is the first release that builds for a new kernel series; a release builds for the
series of the last row at or below it. Evidence per row (the conftest.sh of github.com/NVIDIA/open-gpu-kernel-modules
at the release's tag, and published build failures of the release before):

- 580.65.06, 6.15: the first 580 release; its newest conftest test names v6.15 ("drm_display_mode ... expected in
  v6.15"). Nothing newer is claimed for it.
- 580.82.07, 6.17: adds drm_fb_create_takes_format_info / drm_fill_fb_struct_takes_format_info (kernel commits
  81112eaac559, a34cc7bf1034, 2025-07-16 in linux-next, released in v6.17); 580.76.05 has neither.
- 580.119.02, 6.18: adds get_dev_pagemap_has_pgmap_arg ("in linux-next, expected in v6.18"); 580.105.08 fails on 6.18
  with "too many arguments to function 'get_dev_pagemap'" (uvm_va_range_device_p2p.c:363, NixOS/nixpkgs#467145).
- 580.126.18, 6.19: zone_device_page_init_has_pgmap_and_order_args; 580.126.09 guessed the 6.19 signature from
  linux-next and fails on 6.19 in uvm_hmm.c (NixOS/nixpkgs#492422; "fixes building against linux-6.19",
  glfs-book/glfs#376).
- 580.142, 7.0: adds is_vma_write_locked_has_mm_lock_seq_arg ("removed ... in v7.0-rc1"); runs on 7.0.12 where 7.1
  needed 580.159.04 (void-linux/void-packages#61087).
- 580.159.04, 7.1: NVIDIA's release notes, "Fixed kernel module build issue with Linux kernel v7.1" (quoted in
  void-linux/void-packages#61087 and NixOS/nixpkgs#525567).

Proxmox VE's kernels: 6.8 (PVE 8), 6.14 (9.0), 6.17 (9.1), 7.0 (9.2, pve-kernel master). Releases of other branches
are not in the table: for them nothing is refused here (the build's own failure still names the cause).
"""

from __future__ import annotations

import re

SUPPORT = (  # (first release of the row, newest kernel series it builds for)
    ("580.65.06", "6.15"),
    ("580.82.07", "6.17"),
    ("580.119.02", "6.18"),
    ("580.126.18", "6.19"),
    ("580.142", "7.0"),
    ("580.159.04", "7.1"),
)


def _numbers(text):
    return tuple(int(p) for p in re.findall(r"[0-9]+", str(text)))


def series(kernel):
    """'6.17.13-2-pve' -> (6, 17); None for a string that is no kernel release."""
    m = re.match(r"^\s*([0-9]+)\.([0-9]+)", str(kernel))
    return (int(m.group(1)), int(m.group(2))) if m else None


def newest_series(driver):
    """The newest kernel series ``driver`` builds for, as (major, minor); None for a release outside the table."""
    version = _numbers(driver)
    rows = [row for row in SUPPORT if version and _numbers(row[0])[0] == version[0] and _numbers(row[0]) <= version]
    return _numbers(rows[-1][1]) if rows else None


def first_supporting(kernel_series):
    """The first release in the table that builds for ``kernel_series``, or None."""
    for first, newest in SUPPORT:
        if _numbers(newest) >= tuple(kernel_series):
            return first
    return None


def problems(driver, kernels):
    """One line per kernel in ``kernels`` newer than ``driver`` builds for: the kernel, the bound, the release that
    builds for it (or that none in the table does), and what to do."""
    bound = newest_series(driver)
    out = []
    if bound is None:
        return out
    for kernel in sorted(set(k for k in kernels if series(k)), key=_numbers):
        if series(kernel) <= bound:
            continue
        want = first_supporting(series(kernel))
        fix = ("set gpu_host_driver_version to %s or newer (the first release that builds for %d.%d)" % (
            want, series(kernel)[0], series(kernel)[1]) if want else
            "no NVIDIA release in the collection's table builds for %d.%d yet" % series(kernel))
        out.append("kernel %s is newer than NVIDIA %s builds its module for (up to %d.%d, plugins/module_utils/host/"
                   "driver_support.py): %s, or keep the host on a kernel up to %d.%d (remove the newer kernel, or "
                   "proxmox-boot-tool kernel pin <release>)" % (kernel, driver, bound[0], bound[1], fix, bound[0], bound[1]))
    return out
