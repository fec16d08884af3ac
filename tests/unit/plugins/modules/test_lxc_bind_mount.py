# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lxc_gpu_passthrough's bind_mount (mpN): the model's storage that outlives the container (issue 32)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import ct_mounts as cm
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import lxc_config as lc
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.test_lxc_gpu_passthrough import (  # noqa: F401  pylint: disable=unused-import
    args, assert_nothing_written, env, ok, removed_added)


def test_added_once_at_the_first_free_index_dir_made_for_the_ct_root(env):
    path, host = env / "lxc" / "129.conf", str(env / "vz" / "kpro-models")
    before = path.read_text()
    r = ok(args(env, bind_mount=dict(host_path=host, mp="/srv/models")), diff=True)
    assert r["changed"] and r["restart_required"]
    assert r["bind_mount"] == dict(host_path=host, mp="/srv/models", owner="100000:100000", created=True)
    st = os.stat(host)
    assert (st.st_uid, st.st_gid) == (100000, 100000)  # lxc.idmap: u 0 100000 / g 0 100000
    removed, added = removed_added(before, path.read_text())
    assert [a for a in added if "nvidia" not in a] == ["mp2: %s,mp=/srv/models" % host]  # mp0, mp1 are taken
    assert [x for x in removed if "nvidia" not in x and " 195:" not in x] == []
    assert "mp0: /tank/models,mp=/models,backup=0\nmp1: local-zfs:subvol-129-disk-1" in path.read_text()
    again = ok(args(env, bind_mount=dict(host_path=host, mp="/srv/models")))
    assert not again["changed"] and not again["bind_mount"]["created"]


def test_the_line_already_there_is_reused_and_a_missing_dir_made_without_a_restart(env):
    path, host = env / "lxc" / "129.conf", str(env / "tank" / "models")
    ok(args(env))  # the passthrough alone first
    path.write_text(path.read_text().replace("/tank/models", host))
    before = path.read_text()
    r = ok(args(env, bind_mount=dict(host_path=host, mp="/models")))
    assert r["changed"] and not r["restart_required"] and r["bind_mount"]["created"] and os.path.isdir(host)
    assert path.read_text() == before


def test_check_mode_makes_nothing(env):
    host = str(env / "vz" / "m")
    before = (env / "lxc" / "130.conf").read_text()
    r = ok(args(env, vmid=130, bind_mount=dict(host_path=host, mp="/srv/models")), check_mode=True, diff=True)
    assert r["changed"] and r["bind_mount"]["created"] and not os.path.exists(host)
    assert "mp0: %s,mp=/srv/models" % host in r["diff"]["after"] and (env / "lxc" / "130.conf").read_text() == before


@pytest.mark.parametrize("volume,needles", [
    (dict(host_path="models", mp="/srv/models"), ["bind_mount.host_path 'models' is not an absolute path"]),
    (dict(host_path="/etc/models", mp="/srv/models"), ["is under /etc", "/var/lib/vz/kpro-models"]),
    (dict(host_path="/usr/share/m", mp="/srv/models"), ["is under /usr"]),
    (dict(host_path="/srv/../etc", mp="/srv/models"), ["not a normalised path"]),
    (dict(host_path="/", mp="/srv/models"), ["is / itself"]),
    (dict(host_path="/var/lib/vz/m", mp="srv/models"), ["bind_mount.mp 'srv/models' is not an absolute path"]),
    (dict(host_path="/var/lib/vz/m", mp="/proc/x"), ["is under /proc"]),
    (dict(host_path="/var/lib/vz/m,ro=1", mp="/srv"), ["','"]),
    (dict(host_path="/var/lib/vz/m", mp="/var/lib/sglang"), ["mp1 already mounts local-zfs:subvol-129-disk-1 at /var/lib/sglang",
                                                             "--delete mp1"]),
])
def test_bad_input_refused_with_cause_and_fix_nothing_written(env, volume, needles):
    r = assert_nothing_written(env, args(env, bind_mount=volume), *(needles + ["nothing was written"]))
    assert r["phase"] == "bad_input"


@pytest.mark.parametrize("text,ids", [
    ("unprivileged: 1\n", (100000, 100000)),
    ("arch: amd64\n", (0, 0)),
    ("unprivileged: 1\nlxc.idmap: u 0 200000 65536\nlxc.idmap: g 0 300000 65536\n", (200000, 300000)),
    ("unprivileged: 1\nlxc.idmap: u 1 200000 65535\n", (0, 0)),  # no line for id 0: PVE keeps 0 (parse_id_maps)
])
def test_root_ids_as_pve_parse_id_maps(text, ids):
    assert cm.root_ids(lc.ConfigFile.parse(text.encode())) == ids
