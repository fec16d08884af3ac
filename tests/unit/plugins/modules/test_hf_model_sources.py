# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hf_model with sources (issue 32): a peer over a fake ``ssh`` (the remote command runs here), a mirror, the hub
stand-in of the lab (tests/lab/services/labsvc.py) for the listing and the fallbacks, an offline manifest."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.module_utils.test_model_sources import KEY, install_fake_ssh, write_key
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.test_hf_model import (  # noqa: F401 pylint: disable=unused-import
    REPO_ID, args_for, body_gets, clean, hub, resolve_requests, run, run_fail)

pytestmark = pytest.mark.skipif(not hf.HAS_HF, reason="huggingface_hub is not installed")
SHARD7 = "model-00007-of-00015.safetensors"


@pytest.fixture(scope="module")
def seeded(hub, tmp_path_factory):
    """The whole model, downloaded once from the hub: what the peer and the mirror hold."""
    d = tmp_path_factory.mktemp("seed") / "model"
    run(args_for(hub, d))
    return d


@pytest.fixture
def env(clean, seeded, tmp_path, monkeypatch):
    calls = install_fake_ssh(tmp_path / "bin", monkeypatch)
    peer = tmp_path / "peer"
    shutil.copytree(str(seeded), str(peer), ignore=shutil.ignore_patterns(".cache"))
    (tmp_path / "known_hosts").write_text("10.213.5.3 ssh-ed25519 AAAA\n")
    clean.log()
    return clean, calls, peer, tmp_path


def peer_args(hub, tmp_path, peer, model, **kw):
    spec = {"type": "peer", "ssh": "root@10.213.5.3", "path": str(peer), "vmid": 131}
    a = args_for(hub, model, sources=[spec, {"type": "hub"}], ssh_key_file=write_key(tmp_path / "role-key"),
                 ssh_known_hosts_file=str(tmp_path / "known_hosts"))
    a.update(kw)
    return a


def label(peer):
    return "peer:root@10.213.5.3:131:%s" % peer


def test_peer_copies_everything_and_the_hub_sees_only_the_listing(env):
    hub, calls, peer, tmp_path = env
    model = tmp_path / "model"
    r = run(peer_args(hub, tmp_path, peer, model))
    assert r["changed"] is True and r["verified"] == r["files"] == 24
    assert r["bytes_by_source"] == {label(peer): r["bytes_total"]} and r["bytes_downloaded"] == r["bytes_total"]
    assert sorted(r["files_by_source"][label(peer)]) == sorted(r["downloaded"]) and r["fallbacks"] == []
    log = hub.log()
    assert log and resolve_requests(log) == [] and all(e["path"].startswith("/api/") for e in log)
    ssh = calls()
    masters = [c for c in ssh if "ControlMaster=yes" in c["argv"]]
    reads = [c for c in ssh if c["remote"].startswith("pct exec 131 -- tail -c +1 -- ")]
    assert len(masters) == 1 and masters[0]["remote"].startswith("pct exec 131 -- find ") and len(reads) == 24
    assert [c["ctl"] for c in ssh][-1] == "exit" and all(c["key_exists"] for c in ssh if not c["ctl"])
    key = masters[0]["argv"][masters[0]["argv"].index("-i") + 1]
    assert not os.path.exists(key) and not os.path.exists(os.path.dirname(key))  # the private copy is gone
    assert not (tmp_path / "role-key").exists() and KEY.splitlines()[1] not in json.dumps(r)
    r2 = run(peer_args(hub, tmp_path, peer, model))
    assert r2["changed"] is False and r2["bytes_by_source"] == {} and calls() == []  # complete: no peer contacted


def test_corrupt_peer_file_and_missing_one_come_from_the_hub_only(env):
    hub, calls, peer, tmp_path = env
    data = bytearray((peer / SHARD7).read_bytes())
    data[1234] ^= 0xFF
    (peer / SHARD7).write_bytes(bytes(data))  # same size, other bytes
    (peer / "config.json").unlink()
    model = tmp_path / "model"
    r = run(peer_args(hub, tmp_path, peer, model))
    assert r["verified"] == 24 and sorted(r["files_by_source"]["hub"]) == ["config.json", SHARD7]
    assert [(f["path"], f["from"], f["to"], f["reason"]) for f in r["fallbacks"]] == [(SHARD7, label(peer), "hub", "mismatch")]
    assert any("%s served a file whose sha256 differs from the Hub's: fetched from hub" % label(peer) in w for w in r["warnings"])
    size = (model / SHARD7).stat().st_size
    assert r["bytes_by_source"]["hub"] == size + (model / "config.json").stat().st_size
    assert r["bytes_by_source"][label(peer)] == r["bytes_total"] - (model / "config.json").stat().st_size
    assert sorted(e["file"] for e in body_gets(hub.log())) == ["config.json", SHARD7]
    tails = [c["remote"] for c in calls() if " tail " in c["remote"]]
    assert len(tails) == 23 and not any(t.endswith("/config.json'") for t in tails)  # not asked of the peer


def test_peer_dies_mid_file_keeps_the_part_and_the_rerun_resumes(env, monkeypatch):
    hub, calls, peer, tmp_path = env
    model = tmp_path / "model"
    monkeypatch.setenv("FAKE_SSH_DIE_AFTER", "300000")
    a = peer_args(hub, tmp_path, peer, model, allow_patterns=[SHARD7], sources=[
        {"type": "peer", "ssh": "root@10.213.5.3", "path": str(peer), "vmid": 131}])
    r = run_fail(a)
    assert r["phase"] == "download_failed" and list(r["errors"]) == [SHARD7] and "re-run resumes" in r["msg"]
    part = model / ".cache" / "kpro-hf" / "incomplete" / (SHARD7 + ".incomplete")
    assert part.stat().st_size == 300000 and not (model / SHARD7).exists() and r["bytes_by_source"] == {label(peer): 300000}
    assert [c["ctl"] for c in calls()][-1] == "exit"  # the master is closed on failure too
    monkeypatch.delenv("FAKE_SSH_DIE_AFTER")
    r = run(dict(a, ssh_key_file=write_key(tmp_path / "role-key")))
    assert r["resumed"] == [SHARD7] and r["verified"] == 1 and not part.exists()
    assert r["bytes_by_source"] == {label(peer): (model / SHARD7).stat().st_size - 300000}
    assert [c["remote"].split(" -- ")[1] for c in calls() if "tail" in c["remote"]] == ["tail -c +300001"]
    assert body_gets(hub.log()) == []


def test_manifest_and_mirror_need_no_hub_at_all(env, seeded):
    hub, calls, peer, tmp_path = env
    manifest = hf.load_tree_cache(str(seeded), REPO_ID, hub.commit)
    manifest = [dict((k, v) for k, v in e.items() if v is not None) for e in manifest]
    model = tmp_path / "model"
    r = run(args_for(hub, model, endpoint="http://127.0.0.1:9", manifest=manifest, sources=[
        {"type": "mirror", "path": str(peer)}, {"type": "hub"}]))
    assert r["verified"] == 24 and r["bytes_by_source"] == {"mirror:%s" % peer: r["bytes_total"]}
    assert hub.log() == [] and calls() == []
    # a manifest that disagrees with the mirror's bytes: the next source (the hub, dead here) is asked, the file fails
    bad = [dict(e, sha256="0" * 64) if e["path"] == SHARD7 else e for e in manifest]
    r = run_fail(args_for(hub, tmp_path / "other", endpoint="http://127.0.0.1:9", manifest=bad, retries=0, sources=[
        {"type": "mirror", "path": str(peer)}, {"type": "hub"}]))
    assert r["phase"] == "download_failed" and list(r["errors"]) == [SHARD7] and "sha256 differs from the manifest's" in json.dumps(
        r["warnings"])
    assert [(f["from"], f["to"], f["reason"]) for f in r["fallbacks"]] == [("mirror:%s" % peer, "hub", "mismatch")]


def test_check_mode_contacts_no_peer(env):
    hub, calls, peer, tmp_path = env
    r = run(peer_args(hub, tmp_path, peer, tmp_path / "model"), check_mode=True)
    assert r["changed"] is True and len(r["downloaded"]) == 24 and r["bytes_by_source"] == {}
    assert calls() == [] and body_gets(hub.log()) == []
    # the role's probe: check mode with the peers but no key (it is handed over only to the download)
    probe = dict((k, v) for k, v in peer_args(hub, tmp_path, peer, tmp_path / "model").items()
                 if k not in ("ssh_key_file", "ssh_known_hosts_file"))
    r = run(probe, check_mode=True)
    assert r["changed"] is True and len(r["downloaded"]) == 24 and calls() == []
    assert run_fail(probe)["phase"] == "model_input"  # a real run without the key is refused


def test_unreachable_peer_warns_falls_to_the_hub_and_the_key_is_scrubbed(env, monkeypatch):
    hub, _calls, peer, tmp_path = env
    monkeypatch.setenv("FAKE_SSH_LEAK", "1")
    r = run(peer_args(hub, tmp_path, peer, tmp_path / "model", allow_patterns=["*.json"]))
    assert set(r["files_by_source"]) == {"hub"} and r["verified"] == 6
    assert any("listing exited 255: oops ********" in w for w in r["warnings"]), r["warnings"]
    assert KEY.splitlines()[1] not in json.dumps(r)


@pytest.mark.parametrize("kw,words", [
    ({"ssh_known_hosts_file": None}, "needs ssh_known_hosts_file"),
    ({"sources": []}, "sources is empty"),
    ({"sources": [{"type": "mirror", "path": "relative"}]}, "absolute path"),
    ({"sources": [{"type": "peer", "ssh": "root@h", "path": "/m", "user": "x"}]}, "unknown key(s) user"),
    ({"manifest": [{"path": "a", "size": 1}]}, "one of them given"),
])
def test_bad_inputs_refused_before_anything_is_written(env, kw, words):
    hub, calls, peer, tmp_path = env
    model = tmp_path / "model"
    r = run_fail(peer_args(hub, tmp_path, peer, model, **kw))
    assert r["phase"] == "model_input" and words in r["msg"], r["msg"]
    assert not model.exists() and not (tmp_path / "role-key").exists() and calls() == [] and hub.log() == []
