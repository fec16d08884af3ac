# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify run's checks of what serves: the unit and venv against the deployment record, the model files against the
pinned revision's listing, and the live server. Pure functions from gathered facts to findings (verify.finding).
Standard library only; Python 3.9+.
"""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import known_answer as ka
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.verify import finding

REDEPLOY = "Run the deploy playbook (tags serve, model) to bring the recorded deployment back, or record the new one by deploying it."


def deployment(good, venv_id, launched, fingerprint):
    """``good``: the record's deployment that passed the gate (None: none recorded); ``venv_id``: deployment.venv_identity of
    its venv now; ``launched``: sglang_service's state of the last launch (its ``fingerprint`` and ``lock_sha256``);
    ``fingerprint``: sglang_unit.config_fingerprint of the unit, environment and --config files now."""
    if not good:
        return [finding("deployment", "deployment_drift", ["no deployment that passed the gate is recorded"],
                        "Deploy with the deploy playbook: verify compares against the deployment its gate passed.", "warning")]
    ev = []
    if venv_id.get("lock_sha256") != good.get("lock_sha256"):
        ev.append("venv %s: lock %s, the record's %s" % (venv_id.get("venv"), _short(venv_id.get("lock_sha256")), _short(good.get("lock_sha256"))))
    if venv_id.get("sglang_version") != good.get("sglang_version"):
        ev.append("venv %s: SGLang %s, the record's %s" % (
            venv_id.get("venv"), venv_id.get("sglang_version") or "none", good.get("sglang_version")))
    if not launched:
        ev.append("no launch of the unit by the collection is recorded (sglang_service's state file)")
    elif launched.get("fingerprint") != fingerprint:
        ev.append("the unit, its environment or --config file changed since the server was launched (fingerprint %s, launched %s)"
                  % (_short(fingerprint), _short(launched.get("fingerprint"))))
    return [finding("deployment", "deployment_drift", ev, REDEPLOY)] if ev else []


def _short(digest):
    return (digest or "none")[:12]


def model(listing, files, hashes=None):
    """``listing``: the pinned revision's files as hf_model remembered them ([{path, size, sha256|oid}], None: none kept);
    ``files``: {path: size on disk or None}; ``hashes``: {path: (algorithm, digest on disk)} when hashes were verified."""
    if listing is None:
        return [finding("model", "model_files_changed", ["no listing of the pinned revision is kept in the model directory"],
                        "Run the deploy playbook's model stage: it lists the revision and checks every file.", "warning")]
    ev = []
    for e in listing:
        size = files.get(e["path"])
        if size != e["size"]:
            ev.append("%s: %s, the revision's %d bytes" % (e["path"], "missing" if size is None else "%d bytes" % size, e["size"]))
        elif hashes and e["path"] in hashes:
            algo, digest = hashes[e["path"]]
            want = e.get("sha256") if algo == "sha256" else e.get("oid")
            if want and digest != want:
                ev.append("%s: %s %s, the revision's %s" % (e["path"], algo, digest[:12], want[:12]))
    if not ev:
        return []
    return [finding("model", "model_files_changed", ev, "Run the deploy playbook's model stage (tag model): it downloads what is missing or "
                    "differs, verified against the revision, then restart the server (tag serve) if it serves the changed files.")]


def live(health_status, answers, latency_s, max_latency_s, server_args=None):
    """``health_status``: GET /health's status (None: no answer); ``answers``: known_answer.run_checks' result (None: not
    asked); ``latency_s``: one short completion's time (None: it failed)."""
    if health_status != 200:
        return [finding("live", "unresponsive", ["GET /health: %s" % (health_status or "no answer")],
                        "The server does not answer: see `systemctl status` and the server log; the deploy playbook's serve stage "
                        "restarts an unresponsive server.")]
    out = []
    if answers is not None and not answers["passed"]:
        f = ka.failure(answers, server_args)
        out.append(finding("live", f["phase"], f["evidence"], f["remedy"]))
    if latency_s is None or latency_s > max_latency_s:
        out.append(finding("live", "slow_response", ["one short completion: %s (limit %ss)" % (
            "failed" if latency_s is None else "%.2fs" % latency_s, max_latency_s)],
            "The server answers slowly: look at its load (queue, running requests in its metrics) and its log.", "warning"))
    return out
