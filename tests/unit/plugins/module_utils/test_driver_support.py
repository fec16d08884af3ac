# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA 580 releases' kernel bounds (module_utils/host/driver_support.py) and the preflight's filter over them
(kpro.gpu_serving.driver_kernel_problems); and that the bound is never laxer than the lab's model of the module build
(tests/lab/rootfs/usr/lib/kpro-lab/kernel_api.py): a kernel whose build fails there is refused here."""

from __future__ import annotations

import os
import sys

import pytest

from ansible_collections.kpro.gpu_serving.plugins.filter.driver_support import driver_kernel_problems
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import driver_support as ds

LABLIB = os.path.join(os.path.dirname(__file__), "..", "..", "..", "lab", "rootfs", "usr", "lib", "kpro-lab")


@pytest.mark.parametrize("driver, newest", [
    ("580.65.06", (6, 15)), ("580.76.05", (6, 15)), ("580.82.07", (6, 17)), ("580.105.08", (6, 17)),
    ("580.119.02", (6, 18)), ("580.126.09", (6, 18)), ("580.126.18", (6, 19)), ("580.142", (7, 0)),
    ("580.159.03", (7, 0)), ("580.159.04", (7, 1)), ("580.173.02", (7, 1)),
])
def test_a_release_builds_up_to_the_series_of_the_last_row_at_or_below_it(driver, newest):
    assert ds.newest_series(driver) == newest


@pytest.mark.parametrize("driver", ["570.195.03", "590.48.01", "580.40.01", "", "auto"])
def test_a_release_outside_the_table_is_not_judged(driver):
    assert ds.newest_series(driver) is None
    assert ds.problems(driver, ["7.1.0-1-pve"]) == []


def test_the_pinned_release_builds_for_every_kernel_of_pve_8_and_9_1():
    kernels = ["6.8.12-9-pve", "6.14.11-9-pve", "6.17.2-1-pve", "6.17.13-2-pve"]
    assert driver_kernel_problems(kernels, "580.126.09") == []


def test_pve_9_2s_kernel_is_refused_naming_the_release_that_builds_for_it():
    lines = driver_kernel_problems(["6.17.13-2-pve", "7.0.14-1-pve"], "580.126.09")
    assert lines == [
        "kernel 7.0.14-1-pve is newer than NVIDIA 580.126.09 builds its module for (up to 6.18, "
        "plugins/module_utils/host/driver_support.py): set gpu_host_driver_version to 580.142 or newer (the first release "
        "that builds for 7.0), or keep the host on a kernel up to 6.18 (remove the newer kernel, or proxmox-boot-tool "
        "kernel pin <release>)"]


def test_each_kernel_once_and_a_kernel_no_release_builds_for_says_so():
    lines = driver_kernel_problems("6.19.2-1-pve 7.3.0-1-pve 6.19.2-1-pve not-a-kernel", "580.126.09")
    assert len(lines) == 2
    assert "kernel 6.19.2-1-pve" in lines[0] and "to 580.126.18 or newer (the first release that builds for 6.19)" in lines[0]
    assert "kernel 7.3.0-1-pve" in lines[1] and "no NVIDIA release in the collection's table builds for 7.3 yet" in lines[1]


def test_series_and_first_supporting():
    assert ds.series("6.17.13-2-pve") == (6, 17) and ds.series("7.0") == (7, 0) and ds.series("pve") is None
    assert ds.first_supporting((6, 14)) == "580.65.06" and ds.first_supporting((6, 16)) == "580.82.07"
    assert ds.first_supporting((7, 2)) is None


def test_a_kernel_the_labs_build_fails_on_is_always_refused():
    sys.path.insert(0, LABLIB)
    try:
        import kernel_api
    finally:
        sys.path.remove(LABLIB)
    releases = ["580.65.06", "580.82.07", "580.105.08", "580.119.02", "580.126.09", "580.126.18", "580.142",
                "580.159.04"]
    kernels = ["6.14.11-9-pve", "6.17.13-2-pve", "6.18.9-1-pve", "6.19.2-1-pve", "7.0.14-1-pve", "7.1.2-1-pve"]
    failing = [(r, k) for r in releases for k in kernels if kernel_api.build_errors(r, k)]
    assert ("580.126.09", "7.0.14-1-pve") in failing and ("580.105.08", "6.18.9-1-pve") in failing
    assert [(r, k) for r, k in failing if not ds.problems(r, [k])] == []
