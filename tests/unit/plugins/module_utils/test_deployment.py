# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deployment record's decisions: what a deployment is, fail fast, what to restore, the rolled-back failure."""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

OLD, NEW = "a" * 64, "b" * 64
OPTS = {"model_path": "/srv/models/m", "tp_size": 2, "context_length": 65536, "port": 30000}


def make_venv(path, lock, version="0.5.11"):
    os.makedirs(os.path.join(str(path), "lib", "python3.11", "site-packages", "sglang-%s.dist-info" % version))
    with open(os.path.join(str(path), dp.LOCK_STAMP), "w") as f:
        f.write(lock + "\n")
    return str(path)


def dep(venv="/opt/sglang/venv", lock=OLD, version="0.5.11", revision="main", **opts):
    o = dict(OPTS)
    o.update(opts)
    return dp.deployment({"venv": venv, "options": o, "environment": {}, "api_key": "secret", "force_restart": True},
                         {"lock_sha256": lock, "sglang_version": version}, revision)


def test_a_deployment_never_holds_the_api_key_and_any_change_changes_its_signature():
    d = dep()
    assert "api_key" not in d["service"] and "force_restart" not in d["service"]
    assert dp.signature(d) == dp.signature(dep())
    for other in (dep(lock=NEW), dep(version="0.5.12"), dep(revision="abc"), dep(context_length=32768)):
        assert dp.signature(other) != dp.signature(d)


def test_venv_identity_reads_the_stamp_and_the_dist_info(tmp_path):
    v = make_venv(tmp_path / "venv", OLD, "0.5.11")
    assert dp.venv_identity(v) == {"venv": v, "lock_sha256": OLD, "sglang_version": "0.5.11"}
    assert dp.venv_identity(str(tmp_path / "none")) == {"venv": str(tmp_path / "none"), "lock_sha256": "", "sglang_version": ""}


def test_changes_name_each_option_and_the_environment():
    old, new = dep(), dep(lock=NEW, context_length=32768)
    new["service"]["environment"] = {"X": "1"}
    assert dp.changes(old, new) == ["lock_sha256: %s -> %s" % (OLD, NEW), 'environment.X: null -> "1"',
                                    "options.context_length: 65536 -> 32768"]


def test_recording_a_good_one_forgets_its_own_failure_only():
    good, bad = dep(), dep(context_length=1)
    rec = dp.record_failed({"good": good}, bad, {"phase": "kv_cache_oom", "msg": "m"}, good, now=100.0)
    assert dp.record_good(rec, good)["failed"] == rec["failed"]
    assert "failed" not in dp.record_good(rec, bad)
    assert dp.record_good({}, good) == {"good": good}


def test_rollback_plan_prefers_the_venv_itself_then_the_kept_one(tmp_path):
    venvs = str(tmp_path / "venvs")
    current = make_venv(tmp_path / "venv", NEW)
    good = dep(venv=current, lock=OLD)
    wanted = dep(venv=current, lock=NEW)
    # the venv now holds the new lock and the old one was not kept: no rollback, and why
    restore, reason = dp.rollback_plan({"good": good}, wanted, venvs)
    assert restore is None and "was not kept" in reason and OLD[:12] in reason
    kept = make_venv(dp.kept_venv(venvs, OLD), OLD)
    assert kept.endswith("/venvs/" + OLD[:16])
    restore, reason = dp.rollback_plan({"good": good}, wanted, venvs)
    assert reason is None and restore["venv"] == kept and restore["options"] == good["service"]["options"]
    assert "api_key" not in restore
    # an options-only change: the venv itself still holds the good lock
    same = dep(venv=current, lock=NEW)
    restore = dp.rollback_plan({"good": same}, dep(venv=current, lock=NEW, context_length=1), venvs)[0]
    assert restore["venv"] == current


def test_no_rollback_without_a_good_one_or_when_the_good_one_failed():
    assert dp.rollback_plan({}, dep(), "/x")[1].startswith("no deployment has passed the gate")
    assert dp.rollback_plan({"good": dep()}, dep(), "/x") == (None, None)


def test_the_same_failing_deployment_fails_fast_unless_retried():
    good, bad = dep(), dep(context_length=1)
    rec = dp.record_failed({"good": good}, bad, {"phase": "degenerate_output", "msg": "degenerate_output: launch x", "evidence": ["e"]},
                           good, now=100.0)
    f = dp.fail_fast(rec, bad, retry=False)
    assert f.phase == "degenerate_output" and f.evidence == ["e"]
    assert "rolled back to SGLang 0.5.11 (lock aaaaaaaaaaaa" in f.msg and "still serving" in f.msg
    assert "sglang_server_rollback_retry=true" in f.remedy and "options.context_length: 65536 -> 1" in f.remedy
    assert dp.fail_fast(rec, bad, retry=True) is None
    assert dp.fail_fast(rec, good, retry=False) is None
    assert dp.fail_fast(rec, dep(context_length=2), retry=False) is None


def test_rolled_back_names_the_new_diagnosis_and_what_serves_again():
    # the gate's failed result, as failure.fail returns it
    diag = dict(Failure("degenerate_output", "launch 1 did not become ready", remedy="turn MTP off", evidence=["!!!!"]).result(), failed=True)
    ok = dp.rolled_back(diag, dep(), {"phase": "ready", "failed": False}, failed_at=100.0, now=112.34)
    assert ok.phase == "degenerate_output" and ok.remedy == "turn MTP off"
    assert ok.msg == ("launch 1 did not become ready; rolled back to SGLang 0.5.11 (lock aaaaaaaaaaaa, venv /opt/sglang/venv), "
                      "model revision main, serving again (12.3 s after the failure)")
    assert ok.details["serving_again_s"] == 12.3
    bad = dp.rolled_back(diag, dep(), {"phase": "timeout", "failed": True, "msg": "timeout: no", "evidence": ["t"]}, 100.0, 200.0)
    assert bad.phase == "rollback_failed" and bad.evidence == ["!!!!", "t"] and "did not serve either: timeout: no" in bad.msg


def test_the_record_file_round_trips_0600(tmp_path):
    path = dp.record_path(str(tmp_path / "state"), "sglang.service")
    assert path.endswith("/state/sglang-deployment.json")
    assert dp.load(path) == {}
    dp.save(path, {"good": dep()})
    assert dp.load(path) == {"good": dep()}
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_not_rolled_back_keeps_the_gates_failure_and_says_why():
    # a message that holds the words the text form joins with: read as data, never split at them
    gate = Failure("timeout", "launch 1 did not become ready Remedy: none, timeout: 900 s", remedy="wait", evidence=["x"],
                   launch_id="1", known_answer={"failed": ["count"]})
    diag = dict(gate.result(), invocation={"module_args": {}}, ansible_job_id="j", _ansible_no_log=False)
    same = dp.not_rolled_back(diag, None)
    assert same.details == {"launch_id": "1", "known_answer": {"failed": ["count"]}, "rolled_back": False}
    assert (same.phase, same.msg, same.remedy, same.evidence) == ("timeout", gate.msg, "wait", ["x"])
    assert same.message() == gate.message()
    assert dp.not_rolled_back(diag, "no deployment").msg == gate.msg + "; not rolled back: no deployment"
    # the restored failure carries its own structure again, not the gate's
    assert same.result()["known_failure"] == gate.data()


def test_a_multi_node_deployment_is_never_rolled_back(tmp_path):
    make_venv(tmp_path / "venv", OLD)
    good = dep(venv=str(tmp_path / "venv"))
    assert dp.nnodes(good) == 1 and dp.nnodes(dep(nnodes=2)) == 2 and dp.nnodes(dep(nnodes="x")) == 1
    restore, reason = dp.rollback_plan({"good": good}, dep(venv=str(tmp_path / "venv"), nnodes=2, tp_size=4), None)
    assert restore is None and "not done for multi-node servers (nnodes 2)" in reason


def test_the_failure_is_recorded_only_when_the_restored_one_serves():
    good, wanted = dep(), dep(lock=NEW, revision="r2")
    older = {"good": good, "failed": {"signature": "x", "rolled_back_to": "y"}}
    served = dp.record_after_rollback(older, wanted, {"phase": "oom"}, good, {"phase": "ready"}, 100.0)
    assert served["failed"]["signature"] == dp.signature(wanted) and served["failed"]["at"] == 100.0
    assert "failed" not in dp.record_after_rollback(older, wanted, {"phase": "oom"}, good, {"failed": True, "phase": "oom"}, 100.0)
    assert dp.record_after_rollback(older, None, {}, good, {"phase": "ready"}, 1.0) == older


def test_the_message_says_the_restored_revision_runs_from_its_kept_copy():
    assert dp.revision_note(dep(revision="main"), dep(revision="main")) == "" and dp.revision_note(dep(), None) == ""
    f = dp.rolled_back({"phase": "oom", "msg": "oom: x"}, dep(revision="r1"), {"phase": "ready"}, 0.0, now=1.0, wanted=dep(revision="r2"))
    assert "model revision r1 from the copy kept under" in f.msg and "holds revision r2" in f.msg


def test_a_kept_model_revision_is_restored_and_a_missing_one_is_not_started(tmp_path):
    venv = make_venv(tmp_path / "venv", OLD)
    good, wanted = dep(venv=venv, revision="r1"), dep(venv=venv, revision="r2", context_length=1)
    good["service"]["model_dir"] = wanted["service"]["model_dir"] = "/srv/models/m"
    # not kept: nothing is started on the other revision's files, and the reason says which revision and what to do
    restore, reason = dp.rollback_plan({"good": good}, wanted, None, kept=lambda d, rev: None)
    assert restore is None and "revision r1 are not kept" in reason and "model_revision: r1" in reason and "free disk space" in reason
    f = dp.not_rolled_back({"phase": "wrong_answer", "msg": "wrong_answer: x"}, reason)
    assert "not rolled back: the model files of revision r1" in f.msg
    # kept: the restored server runs from the kept copy (model_dir and the options that named the model directory)
    restore, reason = dp.rollback_plan({"good": good}, wanted, None, kept=lambda d, rev: "%s/.cache/kpro-revisions/%s" % (d, rev))
    assert reason is None and restore["model_dir"] == restore["options"]["model_path"] == "/srv/models/m/.cache/kpro-revisions/r1"
    assert restore["options"]["tp_size"] == 2 and good["service"]["model_dir"] == "/srv/models/m"   # the record is not changed
    # the same revision: the model directory as it is, no lookup
    same = dep(venv=venv, revision="r2")
    same["service"]["model_dir"] = "/srv/models/m"
    restore, reason = dp.rollback_plan({"good": same}, wanted, None, kept=lambda d, rev: 1 / 0)
    assert restore["model_dir"] == "/srv/models/m"


def test_the_kept_copy_is_found_where_the_model_stage_keeps_it(tmp_path):
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf, model_revisions as mr
    model = str(tmp_path / "m")
    commit = "c" * 40
    hf.save_json(os.path.join(mr.kept_path(model, commit), mr.KEPT_FILE), {"commit": commit, "revision": "v1"})
    good, wanted = dep(revision=commit), dep(revision="d" * 40)
    good["service"]["model_dir"] = model
    assert dp.rollback_plan({"good": good}, wanted, None, identity=lambda v: {"lock_sha256": OLD})[0]["model_dir"] == mr.kept_path(model, commit)
    assert mr.find_kept(model, "v1") == mr.kept_path(model, commit) and mr.find_kept(model, "v2") is None


def test_good_model_revision_is_read_from_the_units_record(tmp_path):
    """hf_model's deployment_unit: the revision of the last good deployment, "" without a record or a good one."""
    state = str(tmp_path)
    assert dp.good_model_revision("sglang.service", state) == ""
    dp.save(dp.record_path(state, "sglang.service"), {"failed": {"signature": "x"}})
    assert dp.good_model_revision("sglang.service", state) == ""
    dp.save(dp.record_path(state, "sglang.service"), {"good": {"model_revision": "a" * 40, "environment": {"HF_TOKEN": "s"}}})
    assert dp.good_model_revision("sglang.service", state) == "a" * 40
    assert dp.good_model_revision("other.service", state) == ""
    assert dp.record_path(state, "sglang.service") == os.path.join(state, "sglang-deployment.json")
