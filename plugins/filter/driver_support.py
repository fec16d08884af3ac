# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter kpro.gpu_serving.driver_kernel_problems (docs in driver_kernel_problems.yml beside this one)."""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import driver_support


def driver_kernel_problems(kernels, driver):
    """module_utils/host/driver_support.py problems(): a line per kernel newer than the NVIDIA release builds for."""
    if isinstance(kernels, str):
        kernels = kernels.split()
    return driver_support.problems(str(driver), [str(k).strip() for k in kernels or [] if str(k).strip()])


class FilterModule(object):
    def filters(self):
        return {"driver_kernel_problems": driver_kernel_problems}
