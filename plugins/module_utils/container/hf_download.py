# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps of kpro.gpu_serving.hf_model: the listing (offline from the cache for a pinned commit, else from the
hub), the local check, the space preflight, the access probe, the parallel download with progress, and the watch
of a background job. hf.py holds the hub client and the file state; a known failure is raised as Failure.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import model_sources as ms
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import model_revisions as mr
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure


def _check_local(local_dir, entries, markers, verify, result, full=False):
    """Statuses of all entries; hashes the unverified ones locally (no network) and updates markers."""
    statuses = {}
    for e in entries:
        if e["path"] in result.get("_assume", ()):  # check mode: a kept file the real run links back
            statuses[e["path"]] = {"state": "complete", "have": e["size"], "verified": True}
            continue
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


def watch(module, p, local_dir, progress_file):
    """Watch mode (O(job)): the async job's result when it finished (its failure raised again), else whether it is still
    alive."""
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
        # progress: shown on each retry of the wait at default verbosity (the callback kpro.gpu_serving.progress)
        return dict(changed=False, finished=False, job_state=state["state"], holder=state.get("holder"),
                    bytes_done=prog.get("bytes_done"), bytes_total=prog.get("bytes_total"), path=local_dir,
                    progress=hf.progress_line(prog))
    res = dict(state["result"], finished=True)
    for k in ("ansible_job_id", "results_file", "started", "invocation", "_ansible_no_log", "deprecations"):
        res.pop(k, None)
    for w in res.pop("warnings", None) or []:  # the job's warnings, serialized: warn them again
        module.warn(w.get("event", {}).get("msg", str(w)) if isinstance(w, dict) else str(w))
    with contextlib.suppress(OSError):
        os.unlink(p["job"])
    if res.get("failed"):
        # the job's own failure, read back as data (its known_failure); one without (an unexpected error) as it said it
        details = dict((k, v) for k, v in res.items() if k not in ("phase", "msg", "evidence", "remedy", "known_failure", "failed"))
        raise Failure.from_result(dict(res, phase=res.get("phase") or "download_failed"), **details)
    return res


def lock(module, local_dir, timeout):
    """The directory lock of a download run (None in check mode, which writes nothing), with a warning after a wait."""
    if module.check_mode:
        return None
    held = hf.DirLock(local_dir)
    waited = held.acquire(timeout)
    if waited >= 1:
        module.warn("waited %d s for another download into %s to end" % (waited, local_dir))
    return held


def run(module, p, token, local_dir, progress_file, identity=None):
    """One download run (not O(job)): the listing (the manifest, or the hub's, cached for a pinned commit), the local
    check, the download from the sources; returns the module's result."""
    endpoint = (p["endpoint"] or "https://huggingface.co").rstrip("/")
    repo_id, revision = p["repo_id"], p["revision"]
    pinned = hf.is_commit(revision)
    verify = p["verify"] or p["verify_full"]

    def fail(msg, phase="model_unavailable", **kw):
        kw.setdefault("resolved_revision", result.get("resolved_revision"))
        kw.setdefault("path", local_dir)
        if kw.get("exception") is None:
            kw.pop("exception", None)
        raise Failure(phase, hf.scrub(msg, *secrets), **dict((k, v) for k, v in kw.items() if not k.startswith("_")))

    secrets = [token] + (identity.secrets if identity else [])
    result = {"changed": False, "pinned": pinned, "path": local_dir, "resolved_revision": revision if pinned else None,
              "bytes_downloaded": 0, "downloaded": [], "resumed": [], "offline": False, "progress_file": progress_file,
              "bytes_by_source": {}, "files_by_source": {}, "fallbacks": [], "_mismatch": [], "_markers_changed": False,
              "_secrets": secrets, "_identity": identity}
    markers = hf.load_markers(local_dir)
    commit = revision if pinned else None
    result["_prev"] = _keep_before_restore(module, p, repo_id, commit, local_dir, markers, result)
    restored = mr.restore_kept(local_dir, commit, markers, module.check_mode)
    if restored:  # the revision asked for again was kept (a rollback's): its files come back as links, nothing downloaded
        result.update(changed=True, restored_from_kept=restored, _assume=set(restored) if module.check_mode else set())
    client = None
    if p.get("manifest"):  # an offline site's pinned listing: the hub is asked for no metadata
        entries = hf.select_entries(ms.manifest_entries(p["manifest"]), p["allow_patterns"], p["ignore_patterns"])
        result["_listed_by"] = "the manifest's"
        statuses = _check_local(local_dir, entries, markers, verify, result, full=p["verify_full"]) if entries else None
    else:
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
            fail(error[0], exception=hf.scrub(error[1], *secrets))
        entries = hf.select_entries(entries, p["allow_patterns"], p["ignore_patterns"])
        statuses = None
    if not statuses:
        if not entries:
            fail("no file of %s@%s matches allow_patterns %s / ignore_patterns %s" % (
                repo_id, commit, p["allow_patterns"], p["ignore_patterns"]), phase="model_input", resolved_revision=commit)
        result["_mismatch"] = []
        statuses = _check_local(local_dir, entries, markers, verify, result, full=p["verify_full"])
    result["resolved_revision"] = commit
    result["_hub"] = lambda: client or hf.HubClient(endpoint, token=token, timeout=p["timeout"])
    return _apply(module, p, client, repo_id, commit, local_dir, entries, statuses, markers, progress_file, result, fail)


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
    free = hf.free_bytes(local_dir) if pl["todo"] else None
    prev = _previous(module, p, repo_id, commit, local_dir, markers, pl, free, result)
    if pl["todo"]:
        result["free_bytes"] = free
        msg = hf.preflight(pl["bytes_needed"], free + (prev["reclaim"] if prev["action"] == "remove" else 0), p["min_free_bytes_margin"])
        if msg:
            fail(msg + (" (%s)" % prev["message"] if prev["action"] == "no_space" else ""), phase="model_no_space", needed_bytes=pl["bytes_needed"],
                 free_bytes=free, margin_bytes=p["min_free_bytes_margin"], files=pl["files"], bytes_total=pl["bytes_total"], downloaded=[])
    # peers are contacted (master, listing) only when something is to fetch, never in check mode; closed at the end
    with ms.opened(p.get("sources"), result.get("_hub", lambda: client), repo_id, commit, result.get("_identity"),
                   idle=module.check_mode or not pl["todo"]) as (sources, warnings):
        for w in warnings:
            module.warn(hf.scrub(w, *result.get("_secrets", ())))
        if pl["todo"]:
            _access_check(sources, repo_id, commit, pl["todo"][0], fail)
            result["changed"] = True
            result["downloaded"] = [e["path"] for e in pl["todo"]]
            result["resumed"] = [e["path"] for e in pl["todo"] if statuses[e["path"]]["state"] == "partial"]
        if not module.check_mode:
            _act_on_previous(p, repo_id, local_dir, markers, pl, prev, result)
            if pl["todo"]:
                _download(module, sources, repo_id, commit, local_dir, pl, statuses, markers, progress_file, result, fail)
    if result["_markers_changed"] and not module.check_mode:
        hf.save_markers(local_dir, markers)
    result["verified"] = _count_verified(local_dir, entries, markers)
    return dict((k, v) for k, v in result.items() if not k.startswith("_"))


def _previous(module, p, repo_id, commit, local_dir, markers, pl, free, result):
    """What happens to the previous revision (O(keep_revision)): the plan, reported in RV(previous_revision)."""
    prev = result.get("_prev") or mr.plan(local_dir, repo_id, p.get("keep_revision"), commit, p, markers, pl["todo"], pl["bytes_needed"], free)
    result["previous_revision"] = dict((k, v) for k, v in prev.items() if not k.startswith("_"))
    if prev["action"] in ("keep", "remove"):
        result["changed"] = True  # a kept copy is made, or files are removed
    if prev["action"] in ("remove", "missing"):
        module.warn(prev["message"])
    return prev


def _keep_before_restore(module, p, repo_id, commit, local_dir, markers, result):
    """A kept revision restored over the model directory replaces the previous revision's files: keep that one first
    (hard links, no disk needed), the restored one too. The plan then stands for the whole run (check mode alike)."""
    if not p.get("keep_revision") or not mr.restore_kept(local_dir, commit, markers, check_mode=True):
        return None
    prev = mr.plan(local_dir, repo_id, p.get("keep_revision"), commit, p, markers, [], 0, None)
    if prev["action"] != "keep":
        return None
    if not module.check_mode:
        dropped = mr.keep(local_dir, repo_id, p.get("keep_revision"), prev["previous"], prev["_entries"], markers, exclude=(commit,))
        prev.update(_done=True, dropped=dropped, path=mr.kept_path(local_dir, prev["previous"]))
    return prev


def _act_on_previous(p, repo_id, local_dir, markers, pl, prev, result):
    """Keep the previous revision (hard links) or remove its files the download replaces, before the download."""
    if prev["action"] == "keep" and not prev.get("_done"):
        result["previous_revision"]["dropped"] = mr.keep(local_dir, repo_id, p.get("keep_revision"), prev["previous"], prev["_entries"], markers)
        result["previous_revision"]["path"] = mr.kept_path(local_dir, prev["previous"])
    elif prev["action"] == "remove":
        mr.remove(local_dir, prev["_entries"], [e["path"] for e in pl["todo"]], markers)


def _access_check(sources, repo_id, commit, entry, fail):
    """HEAD of one file to fetch when the hub is the first source able to serve it: a refused token fails here, in the
    check-mode probe, before anything is written (a file a peer or mirror serves costs the hub no request)."""
    first = next((s for s in sources if s.has(entry)), None)
    if not isinstance(first, ms.HubSource):
        return
    try:
        first.probe(entry)
    except Exception as e:  # pylint: disable=broad-except
        fail(hf.hub_error(repo_id, commit, first.endpoint, e), downloaded=[])


def _tally(module, result, path, got):
    """A file's bytes in RV(bytes_by_source) (a failed one's too), its source in RV(files_by_source), its RV(fallbacks)
    and a warning per fallback."""
    if got is None:
        return
    for label, n in got["bytes"].items():
        result["bytes_by_source"][label] = result["bytes_by_source"].get(label, 0) + n
    if got["source"]:
        result["files_by_source"].setdefault(got["source"], []).append(path)
    for fb in got["fallbacks"]:
        result["fallbacks"].append(dict((k, hf.scrub(v, *result["_secrets"])) for k, v in fb.items()))
        what = next((w for k, w in (("sha256 mismatch", "sha256"), ("git-sha1 mismatch", "git blob sha1")) if k in fb["error"]), "size")
        why = ("served a file whose %s differs from %s" % (what, result.get("_listed_by", "the Hub's"))
               if fb["reason"] == "mismatch" else "failed during the transfer (%s)" % fb["error"])
        module.warn(hf.scrub("%s: %s %s: fetched from %s" % (path, fb["from"], why, fb["to"]), *result["_secrets"]))


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


def _download(module, sources, repo_id, commit, local_dir, pl, statuses, markers, progress_file, result, fail):
    todo = sorted(pl["todo"], key=lambda e: -(e["size"] - statuses[e["path"]]["have"]))
    progress = hf.Progress(progress_file, repo_id, commit, pl["files"], pl["bytes_total"], pl["bytes_present"])
    progress.start()
    errors = {}
    started = time.time()

    def one(entry):
        try:
            got = hf.download_one(sources, local_dir, commit, entry, progress, verify=module.params["verify"],
                                  retries=module.params["retries"])
            progress.file_done(entry["path"])
            return entry["path"], got, None
        except Exception as e:  # pylint: disable=broad-except
            msg = hf.scrub(str(e) if isinstance(e, hf.HfError) else "%s: %s: %s" % (entry["path"], type(e).__name__, e),
                           *result["_secrets"])
            progress.file_done(entry["path"], ok=False, error=msg)
            return entry["path"], getattr(e, "partial", None), msg

    with ThreadPoolExecutor(max_workers=module.params["max_workers"]) as pool:
        for path, got, err in pool.map(one, todo):
            _tally(module, result, path, got)
            if err:
                errors[path] = err
            elif got["marker"]:
                markers[path] = got["marker"]
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
            bytes_by_source=result["bytes_by_source"], files_by_source=result["files_by_source"], fallbacks=result["fallbacks"],
            files=pl["files"], downloaded=sorted(set(result["downloaded"]) - set(errors)))
    progress.finish("done")
