# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The previous model revision: the disk arithmetic (both cases and the boundary), the keep by hard links that a
download's os.replace cannot touch, the removal when only one revision fits, and the model stage's use of it."""

from __future__ import annotations

import hashlib
import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf_download as hd
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import model_revisions as mr

REPO_ID = "Qwen/Qwen3.6-27B"
A, B, C = "a" * 40, "b" * 40, "c" * 40
P = {"allow_patterns": None, "ignore_patterns": None, "min_free_bytes_margin": 10}


def entry(path, data):
    return {"path": path, "size": len(data), "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),  # nosec
            "sha256": hashlib.sha256(data).hexdigest(), "data": data}


REV = {A: [entry("config.json", b'{"a": 1}'), entry("model.safetensors", b"A" * 100)],
       B: [entry("config.json", b'{"a": 1}'), entry("model.safetensors", b"B" * 120)]}


def listing(commit):
    return [dict((k, v) for k, v in e.items() if k != "data") for e in REV[commit]]


def write_rev(d, commit, markers):
    """The model directory holding ``commit``, verified (as hf_model leaves it), its listing cached."""
    for e in REV[commit]:
        path = os.path.join(d, e["path"])
        with open(path + ".tmp", "wb") as f:
            f.write(e["data"])
        os.replace(path + ".tmp", path)
        markers[e["path"]] = hf.make_marker(e, os.stat(path))
    hf.save_tree_cache(d, REPO_ID, commit, listing(commit))
    hf.save_markers(d, markers)


@pytest.fixture
def model(tmp_path):
    d = str(tmp_path / "model")
    os.makedirs(d)
    markers = {}
    write_rev(d, A, markers)
    hf.save_tree_cache(d, REPO_ID, B, listing(B))
    return d


def test_the_disk_arithmetic_keeps_at_the_boundary_and_removes_one_byte_short():
    assert mr.decide(A, B, 100, 110, 10, 50)[0] == "keep"            # needed + margin == free: room for both
    action, msg = mr.decide(A, B, 100, 109, 10, 50)                   # one byte short of both
    assert action == "remove" and "NOT kept" in msg and "1 bytes more" in msg and "model_revision: %s" % A in msg
    assert mr.decide(A, B, 100, 60, 10, 50)[0] == "remove"           # free + reclaimable == needed + margin
    action, msg = mr.decide(A, B, 100, 59, 10, 50)                    # not even without it: the preflight fails
    assert action == "no_space" and "does not fit even without it" in msg
    assert "is kept beside" in mr.decide(A, B, 0, 0, 0, 0)[1]


def test_nothing_to_keep_for_the_same_revision_or_without_a_record(model):
    markers = hf.load_markers(model)
    assert mr.plan(model, REPO_ID, "", B, P, markers, [], 0, None)["action"] == "none"
    assert mr.plan(model, REPO_ID, B, B, P, markers, [], 0, None)["action"] == "none"
    missing = mr.plan(model, REPO_ID, C, B, P, markers, [], 0, None)
    assert missing["action"] == "missing" and "download it again" in missing["message"]


def test_keep_links_the_files_so_the_download_replacing_them_leaves_the_old_bytes(model):
    markers = hf.load_markers(model)
    todo = [e for e in listing(B) if e["path"] == "model.safetensors"]
    pl = mr.plan(model, REPO_ID, A, B, P, markers, todo, 120, 130)
    assert pl["action"] == "keep" and pl["previous"] == A and pl["reclaim"] == 100
    assert mr.keep(model, REPO_ID, A, A, pl["_entries"], markers) == []
    kept = mr.kept_path(model, A)
    assert os.stat(os.path.join(kept, "model.safetensors")).st_ino == os.stat(os.path.join(model, "model.safetensors")).st_ino
    # the link changed ctime; the markers were stamped again, so nothing is hashed again
    assert all(hf.file_status(model, e, markers)["state"] == "complete" for e in listing(A))
    write_rev(model, B, markers)  # the download: os.replace of the changed file
    with open(os.path.join(kept, "model.safetensors"), "rb") as f:
        assert f.read() == b"A" * 100
    assert mr.find_kept(model, A) == kept and mr.find_kept(model, B) is None
    again = mr.plan(model, REPO_ID, A, B, P, markers, [], 0, None)
    assert again["action"] == "kept" and kept in again["message"]
    # a later change keeps B and drops A: one previous revision is kept
    assert mr.plan(model, REPO_ID, B, C, P, markers, [], 0, None)["action"] == "keep"
    assert mr.keep(model, REPO_ID, "main", B, listing(B), markers) == [A]
    assert mr.kept_commits(model) == [B] and mr.find_kept(model, "main") == mr.kept_path(model, B)


def test_only_one_fits_the_replaced_files_are_removed_first(model):
    markers = hf.load_markers(model)
    todo = [e for e in listing(B) if e["path"] == "model.safetensors"]
    pl = mr.plan(model, REPO_ID, A, B, P, markers, todo, 120, 40)   # 130 needed, 40 free + 100 reclaimable
    assert pl["action"] == "remove"
    mr.remove(model, pl["_entries"], [e["path"] for e in todo], markers)
    assert not os.path.exists(os.path.join(model, "model.safetensors")) and os.path.exists(os.path.join(model, "config.json"))
    assert "model.safetensors" not in hf.load_markers(model) and mr.kept_commits(model) == []


def test_a_branch_means_the_commit_the_model_directory_holds(model):
    pl = mr.plan(model, REPO_ID, "main", B, P, hf.load_markers(model), [], 0, None)
    assert pl["action"] == "keep" and pl["previous"] == A


class Module(object):
    def __init__(self, check_mode):
        self.check_mode, self.warnings, self.params = check_mode, [], {}

    def warn(self, msg):
        self.warnings.append(msg)


def apply(model, check_mode, free, monkeypatch):
    """hf_download._apply over the model directory holding A, asked for B (the transfer: B's files replaced)."""
    markers = hf.load_markers(model)
    entries = listing(B)
    statuses = dict((e["path"], hf.file_status(model, e, markers)) for e in entries)
    monkeypatch.setattr(hf, "free_bytes", lambda path: free)
    monkeypatch.setattr(hd, "_download", lambda module, client, repo_id, commit, d, *a: write_rev(d, commit, markers))
    module = Module(check_mode)
    p = dict(P, keep_revision=A)
    result = {"_mismatch": [], "_markers_changed": False, "downloaded": [], "resumed": [], "changed": False}

    def fail(msg, **kw):
        raise AssertionError(msg)
    return hd._apply(module, p, None, REPO_ID, B, model, entries, statuses, markers, "", result, fail), module.warnings


def test_the_model_stage_says_and_does_it_check_mode_first(model, monkeypatch):
    r, _w = apply(model, True, 1000, monkeypatch)
    assert r["changed"] and r["previous_revision"]["action"] == "keep" and mr.kept_commits(model) == []
    r, _w = apply(model, False, 1000, monkeypatch)
    assert r["previous_revision"]["path"] == mr.kept_path(model, A) and mr.kept_commits(model) == [A]
    r, _w = apply(model, False, 1000, monkeypatch)
    assert r["changed"] is False and r["previous_revision"]["action"] == "kept"


def test_the_model_stage_removes_and_warns_when_only_one_fits(model, monkeypatch):
    r, w = apply(model, True, 50, monkeypatch)   # 130 needed, 50 free, 100 reclaimable
    assert r["previous_revision"]["action"] == "remove" and os.path.exists(os.path.join(model, "model.safetensors"))
    assert any("NOT kept" in m for m in w)
    r, w = apply(model, False, 50, monkeypatch)
    assert mr.kept_commits(model) == [] and r["previous_revision"]["action"] == "remove"
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        assert f.read() == b"B" * 120


def test_a_kept_revision_asked_for_again_comes_back_without_a_download(model):
    markers = hf.load_markers(model)
    mr.keep(model, REPO_ID, A, A, listing(A), markers)
    write_rev(model, B, markers)  # the new revision's download (then it failed its gate and was rolled back)
    # check mode: says which files would come back, changes nothing, and the local check counts them complete
    assert mr.restore_kept(model, A, markers, check_mode=True) == ["config.json", "model.safetensors"]
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        assert f.read() == b"B" * 120
    result = {"_assume": {"config.json", "model.safetensors"}, "_mismatch": [], "_markers_changed": False}
    assert all(s["state"] == "complete" for s in hd._check_local(model, listing(A), markers, True, result).values())
    assert mr.restore_kept(model, A, markers) == ["config.json", "model.safetensors"]
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        assert f.read() == b"A" * 100
    assert all(hf.file_status(model, e, hf.load_markers(model))["state"] == "complete" for e in listing(A))
    assert mr.restore_kept(model, A, markers) == []            # idempotent
    assert mr.restore_kept(model, B, markers) == [] and mr.restore_kept(model, None, markers) == []
    # a kept file changed since it was kept is not trusted: the normal check and download decide
    os.utime(os.path.join(mr.kept_path(model, A), "config.json"), ns=(1, 1))
    write_rev(model, B, markers)
    assert mr.restore_kept(model, A, markers) == ["model.safetensors"]


def test_a_kept_revision_restored_keeps_the_good_one_it_replaces_first(model, monkeypatch):
    """B deployed (good), A kept, A asked for again: B is kept before A is restored, A stays kept; probe and run agree."""
    markers = hf.load_markers(model)
    mr.keep(model, REPO_ID, A, A, listing(A), markers)
    write_rev(model, B, markers)

    class Mod:
        check_mode = True
    p = dict(P, keep_revision=B)
    probe = hd._keep_before_restore(Mod, p, REPO_ID, A, model, hf.load_markers(model), {})
    Mod.check_mode = False
    real = hd._keep_before_restore(Mod, p, REPO_ID, A, model, markers, {})
    assert probe["action"] == real["action"] == "keep" and real["_done"]
    assert mr.restore_kept(model, A, markers)
    assert mr.kept_commits(model) == [A, B]
    with open(os.path.join(mr.kept_path(model, B), "model.safetensors"), "rb") as f:
        assert f.read() == b"B" * 120


def test_reclaim_counts_only_bytes_nothing_else_links_after_dropping_older_kept(model):
    markers = hf.load_markers(model)
    mr.keep(model, REPO_ID, A, A, listing(A), markers)             # A's weights: a kept link beside the model's
    todo = listing(A)[1:]
    assert mr.reclaimable(model, listing(A), [e["path"] for e in todo]) == 0
    record = os.path.getsize(os.path.join(mr.kept_path(model, A), mr.KEPT_FILE))  # config.json: the model's link stays
    assert mr.reclaimable(model, listing(A), [e["path"] for e in todo], [A]) == 100 + record
    mr.remove(model, listing(A), [e["path"] for e in todo], markers)
    assert mr.kept_commits(model) == [] and not os.path.exists(mr.kept_path(model, A))


def test_a_refused_hard_link_is_a_named_failure_and_leaves_no_partial_kept_dir(model, monkeypatch):
    def refuse(src, dst):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", refuse)
    with pytest.raises(mr.Failure) as e:
        mr.keep(model, REPO_ID, A, A, listing(A), hf.load_markers(model))
    assert e.value.phase == "model_keep_failed" and "cross-device" in e.value.msg and "model_keep_previous_revision: false" in e.value.remedy
    assert not os.path.exists(mr.kept_path(model, A))


def test_a_kept_record_whose_files_are_gone_is_not_kept(model):
    mr.keep(model, REPO_ID, A, A, listing(A), hf.load_markers(model))
    assert mr.find_kept(model, A)
    os.unlink(os.path.join(mr.kept_path(model, A), "model.safetensors"))
    assert mr.find_kept(model, A) is None
