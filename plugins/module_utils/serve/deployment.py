# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deployment record of one SGLang unit: the last deployment that passed the gate, and the last one that failed it.

A deployment is what a launch is made of: the SGLang version and the lock's sha256 of the venv it runs from, the
sglang_service arguments (venv, unit settings, SGLang options, environment; never the API key) and the model
revision. ``<state_dir>/<unit stem>-deployment.json`` holds ``{"good": deployment, "failed": {...}}``, written with
fileio.atomic_write. The decisions (fail fast, what to restore, what the record becomes) are pure functions of it.

    record after a passing gate ─> good
    a changed deployment fails its gate ─> failed (its signature and diagnosis) + the restore arguments of good
    the restored deployment passed its gate ─> failed (its signature and diagnosis) is recorded, not before
    the same failing deployment again ─> fail fast with the recorded diagnosis (unless retry)

A multi-node server (options nnodes > 1) is neither recorded nor rolled back: one node cannot know its peers' gates,
and a rollback of one rank would leave the ranks diverged.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write, load_json, read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container.model_revisions import KEPT_DIR, find_kept

# sglang_install writes the lock's sha256 here after a successful sync
LOCK_STAMP = ".kpro-lock.sha256"
# a kept venv is <venvs_dir>/<the first HASH_CHARS characters of its lock's sha256>
HASH_CHARS = 16
# sglang_service arguments that never belong to a deployment (a secret, a one-run switch)
NOT_RECORDED = ("api_key", "force_restart")


# where sglang_deployment keeps its records (its state_dir's default), read by hf_model for the revision to keep
STATE_DIR = "/var/lib/kpro-gpu-serving"


def record_path(state_dir, unit):
    stem = unit[:-len(".service")] if unit.endswith(".service") else unit
    return os.path.join(state_dir, "%s-deployment.json" % stem)


def load(path):
    data = load_json(path, default={})
    return data if isinstance(data, dict) else {}


def good_model_revision(unit, state_dir=STATE_DIR):
    """The model revision of ``unit``'s last deployment that passed the gate ("" when none is recorded)."""
    return (load(record_path(state_dir, unit)).get("good") or {}).get("model_revision") or ""


def render(record):
    """The record file's text (also what --diff shows)."""
    return json.dumps(record, sort_keys=True, indent=1) + "\n"


def save(path, record):
    """Write ``record`` (0600, its directory made 0755 first); returns the text written."""
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        os.makedirs(d, 0o755)
    text = render(record)
    atomic_write(path, text.encode("utf-8"), mode=MODE_DEFAULT, default_mode=0o600, unique_tmp=True)
    return text


def venv_lock(venv):
    """The lock's sha256 sglang_install stamped the venv with after its last sync ("" when missing)."""
    return (read_text(os.path.join(venv, LOCK_STAMP), strip=True) or "") if venv else ""


def venv_identity(venv):
    """{venv, lock_sha256, sglang_version} of a venv: the stamp sglang_install wrote and the sglang dist-info's version
    (empty strings when missing)."""
    stamp = venv_lock(venv)
    version = ""
    for info in sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "sglang-*.dist-info"))):
        version = os.path.basename(info)[len("sglang-"):-len(".dist-info")]
    return {"venv": venv, "lock_sha256": stamp, "sglang_version": version}


def kept_venv(venvs_dir, lock_sha256):
    return os.path.join(venvs_dir, lock_sha256[:HASH_CHARS]) if venvs_dir and lock_sha256 else None


def deployment(service, venv_id, model_revision):
    """The deployment the role asks for: the service arguments (without the API key), the venv's identity, the model
    revision."""
    args = dict((k, v) for k, v in (service or {}).items() if k not in NOT_RECORDED and v is not None)
    return {"service": args, "lock_sha256": venv_id.get("lock_sha256", ""), "sglang_version": venv_id.get("sglang_version", ""),
            "model_revision": model_revision or ""}


def nnodes(dep):
    """The number of nodes a deployment's server spans (SGLang's nnodes option; 1 when unset)."""
    try:
        return int((dep.get("service", {}).get("options") or {}).get("nnodes") or 1)
    except (TypeError, ValueError):
        return 1


def signature(dep):
    """A deployment's identity: the sha256 of its canonical JSON (any change of version, lock, option or revision
    changes it)."""
    return hashlib.sha256(json.dumps(dep, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def describe(dep):
    """One line naming a deployment: SGLang version and lock, venv, model revision."""
    service = dep.get("service", {})
    return "SGLang %s (lock %s, venv %s), model revision %s" % (
        dep.get("sglang_version") or "?", (dep.get("lock_sha256") or "?")[:12], service.get("venv", "?"), dep.get("model_revision") or "?")


def changes(old, new):
    """What differs between two deployments, as short 'name: old -> new' texts (the options one by one)."""
    out = []
    for key in ("sglang_version", "lock_sha256", "model_revision"):
        if old.get(key) != new.get(key):
            out.append("%s: %s -> %s" % (key, old.get(key) or "-", new.get(key) or "-"))
    so, sn = old.get("service", {}), new.get("service", {})
    for key in sorted(set(so) | set(sn)):
        if isinstance(so.get(key), dict) or isinstance(sn.get(key), dict):
            a, b = so.get(key) or {}, sn.get(key) or {}
            out += ["%s.%s: %s -> %s" % (key, k, json.dumps(a.get(k)), json.dumps(b.get(k))) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif so.get(key) != sn.get(key):
            out.append("%s: %s -> %s" % (key, json.dumps(so.get(key)), json.dumps(sn.get(key))))
    return out


def fail_fast(record, wanted, retry):
    """The Failure a run must stop with before touching the server: the wanted deployment is the one that failed its
    gate and was rolled back, and the operator did not ask to retry it. None otherwise."""
    failed = record.get("failed") or {}
    if retry or not failed or failed.get("signature") != signature(wanted):
        return None
    diag = failed.get("diagnosis") or {}
    facts = (failed.get("at_text", "?"), diag.get("phase", "?"), failed.get("rolled_back_to", "?"), diag.get("msg", "?"))
    msg = ("this configuration failed the gate at %s (%s) and was rolled back to %s, which is still serving; nothing was "
           "changed. Its diagnosis: %s" % facts)
    return Failure(diag.get("phase") or "not_started", msg, evidence=diag.get("evidence") or [],
                   remedy="Fix the configuration (%s), or set sglang_server_rollback_retry=true to launch it again." % "; ".join(failed.get("changes") or []))


def checked(record, service, model_revision, retry):
    """state=checked's step, for sglang_deployment and for sglang_service's deployment_check (one module call before the
    converge instead of two): (what the record says of the wanted deployment, with ``recorded``: whether recording it
    would change nothing; the Failure a run must stop with before touching the server, or None)."""
    wanted = deployment(service, venv_identity((service or {}).get("venv") or ""), model_revision)
    facts = dict(deployment=wanted, signature=signature(wanted), good=record.get("good"),
                 changes=changes(record.get("good") or {}, wanted) if record.get("good") else [],
                 recorded=record_good(record, wanted) == record)   # state=recorded's own step, not a copy of it
    return facts, fail_fast(record, wanted, retry)


def refuse_rolled_back(check, unit):
    """sglang_service's deployment_check, before the converge changes anything: raise the Failure of a deployment that
    failed its gate and was rolled back (unless ``check["retry"]``); else return whether it is recorded as good."""
    facts, refusal = checked(load(record_path(check["state_dir"], unit)), check["service"], check["model_revision"], check["retry"])
    if refusal:
        raise refusal
    return facts["recorded"]


def record_good(record, wanted):
    """The record after ``wanted`` passed its gate: it becomes good; a failure of that same deployment is forgotten."""
    new = dict(record)
    new["good"] = wanted
    if (record.get("failed") or {}).get("signature") == signature(wanted):
        new.pop("failed")
    return new


def restore_venv(good, venvs_dir, identity=venv_identity):
    """The venv that runs the good deployment's lock: its own path if it still holds that lock, else the kept one;
    None when neither does."""
    want = good.get("lock_sha256")
    path = good.get("service", {}).get("venv")
    for candidate in (path, kept_venv(venvs_dir, want)):
        if candidate and identity(candidate).get("lock_sha256") == want:
            return candidate
    return None


def restore_model(good, wanted, kept=find_kept):
    """(service arguments with the model directory the good deployment's revision is in, None) or (None, why not).

    The same revision as the wanted one: the model directory as it is. Another one: its copy kept by the model stage
    (model_revisions) replaces the model directory in the arguments and in every SGLang option that named it (model_path,
    tokenizer_path); when it was not kept (not enough disk for both), no server is started on the wrong files."""
    service = dict(good["service"])
    had, have = good.get("model_revision") or "", wanted.get("model_revision") or ""
    if had == have:
        return service, None
    model_dir = service.get("model_dir") or (service.get("options") or {}).get("model_path") or ""
    path = kept(model_dir, had)
    if path is None:
        return None, ("the model files of revision %s are not kept on this host (%s holds revision %s, and no copy of %s is under "
                      "%s: the disk had no room for both, or it was never downloaded here). Nothing was started on the wrong files. "
                      "To serve the recorded deployment again, run the play with model_revision: %s (the model stage downloads it "
                      "again); to keep the previous revision on the next change, free disk space on the model's filesystem"
                      % (had or "?", model_dir, have or "?", had or "?", os.path.join(model_dir, KEPT_DIR), had or "?"))
    service["options"] = dict((k, path if v == model_dir else v) for k, v in (service.get("options") or {}).items())
    service["model_dir"] = path
    return service, None


def rollback_plan(record, wanted, venvs_dir, identity=venv_identity, kept=find_kept):
    """(restore, reason): the sglang_service arguments that bring the good deployment back, or None and why not (None
    too when the failing deployment is the good one: nothing changed, nothing else to roll back to)."""
    good = record.get("good")
    if nnodes(wanted) > 1:
        return None, ("rollback is not done for multi-node servers (nnodes %d): restoring this node alone would leave the ranks "
                      "diverged; roll all nodes back together by hand" % nnodes(wanted))
    if not good:
        return None, "no deployment has passed the gate on this host since the record began: nothing to roll back to"
    if signature(good) == signature(wanted):
        return None, None  # nothing changed: the gate's own failure, as it is
    venv = restore_venv(good, venvs_dir, identity)
    if venv is None:
        return None, ("the venv of %s was not kept (neither %s nor %s holds lock %s)"
                      % (describe(good), good["service"].get("venv"), kept_venv(venvs_dir, good.get("lock_sha256")), good.get("lock_sha256", "")[:12]))
    restore, reason = restore_model(good, wanted, kept)
    if restore is None:
        return None, reason
    restore["venv"] = venv
    return restore, None


def record_failed(record, wanted, diagnosis, good, now=None):
    """The record after ``wanted`` failed its gate and ``good`` was restored and passed its gate again."""
    now = time.time() if now is None else now
    new = dict(record)
    new["failed"] = {"signature": signature(wanted), "at": round(now, 3), "at_text": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
                     "diagnosis": dict((k, diagnosis.get(k)) for k in ("phase", "msg", "remedy", "evidence")),
                     "rolled_back_to": describe(good), "changes": changes(good, wanted)}
    return new


def restored_serves(restored_gate):
    """Whether the restored deployment passed its gate (the gate's result, or the failed restore's)."""
    return (restored_gate or {}).get("phase", "ready") == "ready" and not (restored_gate or {}).get("failed")


def record_after_rollback(record, wanted, diagnosis, good, restored_gate, failed_at):
    """The record once the rollback is over: the failure of ``wanted`` is recorded only when ``good`` serves again (a
    later run of the same deployment fails fast saying so); when the restored one failed too, an older failure is
    forgotten (its "rolled back to ..., still serving" is no longer true). ``wanted`` None: the record as it is."""
    if restored_serves(restored_gate):
        return record_failed(record, wanted, diagnosis, good, now=failed_at) if wanted else record
    new = dict(record)
    new.pop("failed", None)
    return new


# keys of a registered task result that are Ansible's, or the failure itself (Failure.result adds them again)
_NOT_GATE_KEYS = ("phase", "msg", "remedy", "evidence", "known_failure", "failed", "changed", "invocation", "finished", "started",
                  "results_file", "warnings", "deprecations", "exception")


def gate_details(diagnosis):
    """What else the failed gate returned (launch_id, gpu_used_mib, exit_status, known_answer...), kept in the failure."""
    return dict((k, v) for k, v in diagnosis.items() if k not in _NOT_GATE_KEYS and not k.startswith(("_", "ansible_")))


def not_rolled_back(diagnosis, reason):
    """The gate's failure when there is nothing to roll back to (``reason`` None: nothing changed, the failure as it is)."""
    gate = Failure.from_result(diagnosis, rolled_back=False, **gate_details(diagnosis))
    if reason:
        gate.msg = "%s; not rolled back: %s" % (gate.msg, reason)
    return gate


def revision_note(good, wanted):
    """Said when the restored deployment's model revision is not the one in the model directory (it runs from the copy
    the model stage kept; rollback_plan refuses when there is none)."""
    have, had = (wanted or {}).get("model_revision") or "", good.get("model_revision") or ""
    if not wanted or have == had:
        return ""
    model_dir = good.get("service", {}).get("model_dir") or "?"
    return (" (model revision %s from the copy kept under %s; %s holds revision %s)" % (had or "?", os.path.join(model_dir, KEPT_DIR), model_dir, have or "?"))


def rolled_back(diagnosis, good, restored_gate, failed_at, now=None, wanted=None):
    """The Failure that ends a rolled-back run: the new deployment's diagnosis, then whether the good one serves again
    (``wanted``: the failing deployment, to say when the model revision in place is not the restored one's)."""
    now = time.time() if now is None else now
    gate = Failure.from_result(diagnosis, **gate_details(diagnosis))
    note = revision_note(good, wanted)
    if restored_serves(restored_gate):
        gate.details.update(serving_again_s=round(now - failed_at, 1), rolled_back=True)
        gate.msg = "%s; rolled back to %s, serving again (%.1f s after the failure)%s" % (gate.msg, describe(good), now - failed_at, note)
        return gate
    return Failure("rollback_failed", "%s (%s); the rollback to %s did not serve either: %s%s"
                   % (gate.msg, gate.phase, describe(good), restored_gate.get("msg"), note),
                   remedy="Both deployments failed their gate: see the two diagnoses; %s" % gate.remedy,
                   evidence=gate.evidence + list(restored_gate.get("evidence") or []), rolled_back=False)
