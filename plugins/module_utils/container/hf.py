# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model download from a Hugging Face Hub: listing, completeness, disk preflight, resumable transfer, verification.

Pure parts (pattern filtering, completeness from a listing, preflight, markers) take paths and data as
arguments. The transfer uses huggingface_hub (``hf_hub_url``, ``get_hf_file_metadata``, ``HfApi``, its HTTP
session) but does its own resume: huggingface_hub (2.x, since PR #4228) writes every download to a
process-unique temporary file and deletes it on failure, so a second process cannot resume it. Here each
file goes to ``<local_dir>/.cache/kpro-hf/incomplete/<path>.incomplete`` and a later run continues it with
an HTTP ``Range`` request.

State kept under ``<local_dir>/.cache/kpro-hf/``:
  - ``trees/<repo>--<commit>.json``: the hub's file listing for a commit (a pinned revision is then checked
    for completeness without any network request);
  - ``verified.json``: per file ``{size, mtime_ns, ctime_ns, ino, oid, sha256|sha1}`` written after a checksum
    matched, so a complete file is not hashed again on every run (ctime cannot be set back by ``touch``: a file
    changed in place is hashed again);
  - ``incomplete/``: partial files, resumed by the next run;
  - ``download.lock``: one downloader per model directory (``flock``, the holder's PID written in it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import threading
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write, load_json

try:
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover
    from urlparse import urlsplit  # type: ignore

HF_IMPORT_ERROR = None
try:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session
    HAS_HF = True
except Exception as e:  # pylint: disable=broad-except
    HAS_HF = False
    HF_IMPORT_ERROR = e

STATE_DIR = os.path.join(".cache", "kpro-hf")
PROGRESS_FILE = os.path.join(".cache", "kpro-progress.json")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 1024 * 1024
LIBRARY_NAME = "kpro.gpu_serving"
LOCK_FILE = "download.lock"


class HfError(Exception):
    """A failure with a message for the operator (cause and fix)."""


class HfFatal(HfError):
    """A failure that a retry cannot fix (HTTP 4xx, disk full)."""


class HfMismatch(HfError):
    """The bytes of a source are not the listed file (size or hash): the partial file is removed, never resumed."""


# ---------------------------------------------------------------------------------------------------------
# pure helpers
# ---------------------------------------------------------------------------------------------------------
def is_commit(revision):
    return bool(revision) and bool(HEX40.match(revision))


def normalize_patterns(patterns):
    """None, a string or a list → list (or None). ``dir/`` means everything under ``dir`` (as huggingface_hub)."""
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for p in patterns:
        out.append(p + "*" if p.endswith("/") else p)
    return out


def filter_paths(paths, allow_patterns=None, ignore_patterns=None):
    """The paths kept by huggingface_hub's ``filter_repo_objects`` semantics (fnmatch on the whole path)."""
    allow = normalize_patterns(allow_patterns)
    ignore = normalize_patterns(ignore_patterns)
    out = []
    for p in paths:
        if allow is not None and not any(fnmatch.fnmatch(p, a) for a in allow):
            continue
        if ignore is not None and any(fnmatch.fnmatch(p, i) for i in ignore):
            continue
        out.append(p)
    return out


def entry_from_tree_item(item):
    """A hub tree item (dict from the API or huggingface_hub's RepoFile) → ``{path, size, oid, sha256}``; None for folders."""
    if isinstance(item, dict):
        if item.get("type", "file") != "file":
            return None
        lfs = item.get("lfs") or None
        sha = None
        if lfs:
            sha = lfs.get("oid") or lfs.get("sha256")
        return {"path": item["path"], "size": int(item["size"]), "oid": item.get("oid") or item.get("blob_id"), "sha256": sha}
    if not hasattr(item, "size") or not hasattr(item, "blob_id"):
        return None
    lfs = getattr(item, "lfs", None)
    sha = None
    if lfs is not None:
        sha = getattr(lfs, "sha256", None) or (lfs.get("sha256") if isinstance(lfs, dict) else None)
    return {"path": item.path, "size": int(item.size), "oid": item.blob_id, "sha256": sha}


def select_entries(entries, allow_patterns=None, ignore_patterns=None):
    keep = set(filter_paths([e["path"] for e in entries], allow_patterns, ignore_patterns))
    return [e for e in entries if e["path"] in keep]


def safe_relpath(path):
    """Refuse repository paths that would leave local_dir."""
    norm = os.path.normpath(path)
    if os.path.isabs(path) or norm == ".." or norm.startswith(".." + os.sep) or "\\" in path or not path:
        raise HfError("refusing repository path %r: it would be written outside local_dir" % path)
    return norm


def state_path(local_dir, *parts):
    return os.path.join(local_dir, STATE_DIR, *parts)


def incomplete_path(local_dir, path):
    return state_path(local_dir, "incomplete", safe_relpath(path) + ".incomplete")


def tree_cache_path(local_dir, repo_id, commit):
    return state_path(local_dir, "trees", "%s--%s.json" % (repo_id.replace("/", "--"), commit))


def save_json(path, data):
    """Atomic write (temp file + rename in the same directory), 0600."""
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        os.makedirs(d)
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"), mode=MODE_DEFAULT, default_mode=0o600,
                 unique_tmp=True)


def load_tree_cache(local_dir, repo_id, commit):
    data = load_json(tree_cache_path(local_dir, repo_id, commit))
    if not isinstance(data, dict) or data.get("commit") != commit or not isinstance(data.get("files"), list):
        return None
    return data["files"]


def save_tree_cache(local_dir, repo_id, commit, entries):
    save_json(tree_cache_path(local_dir, repo_id, commit), {"repo_id": repo_id, "commit": commit, "files": entries})


def load_markers(local_dir):
    data = load_json(state_path(local_dir, "verified.json"), {})
    return data if isinstance(data, dict) else {}


def save_markers(local_dir, markers):
    save_json(state_path(local_dir, "verified.json"), markers)


def expected_digest(entry):
    """(algorithm, hex) the hub lets us check: sha256 of LFS files, the git blob sha1 of the others."""
    if entry.get("sha256"):
        return "sha256", entry["sha256"]
    if entry.get("oid"):
        return "git-sha1", entry["oid"]
    return None, None


def make_marker(entry, st):
    algo, digest = expected_digest(entry)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "oid": entry.get("oid"), "algo": algo, "digest": digest}


def marker_valid(marker, entry, st):
    """A marker proves the file was checked: same size, inode, mtime and ctime as then, same hub oid as now.

    ctime is what a write in place changes and ``touch``/``os.utime`` cannot set back; markers of older
    versions (without it) are not valid, so such files are hashed once more."""
    if not isinstance(marker, dict):
        return False
    algo, digest = expected_digest(entry)
    return (marker.get("size") == st.st_size == entry["size"] and marker.get("mtime_ns") == st.st_mtime_ns
            and marker.get("ctime_ns") == st.st_ctime_ns and marker.get("ino") == st.st_ino
            and marker.get("oid") == entry.get("oid") and marker.get("digest") == digest)


class Hasher(object):
    """sha256 of the content, or git's blob sha1 (``blob <size>\\0`` + content) for files not in LFS."""

    def __init__(self, algo, size):
        self.algo = algo
        if algo == "sha256":
            self.h = hashlib.sha256()
        elif algo == "git-sha1":
            self.h = hashlib.sha1()  # nosec - git's object id, not a security check on its own
            self.h.update(b"blob %d\0" % size)
        else:
            self.h = None

    def update(self, data):
        if self.h is not None:
            self.h.update(data)

    def hexdigest(self):
        return self.h.hexdigest() if self.h is not None else None


def hash_file(path, algo, size, limit=None):
    h = Hasher(algo, size)
    done = 0
    with open(path, "rb") as f:
        while True:
            n = CHUNK if limit is None else min(CHUNK, limit - done)
            if n <= 0:
                break
            block = f.read(n)
            if not block:
                break
            h.update(block)
            done += len(block)
    return h


def file_status(local_dir, entry, markers, verify=True, full=False):
    """Local state of one listed file: dict(state, have, needs_hash).

    state: ``complete`` (right size, and verified by a valid marker or ``verify`` off), ``unverified`` (right size,
    no valid marker, or ``full``: hash it to know), ``partial`` (``have`` bytes in the incomplete file), ``missing``.
    """
    final = os.path.join(local_dir, safe_relpath(entry["path"]))
    try:
        st = os.stat(final)
    except OSError:
        st = None
    if st is not None and st.st_size == entry["size"]:
        marker = markers.get(entry["path"])
        if full and expected_digest(entry)[0] is not None:
            return {"state": "unverified", "have": 0, "verified": False}
        if marker_valid(marker, entry, st):
            return {"state": "complete", "have": entry["size"], "verified": True}
        if isinstance(marker, dict) and marker.get("oid") not in (None, entry.get("oid")):
            # checked once, but against another revision's object: only a hash can tell
            return {"state": "unverified", "have": 0, "verified": False}
        if not verify or expected_digest(entry)[0] is None:
            return {"state": "complete", "have": entry["size"], "verified": False}
        return {"state": "unverified", "have": 0, "verified": False}
    part = incomplete_path(local_dir, entry["path"])
    try:
        have = os.path.getsize(part)
    except OSError:
        have = 0
    if 0 < have <= entry["size"]:
        return {"state": "partial", "have": have, "verified": False}
    return {"state": "missing", "have": 0, "verified": False}


def plan(entries, statuses):
    """Totals for a listing and its statuses: what is left to fetch and how many bytes that is."""
    todo = [e for e in entries if statuses[e["path"]]["state"] in ("partial", "missing")]
    return {
        "files": len(entries),
        "bytes_total": sum(e["size"] for e in entries),
        "todo": todo,
        "bytes_needed": sum(e["size"] - statuses[e["path"]]["have"] for e in todo),
        "bytes_present": sum(statuses[e["path"]]["have"] for e in entries),
        "complete": not todo and all(statuses[e["path"]]["state"] == "complete" for e in entries),
    }


def existing_parent(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path):
    """Free bytes for an unprivileged writer on the filesystem that holds ``path`` (or its nearest existing parent)."""
    return shutil.disk_usage(existing_parent(path)).free


def preflight(needed, free, margin=0):
    """None when ``needed`` + ``margin`` bytes fit in ``free``, else a message naming the numbers and the fix."""
    if needed + margin <= free:
        return None
    return ("not enough disk space for the model: %d bytes still to download%s, but only %d bytes free (short by %d bytes). "
            "Free space on that filesystem or point local_dir at a larger one; nothing was downloaded." % (
                needed, " + %d bytes margin" % margin if margin else "", free, needed + margin - free))


def hub_error(repo_id, revision, endpoint, exc):
    """An operator's message for a hub error (huggingface_hub's own first line plus what it means), token-free."""
    name = type(exc).__name__
    resp = getattr(exc, "response", None)
    status = getattr(resp, "status_code", None)
    head = "%s@%s on %s: %s: %s" % (repo_id, revision, endpoint, name, str(exc).strip().split("\n", maxsplit=1)[0])
    if status in (401, 403):
        return head + " - the hub refused the token: check model_hf_token (hf_token in the vault) and that it may read %s" % repo_id
    if name == "RevisionNotFoundError":
        return head + " - revision %s does not exist in %s: pin a commit sha the hub lists" % (revision, repo_id)
    if name == "RepositoryNotFoundError":
        return head + " - repository %s not found (or not visible with this token): check model_repo_id" % repo_id
    if name in ("ConnectError", "ConnectTimeout", "ConnectionError"):
        return head + " - the hub cannot be reached: check model_hub_endpoint and the container's network"
    return head


def check_local_dir(raw):
    """None when ``raw`` is usable as the model directory, else why not (it is checked before anything is written).

    Relative paths would land under the remote user's working directory; whitespace breaks the server's command line
    (``--model-path``) and shell tools."""
    if not raw or not os.path.isabs(raw):
        return "local_dir %r is not an absolute path: give the model directory from / (for example /srv/models/NAME)" % raw
    if any(c.isspace() for c in raw):
        return "local_dir %r contains whitespace: use a path without spaces (it becomes SGLang's --model-path)" % raw
    if os.path.exists(raw) and not os.path.isdir(raw):
        return "local_dir %r exists and is not a directory" % raw
    return None


def take_secret_file(path, option, phase):
    """The bytes of ``path``, which is removed at once, read or not: the secret stays on the target only until the job
    starts (token_file, ssh_key_file)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise Failure(phase, "cannot read %s %s: %s" % (option, path, e.strerror),
                      "write it to the file just before the task (the role does this); the file is removed by the run "
                      "that reads it", [path])
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def read_token_file(path):
    """The token in ``path`` (removed at once)."""
    return take_secret_file(path, "token_file", "model_token").decode("utf-8", "replace").strip() or None


class DirLock(object):
    """One downloader per model directory: ``flock`` on ``<local_dir>/.cache/kpro-hf/download.lock``, PID inside.

    huggingface_hub's own ``WeakFileLock`` guards one file at a time; a run (listing, markers, many files) must be
    exclusive as a whole and a waiting run must be able to name the holder, hence this lock. The kernel drops it
    when the holder dies, so a lock left by a killed process never blocks."""

    def __init__(self, local_dir):
        self.path = state_path(local_dir, LOCK_FILE)
        self.fd = None

    def acquire(self, timeout, interval=1.0, clock=time.monotonic, sleep=time.sleep):
        """Seconds waited for another live downloader; Failure ``model_locked`` after ``timeout`` seconds."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        start = clock()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
            if clock() - start >= timeout:
                holder = read_holder(self.path)
                os.close(fd)
                raise Failure("model_locked", "another download into this directory is still running (PID %s) after "
                              "waiting %d s" % (holder.get("pid"), timeout),
                              "let it finish (watch its progress file) or end that process, then run again",
                              [self.path, holder])
            sleep(interval)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "since": time.time()}).encode())
        self.fd = fd
        return round(clock() - start, 3)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def read_holder(path):
    data = load_json(path, {})
    return data if isinstance(data, dict) else {}


def lock_holder(local_dir):
    """The holder's record (``{pid, since}``) when a live process holds the directory's lock, else None."""
    path = state_path(local_dir, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return read_holder(path) or {"pid": None}
    finally:
        os.close(fd)
    return None


def job_state(results_file, local_dir, now=None, start_grace=30.0):
    """What an async download job is doing, from Ansible's job file and the directory lock.

    ``finished`` (``result``: the module's result), ``running`` (a live process holds the lock: this job or one it
    waits for), ``starting`` (job file younger than ``start_grace``, the lock not taken yet) or ``gone`` (not finished
    and no process holds the lock: the downloader died without writing a result)."""
    now = time.time() if now is None else now
    data = load_json(results_file)
    if not isinstance(data, dict):
        return {"state": "gone", "why": "no job file %s" % results_file}
    if "started" not in data or data.get("finished"):
        return {"state": "finished", "result": data}
    holder = lock_holder(local_dir)
    if holder is not None:
        return {"state": "running", "holder": holder}
    try:
        age = now - os.stat(results_file).st_mtime
    except OSError:
        age = start_grace
    if age < start_grace:
        return {"state": "starting", "age_s": round(age, 1)}
    return {"state": "gone", "age_s": round(age, 1), "why": "the job is not finished and no process holds %s" % (
        state_path(local_dir, LOCK_FILE))}


def died_failure(results_file, local_dir, state, progress_file):
    """The Failure for a download job that died (OOM kill, container restart, a killed process group)."""
    prog = load_json(progress_file, {}) or {}
    evidence = [state.get("why", ""), "job file %s: %s" % (results_file, json.dumps(load_json(results_file)))]
    if prog:
        evidence.append("last progress: %s of %s bytes, %s, written by PID %s at %s" % (
            prog.get("bytes_done"), prog.get("bytes_total"), prog.get("state"), prog.get("pid"),
            time.strftime("%H:%M:%S", time.localtime(prog.get("updated") or 0))))
    return Failure("download_died", "the background download into %s ended without a result." % local_dir,
                   "run the play again: it resumes from the partial files. Look for why it died in the container "
                   "(dmesg for the OOM killer, journalctl) if it happens again", evidence)


def human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return "%.1f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0
    return "%d B" % n  # pragma: no cover


def progress_line(prog):
    """One line of a running download for the playbook's output: bytes, percent, rate, files, ETA."""
    if not prog or not prog.get("bytes_total"):
        return "starting"
    eta = prog.get("eta_s")
    return "%s of %s (%.1f%%), %s/s, %d of %d files%s" % (
        human(prog.get("bytes_done") or 0), human(prog["bytes_total"]), prog.get("percent") or 0.0, human(prog.get("rate_bps") or 0),
        prog.get("files_done") or 0, prog.get("files_total") or 0, (", about %d s left" % eta) if eta is not None else "")


def scrub(text, *secrets):
    """``text`` without the secrets (the token; the ssh key: a list of its whole text and its lines)."""
    if text is None:
        return text
    flat = [s for x in secrets for s in (x if isinstance(x, (list, tuple)) else [x]) if s]
    for secret in sorted(flat, key=len, reverse=True):
        text = str(text).replace(secret, "********")
    return text


# ---------------------------------------------------------------------------------------------------------
# progress file
# ---------------------------------------------------------------------------------------------------------
class Progress(object):
    """Thread-safe counters written to a JSON file about once a second (an Ansible module cannot stream output)."""

    def __init__(self, path, repo_id, commit, files_total, bytes_total, bytes_present, interval=1.0):
        self.path = path
        self.lock = threading.Lock()
        self.interval = interval
        self.started = time.time()
        self.data = {"state": "downloading", "repo_id": repo_id, "revision": commit, "files_total": files_total,
                     "files_done": 0, "bytes_total": bytes_total, "bytes_done": bytes_present, "bytes_downloaded": 0,
                     "current": {}, "failed": [], "pid": os.getpid(), "started": self.started}
        self._last = 0.0
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self.write(force=True)
        self._thread = threading.Thread(target=self._run, name="kpro-hf-progress")
        self._thread.daemon = True
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.interval):
            self.write(force=True)

    def file_start(self, path, have, size):
        with self.lock:
            self.data["current"][path] = [have, size]

    def add(self, path, n):
        with self.lock:
            cur = self.data["current"].get(path)
            if cur is not None:
                cur[0] += n
            self.data["bytes_done"] += n
            self.data["bytes_downloaded"] += n

    def restart_file(self, path, lost=None):
        """``lost`` bytes of ``path`` are to be fetched again (None: all counted so far)."""
        with self.lock:
            cur = self.data["current"].get(path)
            if lost is None:
                lost = cur[0] if cur is not None else 0
            if cur is not None:
                cur[0] -= lost
            self.data["bytes_done"] -= lost

    def file_done(self, path, ok=True, error=None):
        with self.lock:
            self.data["current"].pop(path, None)
            if ok:
                self.data["files_done"] += 1
            else:
                self.data["failed"].append({"path": path, "error": error})

    def snapshot(self):
        with self.lock:
            d = json.loads(json.dumps(self.data))
        now = time.time()
        d["updated"] = now
        elapsed = max(now - self.started, 1e-6)
        d["rate_bps"] = int(d["bytes_downloaded"] / elapsed)
        left = d["bytes_total"] - d["bytes_done"]
        d["eta_s"] = int(left / d["rate_bps"]) if d["rate_bps"] > 0 and d["state"] == "downloading" else None
        d["percent"] = round(100.0 * d["bytes_done"] / d["bytes_total"], 1) if d["bytes_total"] else 100.0
        return d

    def write(self, force=False):
        now = time.time()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        with contextlib.suppress(OSError):
            save_json(self.path, self.snapshot())

    def finish(self, state):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self.lock:
            self.data["state"] = state
        self.write(force=True)


# ---------------------------------------------------------------------------------------------------------
# network (huggingface_hub)
# ---------------------------------------------------------------------------------------------------------
def _origin(url):
    u = urlsplit(url)
    return (u.scheme, u.hostname, u.port or (443 if u.scheme == "https" else 80))


class HubClient(object):
    def __init__(self, endpoint, token=None, timeout=30.0):
        if not HAS_HF:
            raise HfError("huggingface_hub is not importable: %s" % HF_IMPORT_ERROR)
        self.endpoint = endpoint.rstrip("/")
        self.token = token or None
        self.timeout = timeout
        self.api = HfApi(endpoint=self.endpoint, token=self.token, library_name=LIBRARY_NAME)

    def resolve(self, repo_id, revision):
        """The commit sha a revision (sha, branch or tag) points to."""
        info = self.api.model_info(repo_id, revision=revision, timeout=self.timeout, token=self.token)
        if not info.sha:
            raise HfError("the hub did not report a commit for %s@%s" % (repo_id, revision))
        return info.sha

    def listing(self, repo_id, commit):
        items = self.api.list_repo_tree(repo_id, revision=commit, recursive=True, token=self.token)
        out = []
        for item in items:
            e = entry_from_tree_item(item)
            if e is not None:
                safe_relpath(e["path"])
                out.append(e)
        return sorted(out, key=lambda e: e["path"])

    def headers(self):
        h = build_hf_headers(token=self.token, library_name=LIBRARY_NAME)
        h["Accept-Encoding"] = "identity"  # the bytes as stored: sizes and checksums must match
        return h

    def file_location(self, repo_id, commit, entry):
        """HEAD /resolve: (url to GET, whether to send the token there); checks commit, size and etag."""
        url = hf_hub_url(repo_id, entry["path"], revision=commit, endpoint=self.endpoint)
        meta = get_hf_file_metadata(url, token=self.token, timeout=self.timeout)
        if meta.commit_hash and meta.commit_hash != commit:
            raise HfError("%s: the hub served commit %s, expected %s" % (entry["path"], meta.commit_hash, commit))
        if meta.size is not None and meta.size != entry["size"]:
            raise HfError("%s: the hub says %d bytes, the listing said %d" % (entry["path"], meta.size, entry["size"]))
        etag = (meta.etag or "").strip('"')
        if entry.get("sha256") and len(etag) == 64 and etag != entry["sha256"]:
            raise HfError("%s: the hub's etag %s differs from the listing's sha256 %s" % (entry["path"], etag, entry["sha256"]))
        location = meta.location or url
        return location, _origin(location) == _origin(url)

    @contextlib.contextmanager
    def stream(self, url, headers):
        """GET ``url``: yields (status, headers, iterator of bytes) with huggingface_hub's session (httpx2 or requests)."""
        session = get_session()
        if hasattr(session, "stream"):  # httpx / httpx2 (huggingface_hub >= 1.0)
            with session.stream("GET", url, headers=headers, timeout=self.timeout, follow_redirects=True) as r:
                yield r.status_code, r.headers, r.iter_bytes()
        else:  # requests (huggingface_hub < 1.0)
            r = session.get(url, headers=headers, timeout=self.timeout, stream=True, allow_redirects=True)
            try:
                yield r.status_code, r.headers, r.iter_content(CHUNK)
            finally:
                r.close()


def download_one(sources, local_dir, commit, entry, progress, verify=True, retries=3, backoff=1.0):
    """Fetch (or finish) one file from the first source that has it, verify it, move it into place.

    Sources only deliver bytes (model_sources.py); the size and the hash come from the listing (the Hub's or the
    manifest) and are checked here, one place for all sources. A mismatch removes the partial file and the next source
    starts from byte 0; a transport error keeps it and the next source continues from its end (the whole file's hash
    still decides). The last source's error is the file's. Returns ``{marker, source, bytes: {label: n}, fallbacks}``."""
    final = os.path.join(local_dir, safe_relpath(entry["path"]))
    part = incomplete_path(local_dir, entry["path"])
    for d in (os.path.dirname(final), os.path.dirname(part)):
        os.makedirs(d, exist_ok=True)
    algo, digest = expected_digest(entry) if verify else (None, None)
    usable = [s for s in sources if s.has(entry)]
    if not usable:
        raise HfError("%s: no source has it with the listed %d bytes (%s)" % (
            entry["path"], entry["size"], ", ".join(s.label for s in sources)))
    out = {"marker": None, "source": None, "bytes": {}, "fallbacks": []}
    progress.file_start(entry["path"], _part_size(part, entry["size"]), entry["size"])
    for i, src in enumerate(usable):
        try:
            hasher = _fill(src, part, entry, algo, progress, retries, backoff, out["bytes"])
            out["marker"] = _publish(local_dir, entry, commit, part, final, hasher if algo is not None else None, digest)
            out["source"] = src.label
            return out
        except HfError as e:
            e.partial = out  # what moved before the failure: the run's totals count it
            if isinstance(e, HfFatal):
                raise
            if isinstance(e, HfMismatch):
                with contextlib.suppress(OSError):
                    os.unlink(part)
                progress.restart_file(entry["path"])
            if i + 1 == len(usable):
                raise
            out["fallbacks"].append({"path": entry["path"], "from": src.label, "to": usable[i + 1].label,
                                     "reason": "mismatch" if isinstance(e, HfMismatch) else "transport", "error": str(e)})
    return out  # pragma: no cover - the loop returns or raises


def _part_size(part, size):
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if have > size:
        os.unlink(part)
        have = 0
    return have


def _fill(src, part, entry, algo, progress, retries, backoff, tally):
    """Append ``src``'s bytes to the partial file up to the listed size (resuming, retrying a stall); its hasher."""
    path, size = entry["path"], entry["size"]
    have = _part_size(part, size)
    hasher = hash_file(part, algo, size) if have else Hasher(algo, size)
    attempt = 0
    with open(part, "ab") as f:
        while have < size:
            got = 0
            try:
                with src.open(entry, have) as (start, body):
                    if start != have:  # the source cannot resume (HTTP 200 to a Range request): start over
                        f.truncate(0)
                        progress.restart_file(path, have)
                        have, hasher = 0, Hasher(algo, size)
                    for chunk in body:
                        if have + len(chunk) > size:
                            raise HfMismatch("%s: %s sent more than the %d bytes listed" % (path, src.label, size))
                        f.write(chunk)
                        hasher.update(chunk)
                        have += len(chunk)
                        got += len(chunk)
                        progress.add(path, len(chunk))
                        tally[src.label] = tally.get(src.label, 0) + len(chunk)
                    f.flush()
                if have < size:
                    raise HfError("%s: %s ended at %d of %d bytes" % (path, src.label, have, size))
            except Exception as e:  # pylint: disable=broad-except
                with contextlib.suppress(OSError):
                    f.flush()
                if isinstance(e, (HfFatal, HfMismatch)):
                    raise
                if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                    raise HfFatal("%s: cannot write %s: %s" % (path, part, e))
                if got:
                    attempt = 0  # progress was made: the retry budget is per stall, as huggingface_hub does
                attempt += 1
                if attempt > retries:
                    if isinstance(e, HfError):
                        raise
                    raise HfError("%s: %s: %s: %s (stopped at %d of %d bytes; a re-run resumes from there)" % (
                        path, src.label, type(e).__name__, e, have, size))
                time.sleep(backoff * attempt)
    return hasher


def _publish(local_dir, entry, commit, part, final, hasher, digest):
    """Rename the partial file into place only when its size on disk and its hash match; the marker (or None)."""
    size = entry["size"]
    algo = hasher.algo if hasher is not None else None
    on_disk = os.path.getsize(part)
    if on_disk != size:  # another writer (only without the directory lock) or a changed file: never publish it
        os.unlink(part)
        raise HfMismatch("%s: the partial file holds %d bytes, expected %d; it was removed, re-run to fetch it again" % (
            entry["path"], on_disk, size))
    if algo is not None:
        got_digest = hasher.hexdigest()
        if got_digest != digest:
            os.unlink(part)
            raise HfMismatch("%s: %s mismatch after download (expected %s, got %s); the partial file was removed, "
                             "re-run to fetch it again" % (entry["path"], algo, digest, got_digest))
    with _hf_file_lock(local_dir, entry["path"]):
        os.replace(part, final)
    st = os.stat(final)
    if st.st_size != size:  # pragma: no cover - guarded by the loop above
        raise HfError("%s: %d bytes on disk, expected %d" % (entry["path"], st.st_size, size))
    _write_hf_metadata(local_dir, entry, commit)
    return make_marker(entry, st) if algo is not None else None


def _hf_file_lock(local_dir, path):
    """huggingface_hub's per-file lock (``.cache/huggingface/download/<path>.lock``): ``hf download --local-dir``
    into the same directory waits for the rename instead of replacing the file under it."""
    try:
        from huggingface_hub._local_folder import get_local_download_paths
        from huggingface_hub.utils import WeakFileLock
        from pathlib import Path
        return WeakFileLock(get_local_download_paths(Path(local_dir), path).lock_path, timeout=60)
    except Exception:  # pylint: disable=broad-except
        return contextlib.nullcontext()


def _write_hf_metadata(local_dir, entry, commit):
    """Best effort: huggingface_hub's own local_dir metadata, so `hf download --local-dir` sees the file as current."""
    try:
        from huggingface_hub._local_folder import write_download_metadata
        from pathlib import Path
        write_download_metadata(Path(local_dir), entry["path"], commit, entry.get("sha256") or entry.get("oid") or "")
    except Exception:  # pylint: disable=broad-except
        pass
