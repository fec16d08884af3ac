#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model
short_description: Download a pinned revision of a Hugging Face model into a directory, resumably and verified
version_added: "0.1.0"
description:
  - Makes O(local_dir) hold the files of O(repo_id) at O(revision) (optionally filtered by O(allow_patterns) and
    O(ignore_patterns)), as listed by the hub's tree API.
  - "Completeness is decided first: every listed file present with the listed size and, when O(verify=true),
    a matching checksum (the sha256 of LFS files, the git blob sha1 of the others). A checksum is computed once and
    remembered with the file's size, mtime and hub object id under C(<local_dir>/.cache/kpro-hf/), so a complete
    model is not hashed again on every run. When O(revision) is a commit sha whose listing is cached there, a
    complete model is recognised without any network request; the result is C(changed=false) and no file bytes
    are transferred."
  - "Before any download the bytes still missing (files absent, minus what partial files already hold) plus
    O(min_free_bytes_margin) are compared with the free space of O(local_dir)'s filesystem; when they do not fit
    the module fails with both numbers and downloads nothing."
  - "Files are fetched in parallel (O(max_workers)). Each one is written to
    C(<local_dir>/.cache/kpro-hf/incomplete/<path>.incomplete); an interrupted run (network cut, killed process,
    Ansible timeout) leaves it there and the next run continues it with an HTTP C(Range) request, so completed
    bytes are never fetched twice. (huggingface_hub's own download deletes its per-process temporary file on
    failure and cannot resume across processes, so the transfer loop is done here, with huggingface_hub's
    C(hf_hub_url), C(get_hf_file_metadata) and HTTP session.)"
  - "Progress is written about once a second to O(progress_file) (JSON: bytes done/total, percent, rate, ETA,
    files in flight), so an operator can watch a long download that runs under C(async)."
  - "A branch or tag in O(revision) is resolved to its commit, reported in RV(resolved_revision), and warned about:
    pin the commit sha so that every host gets the same bytes."
  - Needs the Python library C(huggingface_hub) on the target when the hub must be contacted (the SGLang venv has
    it; set C(ansible_python_interpreter) to that venv's python).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
requirements:
  - huggingface_hub (any version with C(HfApi.list_repo_tree); 0.2x and 1.x/2.x are supported)
options:
  repo_id:
    description: The model repository, for example C(Qwen/Qwen3.6-27B).
    type: str
    required: true
  revision:
    description:
      - A 40-hex commit sha (pinned; recommended), or a branch or tag that is resolved to its current commit
        (reported in RV(resolved_revision), with a warning).
    type: str
    required: true
  local_dir:
    description:
      - The model directory (what SGLang's C(--model-path) points to). Created when missing.
      - State (listing cache, checksum markers, partial files, the default progress file) is kept under
        C(<local_dir>/.cache/).
    type: path
    required: true
  endpoint:
    description:
      - The hub's base URL. Defaults to the C(HF_ENDPOINT) environment variable of the target, else
        U(https://huggingface.co). The lab's hub is C(http://10.213.5.1:18602).
    type: str
  token:
    description:
      - A Hugging Face access token (keep it in Ansible Vault). Sent only to the hub, never to the CDN the hub
        redirects LFS downloads to, and never printed.
      - Defaults to the C(HF_TOKEN) environment variable of the target; without either, huggingface_hub's own
        stored token (if any) is used.
      - "With C(async) do not use it: Ansible writes a background module's arguments to a file on the target that
        stays there for the whole run. Use O(token_file)."
    type: str
  token_file:
    description:
      - A file on the target holding the token; the module reads it and removes it as it starts, so with C(async)
        the token is on the target's disk only until the job starts (the role writes it to C(/run), a tmpfs, through
        a module's standard input, so it is in no command line). Mutually exclusive with O(token).
    type: path
  allow_patterns:
    description: Only files matching one of these glob patterns (fnmatch on the repository path; C(dir/) means everything below).
    type: list
    elements: str
  ignore_patterns:
    description: Leave out files matching one of these glob patterns.
    type: list
    elements: str
  max_workers:
    description: How many files are downloaded at the same time.
    type: int
    default: 8
  min_free_bytes_margin:
    description: Bytes that must remain free on O(local_dir)'s filesystem after the download (the preflight adds them).
    type: int
    default: 0
  verify:
    description:
      - Check checksums (sha256 of LFS files, git blob sha1 of the others, both as listed by the hub). Sizes are always checked.
      - With V(false) a present file of the right size counts as complete.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for the hub (connect and each read).
    type: float
    default: 30
  retries:
    description:
      - How often a stalled transfer of one file is retried (resuming from the last byte received) before the
        module gives up on that file. Any byte received resets the count.
    type: int
    default: 3
  progress_file:
    description: Where the progress JSON is written. Default C(<local_dir>/.cache/kpro-progress.json).
    type: path
  verify_full:
    description:
      - "Hash every file again, ignoring the checksums remembered from earlier runs (implies O(verify)). Slow: it reads
        the whole model. The remembered checksums are already void for a file whose size, inode, mtime or ctime
        changed (a write in place changes ctime, which C(touch) cannot set back)."
    type: bool
    default: false
  lock_timeout:
    description:
      - "One download per O(local_dir): a run takes C(<local_dir>/.cache/kpro-hf/download.lock) (C(flock), the holder's
        PID in it) before it looks at any file, and waits while another live process holds it (an earlier run whose
        controller was killed goes on in the background). Seconds to wait before failing with phase C(model_locked)."
      - The lock is dropped by the kernel when its holder dies. C(flock) must work on the filesystem (local disks do;
        some network filesystems silently grant it to everyone).
    type: int
    default: 14400
  job:
    description:
      - "Watch mode. The C(results_file) of an C(async) run of this module (C(poll=0)); nothing is downloaded. Returns
        the job's result once it finished (and removes the job file), else C(finished=false) while a live process holds
        the directory lock, and fails with phase C(download_died) when the job is not finished and no process holds
        the lock (after a 30 s start grace): a download killed with its wrapper (OOM killer, container restart) is
        noticed at the next poll instead of at the C(async) timeout."
    type: path
attributes:
  check_mode:
    support: full
    description: Reports what would be downloaded (and runs the disk preflight) without writing anything.
  diff_mode:
    support: none
    description: The module downloads files; it does not report diffs.
notes:
  - "Run long downloads with C(async) and C(poll) (see EXAMPLES): a 55 GB model takes longer than an SSH
    connection or a default task timeout may last. If the task is interrupted, run it again: it resumes."
  - "Files in O(local_dir) that are not in the listing are left alone."
  - "O(local_dir) must be absolute and without whitespace; anything else is refused (phase C(model_input)) before
    anything is written."
"""

EXAMPLES = r"""
- name: Download Qwen3.6-27B at a pinned commit into the model directory
  kpro.gpu_serving.hf_model:
    repo_id: Qwen/Qwen3.6-27B
    revision: 6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5
    local_dir: /srv/models/Qwen3.6-27B
    token: "{{ vault_hf_token }}"
    ignore_patterns: ["*.md", ".gitattributes"]
  vars:
    ansible_python_interpreter: /opt/sglang/venv/bin/python

# A long download: run it in the background, poll every 30 s for up to 4 h.
# Watch it from another shell with: watch cat /srv/models/Qwen3.6-27B/.cache/kpro-progress.json
- name: Download the model (async)
  kpro.gpu_serving.hf_model:
    repo_id: Qwen/Qwen3.6-27B
    revision: 6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5
    local_dir: /srv/models/Qwen3.6-27B
    token: "{{ vault_hf_token }}"
    max_workers: 8
    min_free_bytes_margin: "{{ 10 * 1024 ** 3 }}"
  async: 14400
  poll: 30
  register: model

- name: Against the lab's hub, resolving a branch (warns; pin the reported sha afterwards)
  kpro.gpu_serving.hf_model:
    repo_id: Qwen/Qwen3.6-27B
    revision: main
    local_dir: /srv/models/Qwen3.6-27B
    endpoint: http://10.213.5.1:18602
  register: model
- ansible.builtin.debug:
    msg: "pin revision: {{ model.resolved_revision }}"
"""

RETURN = r"""
extends_documentation_fragment:
  - kpro.gpu_serving.failure
resolved_revision:
  description: The commit sha the files come from.
  returned: always
  type: str
  sample: 6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5
pinned:
  description: Whether O(revision) was a commit sha.
  returned: always
  type: bool
path:
  description: The model directory.
  returned: always
  type: str
  sample: /srv/models/Qwen3.6-27B
files:
  description: Number of files selected from the listing.
  returned: always
  type: int
  sample: 24
bytes_total:
  description: Total size of the selected files, as listed by the hub.
  returned: always
  type: int
bytes_needed:
  description: Bytes that were (or in check mode would be) still to download before this run.
  returned: always
  type: int
bytes_downloaded:
  description: Bytes received from the hub by this run (0 when the model was complete).
  returned: always
  type: int
free_bytes:
  description: Free bytes on O(local_dir)'s filesystem before the download (only when something was to download).
  returned: when something was to download
  type: int
verified:
  description: Number of selected files whose checksum is verified (now or by a still valid earlier check).
  returned: always
  type: int
files_complete:
  description: Number of selected files that were already complete before this run.
  returned: always
  type: int
downloaded:
  description: Repository paths downloaded (or, in check mode, to download) by this run; resumed files included.
  returned: always
  type: list
  elements: str
resumed:
  description: Repository paths whose download continued a partial file of an earlier run.
  returned: always
  type: list
  elements: str
offline:
  description: True when completeness was decided from the cached listing without contacting the hub.
  returned: always
  type: bool
progress_file:
  description: The progress JSON file.
  returned: always
  type: str
"""

import contextlib
import os
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

from ansible_collections.kpro.gpu_serving.plugins.module_utils import hf
from ansible_collections.kpro.gpu_serving.plugins.module_utils.failure import Failure, fail as failure_fail


def _check_local(local_dir, entries, markers, verify, result, full=False):
    """Statuses of all entries; hashes the unverified ones locally (no network) and updates markers."""
    statuses = {}
    for e in entries:
        st = hf.file_status(local_dir, e, markers, verify=verify, full=full)
        if st["state"] == "unverified":
            final = os.path.join(local_dir, hf.safe_relpath(e["path"]))
            algo, digest = hf.expected_digest(e)
            if hf.hash_file(final, algo, e["size"]).hexdigest() == digest:
                markers[e["path"]] = hf.make_marker(e, os.stat(final))
                result["_markers_changed"] = True
                st = {"state": "complete", "have": e["size"], "verified": True}
            else:
                result["_mismatch"].append(e["path"])
                part = hf.incomplete_path(local_dir, e["path"])
                have = os.path.getsize(part) if os.path.exists(part) else 0
                st = {"state": "partial" if 0 < have <= e["size"] else "missing", "have": have if have <= e["size"] else 0,
                      "verified": False}
        statuses[e["path"]] = st
    return statuses


def _remote_listing(module, client, repo_id, revision, commit, local_dir):
    """(commit, full listing): resolves a branch/tag (with a warning) and caches the listing of the commit."""
    if commit is None:
        commit = client.resolve(repo_id, revision)
        module.warn("revision %r is not a commit sha; it resolved to %s. Pin revision: %s so that every host "
                    "gets the same bytes." % (revision, commit, commit))
    listing = hf.load_tree_cache(local_dir, repo_id, commit)
    if listing is None:
        listing = client.listing(repo_id, commit)
        if not module.check_mode:
            hf.save_tree_cache(local_dir, repo_id, commit, listing)
    return commit, listing


def _watch(module, p, local_dir, progress_file):
    """Watch mode (O(job)): the async job's result when it finished, else whether it is still alive."""
    state = hf.job_state(p["job"], local_dir)
    for _i in range(5):  # between releasing the lock and writing its result a job looks gone: look again
        if state["state"] != "gone":
            break
        time.sleep(1)
        state = hf.job_state(p["job"], local_dir)
    if state["state"] == "gone":
        raise hf.died_failure(p["job"], local_dir, state, progress_file)
    if state["state"] != "finished":
        prog = hf.load_json(progress_file, {}) or {}
        module.exit_json(changed=False, finished=False, job_state=state["state"], holder=state.get("holder"),
                         bytes_done=prog.get("bytes_done"), bytes_total=prog.get("bytes_total"), path=local_dir)
    res = dict(state["result"], finished=True)
    for k in ("ansible_job_id", "results_file", "started", "invocation", "_ansible_no_log", "deprecations"):
        res.pop(k, None)
    for w in res.pop("warnings", None) or []:  # the job's warnings, serialized: warn them again
        module.warn(w.get("event", {}).get("msg", str(w)) if isinstance(w, dict) else str(w))
    with contextlib.suppress(OSError):
        os.unlink(p["job"])
    if res.get("failed"):
        module.fail_json(**res)
    module.exit_json(**res)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            local_dir=dict(type="path", required=True),
            endpoint=dict(type="str", fallback=(env_fallback, ["HF_ENDPOINT"])),
            token=dict(type="str", no_log=True, fallback=(env_fallback, ["HF_TOKEN"])),
            token_file=dict(type="path"),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            max_workers=dict(type="int", default=8),
            min_free_bytes_margin=dict(type="int", default=0),
            verify=dict(type="bool", default=True),
            verify_full=dict(type="bool", default=False),
            timeout=dict(type="float", default=30),
            retries=dict(type="int", default=3),
            progress_file=dict(type="path"),
            lock_timeout=dict(type="int", default=14400),
            job=dict(type="path"),
        ),
        mutually_exclusive=[("token", "token_file")],
        supports_check_mode=True,
    )
    p = module.params
    try:  # first: the token file must not outlive this process, whatever fails next
        token = hf.read_token_file(p["token_file"]) if p["token_file"] and not p["job"] else (p["token"] or None)
    except Failure as f:
        failure_fail(module, f, path=p["local_dir"])
    bad = hf.check_local_dir(p["local_dir"]) or ("max_workers must be at least 1" if p["max_workers"] < 1 else None)
    if bad:
        failure_fail(module, Failure("model_input", bad), path=p["local_dir"])
    local_dir = os.path.normpath(p["local_dir"])
    progress_file = p["progress_file"] or os.path.join(local_dir, hf.PROGRESS_FILE)
    lock = None
    try:
        if p["job"]:
            return _watch(module, p, local_dir, progress_file)
        if not module.check_mode:
            lock = hf.DirLock(local_dir)
            waited = lock.acquire(p["lock_timeout"])
            if waited >= 1:
                module.warn("waited %d s for another download into %s to end" % (waited, local_dir))
        _run(module, p, token, local_dir, progress_file)
    except Failure as f:
        failure_fail(module, f, path=local_dir)
    finally:
        if lock is not None:
            lock.release()
    return None


def _run(module, p, token, local_dir, progress_file):
    endpoint = (p["endpoint"] or "https://huggingface.co").rstrip("/")
    repo_id, revision = p["repo_id"], p["revision"]
    pinned = hf.is_commit(revision)
    verify = p["verify"] or p["verify_full"]

    def fail(msg, phase="model_unavailable", **kw):
        kw.setdefault("resolved_revision", result.get("resolved_revision"))
        kw.setdefault("path", local_dir)
        if kw.get("exception") is None:
            kw.pop("exception", None)
        raise Failure(phase, hf.scrub(msg, token), **dict((k, v) for k, v in kw.items() if not k.startswith("_")))

    result = {"changed": False, "pinned": pinned, "path": local_dir, "resolved_revision": revision if pinned else None,
              "bytes_downloaded": 0, "downloaded": [], "resumed": [], "offline": False, "progress_file": progress_file,
              "_mismatch": [], "_markers_changed": False}
    markers = hf.load_markers(local_dir)
    commit = revision if pinned else None
    client = None
    entries, statuses = _offline(local_dir, repo_id, commit, p, markers, verify, result) if pinned else (None, None)
    if entries is None:
        if not hf.HAS_HF:
            fail(missing_required_lib("huggingface_hub") + " (the target's python must have it: point "
                 "ansible_python_interpreter at the SGLang venv's python)", phase="library_missing", exception=str(hf.HF_IMPORT_ERROR))
        error = None
        try:
            client = hf.HubClient(endpoint, token=token, timeout=p["timeout"])
            commit, entries = _remote_listing(module, client, repo_id, revision, commit, local_dir)
        except hf.HfError as e:
            error = (str(e), None)
        except Exception as e:  # pylint: disable=broad-except
            error = (hf.hub_error(repo_id, revision, endpoint, e), traceback.format_exc())
        if error:
            fail(error[0], exception=hf.scrub(error[1], token))
        entries = hf.select_entries(entries, p["allow_patterns"], p["ignore_patterns"])
        if not entries:
            fail("no file of %s@%s matches allow_patterns %s / ignore_patterns %s" % (
                repo_id, commit, p["allow_patterns"], p["ignore_patterns"]), phase="model_input", resolved_revision=commit)
        result["_mismatch"] = []
        statuses = _check_local(local_dir, entries, markers, verify, result, full=p["verify_full"])
    result["resolved_revision"] = commit
    _apply(module, p, client, repo_id, commit, local_dir, entries, statuses, markers, progress_file, result, fail)


def _offline(local_dir, repo_id, commit, p, markers, verify, result):
    """(entries, statuses) when the cached listing of a pinned commit shows a complete model, else (None, None)."""
    cached = hf.load_tree_cache(local_dir, repo_id, commit)
    if cached is None:
        return None, None
    sel = hf.select_entries(cached, p["allow_patterns"], p["ignore_patterns"])
    if not sel:  # patterns that select nothing are an error, not an empty complete model
        return None, None
    statuses = _check_local(local_dir, sel, markers, verify, result, full=p["verify_full"])
    if not hf.plan(sel, statuses)["complete"]:
        return None, None
    result["offline"] = True
    return sel, statuses


def _apply(module, p, client, repo_id, commit, local_dir, entries, statuses, markers, progress_file, result, fail):
    pl = hf.plan(entries, statuses)
    result.update(files=pl["files"], bytes_total=pl["bytes_total"], bytes_needed=pl["bytes_needed"],
                  files_complete=pl["files"] - len(pl["todo"]))
    if result["_mismatch"]:
        module.warn("checksum mismatch, downloading again: %s" % ", ".join(sorted(result["_mismatch"])))
    if pl["todo"]:
        free = hf.free_bytes(local_dir)
        result["free_bytes"] = free
        msg = hf.preflight(pl["bytes_needed"], free, p["min_free_bytes_margin"])
        if msg:
            fail(msg, phase="model_no_space", needed_bytes=pl["bytes_needed"], free_bytes=free, margin_bytes=p["min_free_bytes_margin"],
                 files=pl["files"], bytes_total=pl["bytes_total"], downloaded=[])
        _access_check(client, repo_id, commit, pl["todo"][0], fail)
        result["changed"] = True
        result["downloaded"] = [e["path"] for e in pl["todo"]]
        result["resumed"] = [e["path"] for e in pl["todo"] if statuses[e["path"]]["state"] == "partial"]
        if not module.check_mode:
            _download(module, client, repo_id, commit, local_dir, pl, statuses, markers, progress_file, result, fail)
    if result["_markers_changed"] and not module.check_mode:
        hf.save_markers(local_dir, markers)
    result["verified"] = _count_verified(local_dir, entries, markers)
    module.exit_json(**dict((k, v) for k, v in result.items() if not k.startswith("_")))


def _access_check(client, repo_id, commit, entry, fail):
    """HEAD of one file to fetch: a refused token fails here, in the check-mode probe, before anything is written."""
    if client is None:
        return
    try:
        client.file_location(repo_id, commit, entry)
    except Exception as e:  # pylint: disable=broad-except
        fail(hf.hub_error(repo_id, commit, client.endpoint, e), downloaded=[])


def _count_verified(local_dir, entries, markers):
    n = 0
    for e in entries:
        try:
            st = os.stat(os.path.join(local_dir, hf.safe_relpath(e["path"])))
        except OSError:
            continue
        if hf.marker_valid(markers.get(e["path"]), e, st):
            n += 1
    return n


def _download(module, client, repo_id, commit, local_dir, pl, statuses, markers, progress_file, result, fail):
    todo = sorted(pl["todo"], key=lambda e: -(e["size"] - statuses[e["path"]]["have"]))
    progress = hf.Progress(progress_file, repo_id, commit, pl["files"], pl["bytes_total"], pl["bytes_present"])
    progress.start()
    errors = {}
    started = time.time()

    def one(entry):
        try:
            marker = hf.download_one(client, repo_id, commit, local_dir, entry, progress, verify=module.params["verify"],
                                     retries=module.params["retries"])
            progress.file_done(entry["path"])
            return entry["path"], marker, None
        except Exception as e:  # pylint: disable=broad-except
            msg = hf.scrub(str(e) if isinstance(e, hf.HfError) else "%s: %s: %s" % (entry["path"], type(e).__name__, e),
                           client.token)
            progress.file_done(entry["path"], ok=False, error=msg)
            return entry["path"], None, msg

    with ThreadPoolExecutor(max_workers=module.params["max_workers"]) as pool:
        for path, marker, err in pool.map(one, todo):
            if err:
                errors[path] = err
            elif marker:
                markers[path] = marker
                result["_markers_changed"] = True
                hf.save_markers(local_dir, markers)  # a probe during the download need not hash this file again
    hf.save_markers(local_dir, markers)
    snap = progress.snapshot()
    result["bytes_downloaded"] = snap["bytes_downloaded"]
    result["elapsed_s"] = round(time.time() - started, 3)
    if errors:
        progress.finish("failed")
        fail("%d of %d files failed to download; the bytes already received are kept and a re-run resumes them: %s" % (
            len(errors), len(todo), "; ".join(errors[k] for k in sorted(errors))), phase="download_failed",
            errors=errors, bytes_downloaded=snap["bytes_downloaded"], bytes_total=pl["bytes_total"],
            files=pl["files"], downloaded=sorted(set(result["downloaded"]) - set(errors)))
    progress.finish("done")


if __name__ == "__main__":
    main()
