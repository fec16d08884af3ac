# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """Where the kernels and DKMS keep their files: test-only options of the modules that look at every bootable kernel."""

    DOCUMENTATION = r"""
options:
  dkms_framework_conf:
    version_added: "0.2.0"
    description: Internal, for tests only (do not set) - DKMS's framework.conf.
    type: path
    default: /etc/dkms/framework.conf
  boot_dir:
    version_added: "0.2.0"
    description: Internal, for tests only (do not set) - where the kernel images are.
    type: path
    default: /boot
  modules_root:
    version_added: "0.2.0"
    description: Internal, for tests only (do not set) - the root of the kernels' module trees.
    type: path
    default: /lib/modules
"""
