# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The previous model revision a rollback needs: kept beside the new one when the disk allows.

The model directory holds one revision (hf_model replaces a changed file with ``os.replace``). Before a download of
another revision, the files of the previous one (the revision of the last deployment that passed the gate) are
hard-linked into ``<local_dir>/.cache/kpro-revisions/<commit>/`` (same filesystem, no bytes copied); the download then
replaces the paths in the model directory while the kept links hold the old bytes. A kept revision is complete when
its ``.kpro-kept.json`` names it; deployment.rollback_plan points the restored server there.

The disk arithmetic (``decide``):

    needed + margin <= free               keep: both revisions stay (the kept bytes are never freed)
    needed + margin <= free + reclaimable remove: the previous revision's files the download replaces are removed
                                          first (a rollback to it must download it again)
    otherwise                             no_space: hf_model's preflight fails as before, nothing removed

``needed``: the bytes still to download; ``reclaimable``: the bytes of the previous revision's files at the paths the
download replaces (the only bytes a download without keeping ever frees).
"""

from __future__ import annotations

import os
import re
import shutil

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import load_json
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container.hf import (
    load_tree_cache, make_marker, marker_valid, safe_relpath, save_json, save_markers, select_entries, state_path)

KEPT_DIR = os.path.join(".cache", "kpro-revisions")
KEPT_FILE = ".kpro-kept.json"
_SHA = re.compile(r"^[0-9a-f]{40}$")


def kept_path(local_dir, commit):
    return os.path.join(local_dir, KEPT_DIR, commit)


def load_kept(local_dir, commit):
    """The kept revision's record ({repo_id, revision, commit, files, bytes}) when it is complete, else None."""
    data = load_json(os.path.join(kept_path(local_dir, commit), KEPT_FILE))
    if not isinstance(data, dict) or data.get("commit") != commit:
        return None
    for path, m in (data.get("markers") or {}).items():  # every recorded file still there, at its size
        try:
            if os.stat(os.path.join(kept_path(local_dir, commit), safe_relpath(path))).st_size != m.get("size"):
                return None
        except (OSError, ValueError):
            return None
    return data


def drop_kept(local_dir, commits):
    """Drop kept revisions, the record first: an interrupted drop leaves no record naming missing files."""
    for c in commits:
        try:
            os.unlink(os.path.join(kept_path(local_dir, c), KEPT_FILE))
        except OSError:
            pass
        shutil.rmtree(kept_path(local_dir, c), ignore_errors=True)
    return list(commits)


def _link(src, dst, cleanup=None):
    """os.link, a refused link (EXDEV, EPERM, EMLINK) a named failure; ``cleanup``: the partial kept directory."""
    try:
        os.link(src, dst)
    except OSError as e:
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
        raise Failure("model_keep_failed", "cannot hard-link %s to %s: %s" % (src, dst, e.strerror or e),
                      remedy="set model_keep_previous_revision: false or put model_dir on a filesystem with hard links")


def kept_commits(local_dir):
    try:
        names = os.listdir(os.path.join(local_dir, KEPT_DIR))
    except OSError:
        return []
    return sorted(n for n in names if _SHA.match(n) and load_kept(local_dir, n))


def find_kept(local_dir, revision):
    """The kept directory of ``revision`` (a commit, or the revision string it was kept under), else None."""
    if not local_dir or not revision:
        return None
    for commit in kept_commits(local_dir):
        data = load_kept(local_dir, commit)
        if revision in (commit, data.get("revision")):
            return kept_path(local_dir, commit)
    return None


def _stat(local_dir, entry):
    try:
        return os.stat(os.path.join(local_dir, safe_relpath(entry["path"])))
    except OSError:
        return None


def holds(local_dir, entries, markers):
    """Whether the model directory holds every one of ``entries``, verified by a valid marker (no hashing)."""
    for e in entries:
        st = _stat(local_dir, e)
        if st is None or not marker_valid(markers.get(e["path"]), e, st):
            return False
    return bool(entries)


def previous_entries(local_dir, repo_id, keep_revision, commit, p, markers):
    """(previous commit, its selected entries) the model directory holds, or (commit or None, None).

    ``keep_revision`` a commit sha: that one. A branch or tag: the commit the model directory holds now (its listing
    cached, every file verified), the previous revision of a branch that moved."""
    def entries_of(c):
        cached = load_tree_cache(local_dir, repo_id, c)
        return select_entries(cached, p.get("allow_patterns"), p.get("ignore_patterns")) if cached else None

    if _SHA.match(keep_revision):
        sel = entries_of(keep_revision)
        return keep_revision, (sel if sel and holds(local_dir, sel, markers) else None)
    prefix = "%s--" % repo_id.replace("/", "--")
    try:
        names = sorted(os.listdir(state_path(local_dir, "trees")))
    except OSError:
        names = []
    for name in names:
        c = name[len(prefix):-len(".json")] if name.startswith(prefix) and name.endswith(".json") else ""
        if _SHA.match(c) and c != commit:
            sel = entries_of(c)
            if sel and holds(local_dir, sel, markers):
                return c, sel
    return None, None


def reclaimable(local_dir, entries, todo_paths, others=()):
    """Bytes freed by dropping the kept revisions ``others`` and unlinking the previous revision's files at the paths
    the download replaces: an inode counts only when every link to it is among those."""
    todo, links = set(todo_paths), []
    for c in others:
        for root, _dirs, files in os.walk(kept_path(local_dir, c)):
            links += [os.path.join(root, n) for n in files]
    links += [os.path.join(local_dir, safe_relpath(e["path"])) for e in entries if e["path"] in todo]
    inodes = {}
    for path in links:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        inodes[key] = (st.st_size, st.st_nlink, inodes.get(key, (0, 0, 0))[2] + 1)
    return sum(size for size, nlink, n in inodes.values() if n >= nlink)


def decide(prev, commit, needed, free, margin, reclaim):
    """(action, message) for keeping revision ``prev`` while ``commit`` is downloaded; see the module docstring."""
    figures = "%s needs %d bytes + %d margin, %d free" % (commit[:12], needed, margin, free)
    if needed + margin <= free:
        return "keep", ("previous model revision %s is kept beside %s (%s): a rollback can use it" % (prev, commit, figures))
    if needed + margin <= free + reclaim:
        return "remove", ("previous model revision %s is NOT kept: not enough disk for both (%s; keeping it needs %d bytes more). "
                          "Its %d bytes of files that %s replaces are removed before the download, so a rollback to it is not "
                          "possible until it is downloaded again (set model_revision: %s and run the play); free disk space to "
                          "keep the previous revision on the next change" % (prev, figures, needed + margin - free, reclaim, commit[:12], prev))
    return "no_space", ("previous model revision %s cannot be kept and %s does not fit even without it (%s, %d bytes of %s would be "
                        "replaced)" % (prev, commit[:12], figures, reclaim, prev[:12]))


def plan(local_dir, repo_id, keep_revision, commit, p, markers, todo, needed, free):
    """{action, previous, message, reclaim}: what happens to the previous revision; action none, kept, missing, keep,
    remove or no_space (``free`` None: nothing to download, so nothing replaces a file)."""
    keep_revision = keep_revision or ""
    if not keep_revision or keep_revision == commit:
        return {"action": "none", "previous": keep_revision or None, "message": "", "reclaim": 0}
    prev, entries = previous_entries(local_dir, repo_id, keep_revision, commit, p, markers)
    if prev is None or prev == commit:
        return {"action": "none", "previous": prev, "message": "", "reclaim": 0}
    if load_kept(local_dir, prev):
        return {"action": "kept", "previous": prev, "reclaim": 0,
                "message": "previous model revision %s is kept in %s: a rollback can use it" % (prev, kept_path(local_dir, prev))}
    if entries is None:
        return {"action": "missing", "previous": prev, "reclaim": 0,
                "message": ("previous model revision %s is not in %s (nor kept): a rollback to it must download it again "
                            "(set model_revision: %s)" % (prev, local_dir, prev))}
    reclaim = reclaimable(local_dir, entries, [e["path"] for e in todo], [c for c in kept_commits(local_dir) if c != prev])
    margin = p.get("min_free_bytes_margin") or 0
    action, message = decide(prev, commit, needed, margin if free is None else free, margin, reclaim)
    return {"action": action, "previous": prev, "message": message, "reclaim": reclaim, "_entries": entries}


def keep(local_dir, repo_id, revision, commit, entries, markers, exclude=()):
    """Hard-link ``entries`` into the kept directory of ``commit`` (the record last: an interrupted keep is not complete),
    drop other kept revisions (not ``exclude``), and re-stamp the markers a link's ctime change voided. Returns the
    dropped commits."""
    dest = kept_path(local_dir, commit)
    for e in entries:
        src = os.path.join(local_dir, safe_relpath(e["path"]))
        dst = os.path.join(dest, safe_relpath(e["path"]))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.lexists(dst):
            os.unlink(dst)
        valid = marker_valid(markers.get(e["path"]), e, os.stat(src))
        _link(src, dst, cleanup=dest)
        if valid:  # linking changes the inode's ctime, not its bytes
            markers[e["path"]] = make_marker(e, os.stat(src))
    save_markers(local_dir, markers)
    save_json(os.path.join(dest, KEPT_FILE), {"repo_id": repo_id, "revision": revision, "commit": commit,
                                              "files": len(entries), "bytes": sum(e["size"] for e in entries),
                                              "markers": dict((e["path"], markers[e["path"]]) for e in entries if e["path"] in markers)})
    return drop_kept(local_dir, [c for c in kept_commits(local_dir) if c != commit and c not in exclude])


def remove(local_dir, entries, todo_paths, markers):
    """Remove the previous revision's files at the paths the download replaces, and the other kept revisions whose
    links would hold those bytes (their space is needed first)."""
    drop_kept(local_dir, kept_commits(local_dir))
    todo = set(todo_paths)
    for e in entries:
        if e["path"] in todo:
            try:
                os.unlink(os.path.join(local_dir, safe_relpath(e["path"])))
            except OSError:
                pass
            markers.pop(e["path"], None)
    save_markers(local_dir, markers)


def restore_kept(local_dir, commit, markers, check_mode=False):
    """Bring a kept revision back into the model directory when it is asked for again (after a rollback the model
    directory holds the failed revision): each kept file whose size, mtime and inode are still those it was kept with
    is hard-linked back over its path (no bytes downloaded or hashed again) and its marker restored. Returns the
    paths restored (in check mode: that would be)."""
    data = load_kept(local_dir, commit) if commit else None
    out = []
    for path, m in sorted(((data or {}).get("markers") or {}).items()):
        src = os.path.join(kept_path(local_dir, commit), safe_relpath(path))
        dst = os.path.join(local_dir, safe_relpath(path))
        try:
            st = os.stat(src)
        except OSError:
            continue
        if (st.st_size, st.st_mtime_ns, st.st_ino) != (m.get("size"), m.get("mtime_ns"), m.get("ino")):
            continue  # changed since it was kept: the normal check decides
        if os.path.exists(dst) and os.stat(dst).st_ino == st.st_ino and (markers.get(path) or {}).get("oid") == m.get("oid"):
            continue  # in place already
        out.append(path)
        if not check_mode:
            tmp = dst + ".kpro-restore"
            if os.path.lexists(tmp):
                os.unlink(tmp)
            _link(src, tmp)
            os.replace(tmp, dst)
            markers[path] = dict(m, ctime_ns=os.stat(dst).st_ctime_ns)
    if out and not check_mode:
        save_markers(local_dir, markers)
    return out
