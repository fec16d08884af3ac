# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one list of nodes made at boot: the unit is rendered from it, the passthrough reads it."""

from __future__ import annotations

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import device_nodes as dn
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_installer as ni
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import reboot_check as rc


@pytest.mark.parametrize("count", [1, 2, 4])
def test_the_unit_makes_exactly_the_declared_nodes(count):
    # read back through the pre-reboot check's parser of the installed unit: the unit text and the list agree
    assert rc.unit_nodes(ni.device_nodes_unit(count)) == set(dn.boot_nodes(count))


def test_unit_lines_unchanged_for_hosts_that_have_it():
    # the rendered unit is byte for byte the one earlier releases installed (no change, no daemon-reload on a host)
    unit = ni.device_nodes_unit(2)
    assert ("ExecStart=/usr/bin/nvidia-modprobe -c 0 -c 1 -c 255\nExecStart=/usr/bin/nvidia-modprobe -u -c 0\n"
            "ExecStart=/usr/bin/nvidia-modprobe -m\n\n[Install]\n") in unit


@pytest.mark.parametrize("path,made", [
    ("/dev/nvidia0", True), ("/dev/nvidia7", True), ("/dev/nvidiactl", True), ("/dev/nvidia-uvm", True),
    ("/dev/nvidia-uvm-tools", True), ("/dev/nvidia-modeset", True),
    ("/dev/nvidia-caps/nvidia-cap1", False), ("/dev/nvidia-caps/nvidia-cap2", False),
    ("/dev/nvidia-caps-imex-channels/channel0", False), ("/dev/nvidia-nvlink", False), ("", False), (None, False)])
def test_made_at_boot(path, made):
    assert dn.made_at_boot(path) is made
