# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "qwen3.6-27b")
COMMIT = "6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5"


def git_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def entry(path, data, lfs=False):
    e = {"path": path, "size": len(data), "oid": git_sha1(data), "sha256": None}
    if lfs:
        e["sha256"] = hashlib.sha256(data).hexdigest()
        e["oid"] = git_sha1(b"pointer " + data[:10])
    return e


def test_is_commit():
    assert hf.is_commit(COMMIT)
    assert not hf.is_commit("main") and not hf.is_commit(COMMIT.upper()) and not hf.is_commit(COMMIT[:39]) and not hf.is_commit("")


PATHS = ["config.json", "model-00001-of-00015.safetensors", "model.safetensors.index.json", "README.md", "sub/dir/a.bin",
         "tokenizer.json", "original/consolidated.pth"]


@pytest.mark.parametrize("allow,ignore,expected", [
    (None, None, PATHS),
    (["*.json"], None, ["config.json", "model.safetensors.index.json", "tokenizer.json"]),
    ("*.json", "tokenizer*", ["config.json", "model.safetensors.index.json"]),
    (None, ["original/", "*.md"], ["config.json", "model-00001-of-00015.safetensors", "model.safetensors.index.json",
                                   "sub/dir/a.bin", "tokenizer.json"]),
    (["sub/"], None, ["sub/dir/a.bin"]),
    (["*.safetensors", "*.json"], ["*.index.json"], ["config.json", "model-00001-of-00015.safetensors", "tokenizer.json"]),
])
def test_filter_paths(allow, ignore, expected):
    assert hf.filter_paths(PATHS, allow, ignore) == expected


def test_entry_from_tree_item_dict_and_object():
    assert hf.entry_from_tree_item({"type": "directory", "path": "x", "oid": "1", "size": 0}) is None
    e = hf.entry_from_tree_item({"type": "file", "path": "m.safetensors", "size": 5, "oid": "ab",
                                 "lfs": {"oid": "cd" * 32, "size": 5, "pointerSize": 130}})
    assert e == {"path": "m.safetensors", "size": 5, "oid": "ab", "sha256": "cd" * 32}

    class Lfs(dict):
        sha256 = "ef" * 32

    class RepoFile(object):
        path, size, blob_id, lfs = "a/b.bin", 7, "12", Lfs()

    assert hf.entry_from_tree_item(RepoFile()) == {"path": "a/b.bin", "size": 7, "oid": "12", "sha256": "ef" * 32}


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x", "a\\b", ""])
def test_safe_relpath_refuses_escapes(bad):
    with pytest.raises(hf.HfError):
        hf.safe_relpath(bad)


def test_completeness_from_listing(tmp_path):
    d = str(tmp_path)
    cfg = open(os.path.join(FIXTURES, "config.json"), "rb").read()
    idx = open(os.path.join(FIXTURES, "model.safetensors.index.json"), "rb").read()
    shard = os.urandom(5000)
    entries = [entry("config.json", cfg), entry("model.safetensors.index.json", idx), entry("model-00001-of-00002.safetensors", shard, True),
               entry("model-00002-of-00002.safetensors", shard[::-1], True)]
    markers = {}
    st = dict((e["path"], hf.file_status(d, e, markers)) for e in entries)
    assert all(s["state"] == "missing" for s in st.values())
    pl = hf.plan(entries, st)
    assert pl["bytes_needed"] == pl["bytes_total"] == len(cfg) + len(idx) + 2 * len(shard) and not pl["complete"]

    # config complete (no marker yet: unverified), index absent, shard 1 partial, shard 2 complete with a marker
    (tmp_path / "config.json").write_bytes(cfg)
    part = hf.incomplete_path(d, entries[2]["path"])
    os.makedirs(os.path.dirname(part))
    with open(part, "wb") as f:
        f.write(shard[:1234])
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(shard[::-1])
    markers[entries[3]["path"]] = hf.make_marker(entries[3], os.stat(str(tmp_path / "model-00002-of-00002.safetensors")))
    st = dict((e["path"], hf.file_status(d, e, markers)) for e in entries)
    assert [st[e["path"]]["state"] for e in entries] == ["unverified", "missing", "partial", "complete"]
    assert st[entries[2]["path"]]["have"] == 1234
    pl = hf.plan(entries, st)
    assert [e["path"] for e in pl["todo"]] == ["model.safetensors.index.json", "model-00001-of-00002.safetensors"]
    assert pl["bytes_needed"] == len(idx) + len(shard) - 1234

    # verify=False: a right-sized file counts as complete without a hash
    assert hf.file_status(d, entries[0], markers, verify=False)["state"] == "complete"
    # a partial file longer than the listed size is not a partial file
    with open(part, "ab") as f:
        f.write(b"x" * 10000)
    assert hf.file_status(d, entries[2], markers)["state"] == "missing"


def test_marker_logic(tmp_path):
    data = b"hello model"
    e = entry("w.safetensors", data, lfs=True)
    p = tmp_path / "w.safetensors"
    p.write_bytes(data)
    st = os.stat(str(p))
    m = hf.make_marker(e, st)
    assert m["algo"] == "sha256" and m["digest"] == hashlib.sha256(data).hexdigest()
    assert hf.marker_valid(m, e, st)
    # touched file (mtime), other size, other revision's object: no longer valid
    os.utime(str(p), ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert not hf.marker_valid(m, e, os.stat(str(p)))
    assert not hf.marker_valid(m, dict(e, size=e["size"] + 1), st)
    assert not hf.marker_valid(m, dict(e, oid="0" * 40), st)
    assert not hf.marker_valid(None, e, st)
    # hashers: sha256 for LFS, git blob sha1 otherwise
    assert hf.hash_file(str(p), "sha256", len(data)).hexdigest() == e["sha256"]
    small = entry("config.json", data)
    assert hf.expected_digest(small) == ("git-sha1", git_sha1(data))
    assert hf.hash_file(str(p), "git-sha1", len(data)).hexdigest() == git_sha1(data)


def test_markers_and_tree_cache_roundtrip(tmp_path):
    d = str(tmp_path / "m")
    assert hf.load_markers(d) == {} and hf.load_tree_cache(d, "Qwen/Qwen3.6-27B", COMMIT) is None
    files = [{"path": "config.json", "size": 3, "oid": "a" * 40, "sha256": None}]
    hf.save_tree_cache(d, "Qwen/Qwen3.6-27B", COMMIT, files)
    assert hf.load_tree_cache(d, "Qwen/Qwen3.6-27B", COMMIT) == files
    assert hf.load_tree_cache(d, "Qwen/Qwen3.6-27B", "0" * 40) is None
    assert os.path.basename(hf.tree_cache_path(d, "Qwen/Qwen3.6-27B", COMMIT)) == "Qwen--Qwen3.6-27B--%s.json" % COMMIT
    hf.save_markers(d, {"config.json": {"size": 3}})
    assert hf.load_markers(d) == {"config.json": {"size": 3}}
    # a corrupt state file reads as empty
    with open(os.path.join(d, hf.STATE_DIR, "verified.json"), "w") as f:
        f.write("{not json")
    assert hf.load_markers(d) == {}


def test_preflight_math():
    assert hf.preflight(100, 100) is None
    assert hf.preflight(100, 150, margin=50) is None
    msg = hf.preflight(55600000000, 20000000000, margin=1000)
    assert "55600000000 bytes still to download + 1000 bytes margin" in msg
    assert "only 20000000000 bytes free (short by 35600001000 bytes)" in msg and "nothing was downloaded" in msg


def test_free_bytes_walks_up_to_an_existing_dir(tmp_path, monkeypatch):
    seen = []

    class Usage(object):
        free = 42

    monkeypatch.setattr(hf.shutil, "disk_usage", lambda p: seen.append(p) or Usage())
    assert hf.free_bytes(str(tmp_path / "a" / "b" / "c")) == 42
    assert seen == [str(tmp_path)]


def test_progress_file(tmp_path):
    path = str(tmp_path / "p" / "progress.json")
    pr = hf.Progress(path, "Qwen/Qwen3.6-27B", COMMIT, files_total=3, bytes_total=1000, bytes_present=100, interval=0.05)
    pr.start()
    pr.file_start("a", 100, 600)
    pr.add("a", 300)
    snap = pr.snapshot()
    assert snap["bytes_done"] == 400 and snap["bytes_downloaded"] == 300 and snap["current"] == {"a": [400, 600]}
    assert snap["percent"] == 40.0
    pr.file_done("a")
    pr.finish("done")
    with open(path) as f:
        d = json.load(f)
    assert d["state"] == "done" and d["files_done"] == 1 and d["current"] == {} and d["eta_s"] is None


def test_scrub():
    assert hf.scrub("Bearer hf_abc failed", "hf_abc") == "Bearer ******** failed"
    assert hf.scrub("x", None) == "x" and hf.scrub(None, "t") is None


# --- issue 12: corruption, locking, dead jobs, tokens, local_dir ------------------------------------------
def test_marker_void_after_in_place_change_with_size_and_mtime_kept(tmp_path):
    """A write in place with size and mtime set back: ctime moved, so the marker no longer vouches for the file."""
    import time
    data = b"weights" * 100
    e = entry("w.safetensors", data, lfs=True)
    p = tmp_path / "w.safetensors"
    p.write_bytes(data)
    st = os.stat(str(p))
    m = hf.make_marker(e, st)
    assert hf.marker_valid(m, e, st)
    time.sleep(0.02)
    with open(str(p), "r+b") as f:
        f.seek(100)
        f.write(b"X")
    os.utime(str(p), ns=(st.st_atime_ns, st.st_mtime_ns))
    st2 = os.stat(str(p))
    assert (st2.st_size, st2.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert not hf.marker_valid(m, e, st2)
    assert hf.file_status(str(tmp_path), e, {e["path"]: m})["state"] == "unverified"
    # a marker of an older version (no ctime/inode) is void too: such a file is hashed once more
    old = dict(m)
    del old["ctime_ns"], old["ino"]
    assert not hf.marker_valid(old, e, st)


def test_verify_full_ignores_valid_markers(tmp_path):
    data = b"weights"
    e = entry("w.safetensors", data, lfs=True)
    p = tmp_path / "w.safetensors"
    p.write_bytes(data)
    markers = {e["path"]: hf.make_marker(e, os.stat(str(p)))}
    assert hf.file_status(str(tmp_path), e, markers)["state"] == "complete"
    assert hf.file_status(str(tmp_path), e, markers, full=True)["state"] == "unverified"


@pytest.mark.parametrize("raw, words", [
    ("models/qwen", "not an absolute path"),
    ("./m", "not an absolute path"),
    ("", "not an absolute path"),
    ("/srv/my models/qwen", "whitespace"),
    ("/srv/models/qwen\t", "whitespace"),
])
def test_check_local_dir_refuses(raw, words):
    assert words in hf.check_local_dir(raw)


def test_check_local_dir_accepts_and_refuses_a_file(tmp_path):
    assert hf.check_local_dir(str(tmp_path / "m")) is None
    f = tmp_path / "f"
    f.write_text("x")
    assert "not a directory" in hf.check_local_dir(str(f))


def test_token_file_read_and_removed(tmp_path):
    p = tmp_path / "tok"
    p.write_text("hf_secret\n")
    assert hf.read_token_file(str(p)) == "hf_secret"
    assert not p.exists()
    with pytest.raises(hf.Failure) as e:
        hf.read_token_file(str(p))
    assert e.value.phase == "model_token" and "secret" not in e.value.msg


def test_dir_lock_one_holder_named_and_released(tmp_path):
    d = str(tmp_path / "m")
    assert hf.lock_holder(d) is None
    a = hf.DirLock(d)
    assert a.acquire(5) < 1
    holder = hf.lock_holder(d)
    assert holder["pid"] == os.getpid()
    b = hf.DirLock(d)
    clock = iter(range(100)).__next__
    with pytest.raises(hf.Failure) as e:
        b.acquire(3, clock=clock, sleep=lambda s: None)
    assert e.value.phase == "model_locked" and str(os.getpid()) in e.value.msg
    a.release()
    assert hf.lock_holder(d) is None
    assert b.acquire(1) < 1
    b.release()


def test_dir_lock_dropped_when_the_holder_dies(tmp_path):
    import subprocess
    import sys
    import time
    d = str(tmp_path / "m")
    code = ("import sys, time; from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf\n"
            "hf.DirLock(sys.argv[1]).acquire(5); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, d], stdout=subprocess.PIPE, universal_newlines=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert proc.stdout.readline().strip() == "held"
        assert hf.lock_holder(d)["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.1)
    assert hf.lock_holder(d) is None


def test_job_state(tmp_path):
    d = str(tmp_path / "m")
    job = tmp_path / "job"
    assert hf.job_state(str(job), d)["state"] == "gone"
    job.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "1.2"}))
    now = os.stat(str(job)).st_mtime
    assert hf.job_state(str(job), d, now=now + 5)["state"] == "starting"
    gone = hf.job_state(str(job), d, now=now + 31)
    assert gone["state"] == "gone" and "no process holds" in gone["why"]
    lock = hf.DirLock(d)
    lock.acquire(1)
    try:
        assert hf.job_state(str(job), d, now=now + 3600)["state"] == "running"
    finally:
        lock.release()
    job.write_text(json.dumps({"changed": True, "bytes_downloaded": 5}))
    st = hf.job_state(str(job), d, now=now + 3600)
    assert st["state"] == "finished" and st["result"]["bytes_downloaded"] == 5
    f = hf.died_failure(str(job), d, gone, str(tmp_path / "none.json"))
    assert f.phase == "download_died" and "run the play again" in f.remedy


def test_hub_error_messages():
    class Resp(object):
        def __init__(self, code):
            self.status_code = code

    class RepositoryNotFoundError(Exception):
        def __init__(self, msg, code):
            Exception.__init__(self, msg)
            self.response = Resp(code)

    class RevisionNotFoundError(RepositoryNotFoundError):
        pass

    class ConnectError(Exception):
        pass

    r, c = "Qwen/Qwen3.6-27B", "0" * 40
    assert "refused the token" in hf.hub_error(r, c, "http://h", RepositoryNotFoundError("401 Client Error.\nmore", 401))
    assert "not found" in hf.hub_error(r, c, "http://h", RepositoryNotFoundError("404 Client Error.", 404))
    assert "does not exist in " + r in hf.hub_error(r, c, "http://h", RevisionNotFoundError("404 Client Error.", 404))
    assert "cannot be reached" in hf.hub_error(r, c, "http://h", ConnectError("[Errno 111] Connection refused"))
    assert "more" not in hf.hub_error(r, c, "http://h", RepositoryNotFoundError("401 Client Error.\nmore", 401))


def test_progress_line_bytes_percent_rate_files_eta():
    prog = {"bytes_total": 55 * 2 ** 30, "bytes_done": 11 * 2 ** 30, "percent": 20.0, "rate_bps": 100 * 2 ** 20,
            "files_done": 3, "files_total": 15, "eta_s": 450}
    assert hf.progress_line(prog) == "11.0 GiB of 55.0 GiB (20.0%), 100.0 MiB/s, 3 of 15 files, about 450 s left"
    assert hf.progress_line(dict(prog, eta_s=None)).endswith("3 of 15 files")
    assert hf.progress_line({}) == "starting"
