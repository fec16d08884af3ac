# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_peers.resolve: the model stage's sources from the inventory (the fleet's layout: containers on Proxmox hosts)."""

from __future__ import annotations

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import model_peers

HOSTVARS = {
    "kpro5": {"ansible_host": "192.0.2.15"},
    "kpro7": {"ansible_host": "192.0.2.17", "ansible_user": "admin", "ansible_port": 2222},
    "ct129": {"pve_node_host": "kpro5", "pve_vmid": 129, "model_dir": "/srv/models/Q"},
    "ct131": {"pve_node_host": "kpro7", "pve_vmid": "131", "model_dir": "/srv/models/Q"},
    "mirrorbox": {"ansible_host": "192.0.2.30", "model_dir": "/tank/models/Q"},
}
GROUPS = {"gpu_containers": ["ct129", "ct131"], "all": list(HOSTVARS)}


def resolve(sources, me="ct129", bwlimit=0):
    return model_peers.resolve(sources, HOSTVARS, GROUPS, me, bwlimit)


def test_a_container_peer_is_reached_through_its_proxmox_host_with_its_vmid():
    assert resolve([{"type": "peer", "host": "ct131"}, {"type": "hub"}]) == [
        {"type": "peer", "ssh": "admin@192.0.2.17", "port": 2222, "path": "/srv/models/Q", "vmid": 131, "bwlimit": 0},
        {"type": "hub"}]


def test_a_group_names_every_member_but_the_host_itself_in_order():
    got = resolve([{"type": "peer", "group": "gpu_containers"}], me="ct131", bwlimit=50000000)
    assert got == [{"type": "peer", "ssh": "root@192.0.2.15", "port": 22, "path": "/srv/models/Q", "vmid": 129,
                    "bwlimit": 50000000}]
    assert resolve([{"type": "peer", "group": "gpu_containers"}, {"type": "hub"}])[0]["vmid"] == 131


def test_a_plain_host_is_reached_directly_and_an_address_passes_as_given():
    assert resolve([{"type": "peer", "host": "mirrorbox", "bwlimit": 7}]) == [
        {"type": "peer", "ssh": "root@192.0.2.30", "port": 22, "path": "/tank/models/Q", "bwlimit": 7}]
    given = {"type": "peer", "ssh": "root@198.51.100.6", "path": "/srv/models/Q", "vmid": "129"}
    assert resolve([given]) == [dict(given, port=22, vmid=129, bwlimit=0)]
    assert resolve([{"type": "mirror", "path": "/mnt/m"}]) == [{"type": "mirror", "path": "/mnt/m"}]


@pytest.mark.parametrize("sources, words", [
    ([], "non-empty list"),
    ("hub", "non-empty list"),
    ([{"type": "ftp"}], "model_sources[0]"),
    ([{"type": "hub"}, {"type": "hub", "path": "/x"}], "model_sources[1]: unknown key(s) path"),
    ([{"type": "peer", "host": "ct129"}], "this host itself"),
    ([{"type": "peer", "host": "ct999"}], "'ct999' is not in the inventory"),
    ([{"type": "peer", "group": "nope"}], "group 'nope'"),
    ([{"type": "peer", "host": "kpro5"}], "has no model_dir"),
    ([{"type": "peer", "host": "ct131", "path": "/x"}], "one of them"),
    ([{"type": "peer", "ssh": "root@198.51.100.6", "path": "srv/models"}], "absolute path"),
    ([{"type": "peer", "path": "/srv/models"}], "needs ssh"),
])
def test_bad_sources_name_the_item_and_the_fix(sources, words):
    with pytest.raises(ValueError) as e:
        resolve(sources)
    assert words in str(e.value)
