# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""hf_model against the lab's mock hub (tests/lab/services/labsvc.py) on 127.0.0.1, with the real huggingface_hub."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from unittest import mock

import pytest
from ansible.module_utils import basic

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.plugins.modules import hf_model
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

pytestmark = pytest.mark.skipif(not hf.HAS_HF, reason="huggingface_hub is not installed")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
LABSVC = os.path.join(REPO, "tests", "lab", "services", "labsvc.py")
REPO_ID = "Qwen/Qwen3.6-27B"
SHARD = 1024 * 1024
TOKEN = "hf_kpgsTestTokenDoNotLog0123456789"


def _labsvc():
    spec = importlib.util.spec_from_file_location("kpgs_labsvc", LABSVC)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Hub(object):
    def __init__(self, running):
        self.running = running
        self.url = running.urls["hub"]
        self.commit = running.urls["hub_commit"]

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read().decode())

    def log(self):
        """The requests since the last call (the hub's /_log, cleared)."""
        return self.get("/_log?clear=true")

    def ctl(self, query):
        return self.get("/_ctl?" + query)


def _start(tmp_path_factory, *extra):
    svc = _labsvc()
    state = str(tmp_path_factory.mktemp("labsvc"))
    return svc.start(["--addr", "127.0.0.1", "--state-dir", state, "--hub-port", "0", "--hub-shard-size", str(SHARD)] + list(extra))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    running = _start(tmp_path_factory)
    try:
        yield Hub(running)
    finally:
        running.stop()


@pytest.fixture(scope="module")
def private_hub(tmp_path_factory):
    running = _start(tmp_path_factory, "--hub-token", TOKEN)
    try:
        yield Hub(running)
    finally:
        running.stop()


@pytest.fixture
def clean(hub):
    hub.ctl("reset=true")
    hub.log()
    yield hub
    hub.ctl("reset=true")


def _warned():
    warned = []
    return warned, mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: warned.append(msg))


def run(args, check_mode=False):
    warned, patch = _warned()
    with patch, pytest.raises(AnsibleExitJson) as e:
        run_module(hf_model, args, check_mode=check_mode)
    e.value.result["warnings"] = warned
    return e.value.result


def run_fail(args, check_mode=False):
    warned, patch = _warned()
    with patch, pytest.raises(AnsibleFailJson) as e:
        run_module(hf_model, args, check_mode=check_mode)
    e.value.result["warnings"] = warned
    return e.value.result


def body_gets(log):
    """Log entries that transferred file content (resolve GETs of regular files and the CDN GETs of LFS files)."""
    return [e for e in log if e["method"] == "GET" and e.get("file") and e["status"] in (200, 206)]


def resolve_requests(log):
    return [e for e in log if "/resolve/" in e["path"] or e["path"].startswith("/_cdn/")]


def args_for(hub, local_dir, **kw):
    a = {"repo_id": REPO_ID, "revision": hub.commit, "local_dir": str(local_dir), "endpoint": hub.url, "max_workers": 4,
         "retries": 0, "timeout": 10}
    a.update(kw)
    return a


def test_download_then_noop(clean, tmp_path):
    hub = clean
    model = tmp_path / "model"
    r = run(args_for(hub, model))
    assert r["changed"] is True
    assert r["resolved_revision"] == hub.commit and r["pinned"] is True
    assert r["files"] == 24 and r["files_complete"] == 0 and r["verified"] == 24
    assert r["bytes_downloaded"] == r["bytes_total"] == r["bytes_needed"]
    log = hub.log()
    assert sum(e["bytes"] for e in body_gets(log)) == r["bytes_total"]
    # the files are the hub's: index and shards line up, shards are valid safetensors
    index = json.loads((model / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 55600000000
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 15 and all((model / s).is_file() for s in shards)
    with open(str(model / shards[0]), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    assert [k for k, v in index["weight_map"].items() if v == shards[0]] == sorted(k for k in header if k != "__metadata__")
    assert not os.listdir(str(model / ".cache" / "kpro-hf" / "incomplete"))
    prog = json.loads((model / ".cache" / "kpro-progress.json").read_text())
    assert prog["state"] == "done" and prog["bytes_done"] == prog["bytes_total"] == r["bytes_total"] and prog["percent"] == 100.0

    # second run: nothing to do, and not a single request (pinned sha + cached listing)
    r2 = run(args_for(hub, model))
    assert r2["changed"] is False and r2["bytes_downloaded"] == 0 and r2["offline"] is True
    assert r2["verified"] == 24 and r2["files_complete"] == 24 and r2["downloaded"] == []
    assert hub.log() == []

    # a branch: one revision call to resolve it, still no file request, and a warning to pin
    r3 = run(args_for(hub, model, revision="main"))
    assert r3["changed"] is False and r3["resolved_revision"] == hub.commit and r3["pinned"] is False
    assert any("not a commit sha" in w and hub.commit in w for w in r3.get("warnings", []))
    log = hub.log()
    assert [e["path"].split("?")[0] for e in log] == ["/api/models/%s/revision/main" % REPO_ID]


def test_interrupted_download_resumes_without_refetching(clean, tmp_path):
    hub = clean
    model = tmp_path / "model"
    victim = "model-00007-of-00015.safetensors"
    cut = 300000
    hub.ctl("file=%s&cut_after=%d&cut_count=1" % (victim, cut))
    r = run_fail(args_for(hub, model))
    assert "1 of 24 files failed" in r["msg"] and victim in r["msg"] and "re-run resumes" in r["msg"]
    assert r["errors"].keys() == {victim}
    log1 = hub.log()
    first = sum(e["bytes"] for e in body_gets(log1))
    victim_first = sum(e["bytes"] for e in body_gets(log1) if e["file"] == victim)
    assert victim_first == cut
    part = model / ".cache" / "kpro-hf" / "incomplete" / (victim + ".incomplete")
    assert part.stat().st_size == cut
    assert not (model / victim).exists()

    r2 = run(args_for(hub, model))
    assert r2["changed"] is True and r2["downloaded"] == [victim] and r2["resumed"] == [victim]
    total = r2["bytes_total"]
    log2 = hub.log()
    gets = body_gets(log2)
    assert [(e["file"], e["range"], e["status"]) for e in gets] == [(victim, "bytes=%d-" % cut, 206)]
    second = sum(e["bytes"] for e in gets)
    assert r2["bytes_downloaded"] == second == (model / victim).stat().st_size - cut
    # completed bytes were not fetched again: both runs together moved exactly the repository's size
    assert first + second == total
    assert r2["verified"] == 24
    assert not part.exists()


def test_too_small_disk_refused_before_download(clean, tmp_path, monkeypatch):
    hub = clean
    model = tmp_path / "model"
    monkeypatch.setattr(hf, "free_bytes", lambda path: 5 * 1024 * 1024)
    r = run_fail(args_for(hub, model, min_free_bytes_margin=1000))
    assert r["free_bytes"] == 5 * 1024 * 1024 and r["needed_bytes"] > 15 * SHARD and r["margin_bytes"] == 1000
    assert str(r["needed_bytes"]) in r["msg"] and str(r["free_bytes"]) in r["msg"] and "nothing was downloaded" in r["msg"]
    log = hub.log()
    assert resolve_requests(log) == [] and body_gets(log) == []
    assert not any(p.suffix == ".safetensors" for p in model.rglob("*")) if model.exists() else True


def test_check_mode_reports_without_writing(clean, tmp_path):
    hub = clean
    model = tmp_path / "model"
    r = run(args_for(hub, model), check_mode=True)
    assert r["changed"] is True and len(r["downloaded"]) == 24 and r["bytes_downloaded"] == 0
    assert body_gets(hub.log()) == []
    assert not model.exists() or not any(p.is_file() for p in model.rglob("*"))


def test_patterns_and_corrupted_file(clean, tmp_path):
    hub = clean
    model = tmp_path / "model"
    r = run(args_for(hub, model, allow_patterns=["*.json", "merges.txt"], ignore_patterns=["tokenizer*"]))
    assert r["changed"] is True
    assert sorted(r["downloaded"]) == ["config.json", "generation_config.json", "merges.txt", "model.safetensors.index.json", "vocab.json"]
    assert not (model / "tokenizer.json").exists()
    hub.log()
    # same size, different bytes, mtime moved: the marker no longer holds, the hash catches it, it is fetched again
    cfg = model / "config.json"
    data = bytearray(cfg.read_bytes())
    data[10] ^= 1
    cfg.write_bytes(bytes(data))
    r2 = run(args_for(hub, model, allow_patterns=["*.json", "merges.txt"], ignore_patterns=["tokenizer*"]))
    assert r2["changed"] is True and r2["downloaded"] == ["config.json"]
    assert any("checksum mismatch" in w for w in r2.get("warnings", []))
    assert [e["file"] for e in body_gets(hub.log())] == ["config.json"]


def test_token_required_and_never_shown(private_hub, tmp_path):
    hub = private_hub
    model = tmp_path / "model"
    r = run_fail(args_for(hub, model, revision="main"))
    assert "401" in r["msg"] or "restricted" in r["msg"] or "authenticated" in r["msg"]
    hub.log()
    r = run(args_for(hub, model, token=TOKEN, revision="main"))
    assert r["changed"] is True and r["verified"] == 24
    assert TOKEN not in json.dumps(r)
    log = hub.log()
    cdn = [e for e in log if e["path"].startswith("/_cdn/")]
    assert cdn and not any(e["auth"] for e in cdn), "the token must not go to the CDN origin"
    assert all(e["auth"] for e in log if "/resolve/" in e["path"] or e["path"].startswith("/api/"))
    # a wrong token: the message does not echo it
    bad = "hf_wrongTokenValue987654321"
    r = run_fail(args_for(hub, tmp_path / "other", token=bad))
    assert bad not in json.dumps(r)
    # spec: the option is no_log
    import inspect
    assert "no_log=True" in inspect.getsource(hf_model.main)


def test_progress_visible_and_killed_process_resumes(clean, tmp_path):
    """A real module process, throttled, watched through its progress file, killed (SIGKILL) mid-file; a re-run resumes."""
    import signal
    import subprocess
    import sys
    import time
    hub = clean
    model = tmp_path / "model"
    shard = "model-00004-of-00015.safetensors"
    hub.ctl("rate=%d" % (512 * 1024))
    args = args_for(hub, model, allow_patterns=[shard])
    argfile = tmp_path / "args.json"
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_remote_tmp=str(tmp_path))}))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".collections"))
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "plugins", "modules", "hf_model.py"), str(argfile)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    progress = model / ".cache" / "kpro-progress.json"
    seen = None
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                seen = json.loads(progress.read_text())
            except (OSError, ValueError):
                seen = None
            if seen and seen["state"] == "downloading" and seen["bytes_done"] >= 300000:
                break
            time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert seen and seen["state"] == "downloading" and shard in seen["current"] and 0 < seen["percent"] < 100
    assert seen["pid"] == proc.pid and seen["rate_bps"] > 0
    part = model / ".cache" / "kpro-hf" / "incomplete" / (shard + ".incomplete")
    kept = part.stat().st_size
    assert kept >= 300000
    hub.ctl("reset=true")
    time.sleep(0.3)  # let the killed connection's handler finish its log entry
    first = sum(e["bytes"] for e in body_gets(hub.log()))
    r = run(args)
    assert r["changed"] is True and r["resumed"] == [shard]
    gets = body_gets(hub.log())
    assert [(e["range"], e["status"]) for e in gets] == [("bytes=%d-" % kept, 206)]
    size = (model / shard).stat().st_size
    assert r["bytes_downloaded"] == gets[0]["bytes"] == size - kept
    # only what was in flight when the process died (socket buffers) was sent twice
    assert 0 <= first - kept < 512 * 1024
    assert r["verified"] == 1


def test_without_huggingface_hub(clean, tmp_path, monkeypatch):
    """A complete model with a cached listing needs no library; anything else names the missing library."""
    hub = clean
    model = tmp_path / "model"
    run(args_for(hub, model, allow_patterns=["*.json"]))
    hub.log()
    monkeypatch.setattr(hf, "HAS_HF", False)
    r = run(args_for(hub, model, allow_patterns=["*.json"]))
    assert r["changed"] is False and r["offline"] is True
    r = run_fail(args_for(hub, model, allow_patterns=["*.txt"]))
    assert "huggingface_hub" in r["msg"] and "ansible_python_interpreter" in r["msg"]
    assert hub.log() == []


# --- issue 12 ---------------------------------------------------------------------------------------------
def _spawn(tmp_path, args, name):
    import subprocess
    import sys
    argfile = tmp_path / ("%s.json" % name)
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_remote_tmp=str(tmp_path))}))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".collections"))
    return subprocess.Popen([sys.executable, os.path.join(REPO, "plugins", "modules", "hf_model.py"), str(argfile)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


def _writers(model):
    """PIDs with a partial file of ``model`` open for writing (from /proc)."""
    pids = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                if os.readlink("/proc/%s/fd/%s" % (pid, fd)).startswith(str(model) + "/.cache/kpro-hf/incomplete/"):
                    pids.add(int(pid))
        except OSError:
            continue
    return pids


def test_second_run_waits_for_the_live_downloader(clean, tmp_path):
    """Two module processes on one directory (a re-run while the first goes on): one writer at a time, no file
    longer than listed, and both together fetch the repository once."""
    import time
    hub = clean
    model = tmp_path / "model"
    hub.ctl("rate=%d" % (1024 * 1024))
    args = args_for(hub, model)
    first = _spawn(tmp_path, args, "first")
    deadline = time.time() + 20
    while time.time() < deadline and not _writers(model):
        time.sleep(0.05)
    second = _spawn(tmp_path, args, "second")
    seen = set()
    while first.poll() is None or second.poll() is None:
        w = _writers(model)
        assert len(w) <= 1, "two writers: %s" % w
        seen |= w
        time.sleep(0.05)
    out1, out2 = first.communicate()[0], second.communicate()[0]
    r1, r2 = json.loads(out1), json.loads(out2)
    assert not r1.get("failed") and not r2.get("failed"), (out1, out2)
    assert seen == {first.pid}
    assert r1["changed"] is True and r2["changed"] is False and r2["bytes_downloaded"] == 0
    assert "waited" in json.dumps(r2.get("warnings")), json.dumps(r2)
    total = r1["bytes_total"]
    assert sum(e["bytes"] for e in body_gets(hub.log())) == total
    listing = dict((e["path"], e["size"]) for e in hf.load_tree_cache(str(model), REPO_ID, hub.commit))
    for path, size in listing.items():
        assert (model / path).stat().st_size == size


def test_watch_mode_result_running_and_died(clean, tmp_path):
    import time
    hub = clean
    model = tmp_path / "model"
    job = tmp_path / "job"
    base = args_for(hub, model, job=str(job))
    # a finished job: its result, and the job file is gone
    job.write_text(json.dumps({"changed": True, "bytes_downloaded": 7, "ansible_job_id": "1.2", "warnings": [
        {"event": {"msg": "checksum mismatch, downloading again: x"}, "__ansible_type": "WarningSummary"}, "plain"]}))
    r = run(base)
    assert r["finished"] is True and r["changed"] is True and r["bytes_downloaded"] == 7 and not job.exists()
    assert r["warnings"] == ["checksum mismatch, downloading again: x", "plain"]
    # a job that ended without a result and holds no lock: download_died with the remedy
    job.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "1.2"}))
    os.utime(str(job), (time.time() - 120, time.time() - 120))
    with mock.patch.object(time, "sleep", lambda s: None):
        r = run_fail(base)
    assert r["phase"] == "download_died" and "run the play again" in r["msg"]
    # a live holder of the lock: still running
    lock = hf.DirLock(str(model))
    lock.acquire(1)
    try:
        r = run(base)
    finally:
        lock.release()
    assert r["finished"] is False and r["job_state"] == "running" and r["holder"]["pid"] == os.getpid()


def test_token_file_consumed_and_bad_local_dir_refused(private_hub, tmp_path):
    hub = private_hub
    tok = tmp_path / "tok"
    tok.write_text(TOKEN)
    model = tmp_path / "model"
    r = run(args_for(hub, model, token_file=str(tok), allow_patterns=["config.json"]))
    assert r["changed"] is True and not tok.exists() and TOKEN not in json.dumps(r)
    for bad, words in (("relative/model", "not an absolute path"), (str(tmp_path / "my model"), "whitespace")):
        r = run_fail(args_for(hub, bad))
        assert words in r["msg"] and r["phase"] == "model_input"
    assert not (tmp_path / "my model").exists() and not os.path.exists("relative")


def test_refused_token_fails_in_check_mode_before_any_write(private_hub, tmp_path):
    """The listing is cached (an earlier run), a file is missing: the check-mode probe asks the hub for that file,
    so a token it refuses fails there, not later in the background job."""
    hub = private_hub
    model = tmp_path / "model"
    run(args_for(hub, model, token=TOKEN, allow_patterns=["*.json"]))
    (model / "config.json").unlink()
    before = sorted(str(p) for p in model.rglob("*"))
    bad = "hf_wrongTokenValue987654321"
    r = run_fail(args_for(hub, model, token=bad, allow_patterns=["*.json"]), check_mode=True)
    assert "Invalid credentials" in r["msg"] or "401" in r["msg"], r["msg"]
    assert bad not in json.dumps(r)
    assert sorted(str(p) for p in model.rglob("*")) == before


def test_patterns_selecting_nothing_fail_with_a_cached_listing(clean, tmp_path):
    hub = clean
    model = tmp_path / "model"
    run(args_for(hub, model, allow_patterns=["config.json"]))
    r = run_fail(args_for(hub, model, allow_patterns=["*.gguf"]))
    assert "no file of" in r["msg"] and "*.gguf" in r["msg"]


# --- the failure contract (failure.py): every known failure of a download names its phase ------------------------
def test_phases_of_a_download(clean, tmp_path, monkeypatch):
    hub = clean
    model = tmp_path / "model"
    r = run_fail(args_for(hub, model, allow_patterns=["*.gguf"]))
    assert r["phase"] == "model_input"
    r = run_fail(args_for(hub, model, revision="no-such-branch", allow_patterns=["*.json"]))
    assert r["phase"] == "model_unavailable" and r["msg"].startswith("model_unavailable: ")
    hub.ctl("file=config.json&status=500&status_count=10")
    r = run_fail(args_for(hub, model, allow_patterns=["config.json"]))
    assert r["phase"] == "download_failed" and "re-run resumes" in r["msg"]
    hub.ctl("reset=true")
    monkeypatch.setattr(hf, "free_bytes", lambda path: 1)
    r = run_fail(args_for(hub, tmp_path / "other", allow_patterns=["*.json"]))
    assert r["phase"] == "model_no_space"
    monkeypatch.setattr(hf, "HAS_HF", False)
    r = run_fail(args_for(hub, tmp_path / "third", allow_patterns=["*.json"]))
    assert r["phase"] == "library_missing" and "huggingface_hub" in r["msg"]
