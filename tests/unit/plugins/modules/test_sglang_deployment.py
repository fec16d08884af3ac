# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_deployment end to end on a temp state dir: record, fail + restore, fail fast, check mode, idempotence."""
from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import model_revisions as mr
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_deployment
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

OLD, NEW = "1" * 64, "2" * 64
# the gate's failed result, as failure.fail returns it
DIAG = dict(Failure("degenerate_output", "launch x of sglang.service did not become ready", remedy="r", evidence=["!!!!"]).result(),
            failed=True)


def venv(path, lock):
    os.makedirs(os.path.join(path, "lib", "python3.11", "site-packages", "sglang-0.5.11.dist-info"), exist_ok=True)
    with open(os.path.join(path, dp.LOCK_STAMP), "w") as f:
        f.write(lock + "\n")
    return path


def call(tmp_path, check_mode=False, **args):
    args.setdefault("state_dir", str(tmp_path / "state"))
    try:
        run_module(sglang_deployment, args, check_mode=check_mode)
    except AnsibleExitJson as e:
        return e.result
    except AnsibleFailJson as e:
        return e.result
    raise AssertionError("no exit")


def service(v, **opts):
    o = {"port": 30000, "served_model_name": "m"}
    o.update(opts)
    return {"unit": "sglang.service", "venv": v, "options": o, "environment": {}, "api_key": "k"}


@pytest.fixture
def host(tmp_path):
    return tmp_path, venv(str(tmp_path / "venv"), OLD)


def test_record_is_idempotent_and_check_mode_writes_nothing(host):
    tmp, v = host
    assert call(tmp, check_mode=True, state="recorded", service=service(v))["changed"] is True
    assert not os.path.exists(str(tmp / "state"))
    first = call(tmp, state="recorded", service=service(v), model_revision="main")
    assert first["changed"] is True and first["good"]["lock_sha256"] == OLD and "api_key" not in first["good"]["service"]
    assert call(tmp, state="recorded", service=service(v), model_revision="main")["changed"] is False
    checked = call(tmp, state="checked", service=service(v), model_revision="main")
    assert checked["changed"] is False and checked["recorded"] is True     # the role skips the record then
    assert call(tmp, state="checked", service=service(v), model_revision="other")["recorded"] is False


def test_checked_says_recorded_only_when_recording_would_change_nothing(host):
    tmp, v = host
    assert call(tmp, state="checked", service=service(v))["recorded"] is False          # nothing recorded yet
    call(tmp, state="recorded", service=service(v))
    assert call(tmp, state="checked", service=service(v))["recorded"] is True
    assert call(tmp, state="checked", service=service(v, port=30001))["recorded"] is False
    res = call(tmp, state="failed", service=service(v, port=30001), diagnosis=DIAG, venvs_dir=str(tmp / "venvs"))
    call(tmp, state="rolled_back", diagnosis=DIAG, good=res["good"], failed_at=res["failed_at"], restored_gate={"phase": "ready"},
         deployment=res["deployment"])
    # a retry of the failed deployment: recording it (once it passes) forgets the failure, so it is not "recorded"
    assert call(tmp, state="checked", service=service(v, port=30001), retry=True)["recorded"] is False
    assert call(tmp, state="checked", service=service(v))["recorded"] is True


def test_a_failed_venv_change_restores_the_kept_venv_then_the_same_change_fails_fast(host):
    tmp, v = host
    call(tmp, state="recorded", service=service(v))
    kept = venv(str(tmp / "venvs" / OLD[:16]), OLD)
    venv(v, NEW)  # sglang_install synced the venv with another lock
    res = call(tmp, state="failed", service=service(v), diagnosis=DIAG, venvs_dir=str(tmp / "venvs"))
    assert res["changed"] is False and res["restore"]["venv"] == kept and res["changes"] == ["lock_sha256: %s -> %s" % (OLD, NEW)]
    assert res["rolled_back_to"].startswith("SGLang 0.5.11 (lock 111111111111, venv %s)" % v)
    assert call(tmp, state="checked", service=service(v)).get("failed") is not True  # nothing recorded before the restored gate
    done = call(tmp, state="rolled_back", diagnosis=DIAG, good=res["good"], failed_at=res["failed_at"], restored_gate={"phase": "ready"},
                deployment=res["deployment"])
    assert done["changed"] is True and "note: the model files" not in done["msg"]
    assert done["failed"] and done["phase"] == "degenerate_output" and "serving again" in done["msg"] and done["rolled_back"] is True
    fast = call(tmp, state="checked", service=service(v))
    assert fast["failed"] and fast["phase"] == "degenerate_output" and "which is still serving" in fast["msg"]
    assert call(tmp, state="checked", service=service(v), retry=True).get("failed") is not True


def test_nothing_to_roll_back_to_fails_with_the_gates_diagnosis(host):
    tmp, v = host
    res = call(tmp, state="failed", service=service(v), diagnosis=DIAG)
    assert res["failed"] and res["phase"] == "degenerate_output" and "not rolled back: no deployment has passed" in res["msg"]
    call(tmp, state="recorded", service=service(v))
    same = call(tmp, state="failed", service=service(v), diagnosis=DIAG)
    assert same["msg"] == "degenerate_output: launch x of sglang.service did not become ready Remedy: r"


def test_a_failed_rollback_records_no_failure_and_forgets_an_older_one(host):
    tmp, v = host
    svc = dict(service(v), model_dir=str(tmp / "model"))
    call(tmp, state="recorded", service=svc, model_revision="r1")
    venvs = str(tmp / "venvs")
    venv(str(tmp / "venvs" / OLD[:16]), OLD)
    venv(v, NEW)
    res = call(tmp, state="failed", service=svc, diagnosis=DIAG, venvs_dir=venvs, model_revision="r1")
    call(tmp, state="rolled_back", diagnosis=DIAG, good=res["good"], failed_at=res["failed_at"], restored_gate={"phase": "ready"},
         deployment=res["deployment"])
    assert call(tmp, state="checked", service=svc, model_revision="r1")["failed"]   # recorded: fails fast
    # a change of the model revision too (r1 kept by the model stage) fails its gate, and the restored deployment fails too
    kept = mr.kept_path(svc["model_dir"], "c" * 40)
    hf.save_json(os.path.join(kept, mr.KEPT_FILE), {"commit": "c" * 40, "revision": "r1"})
    res = call(tmp, state="failed", service=svc, diagnosis=DIAG, venvs_dir=venvs, model_revision="r2")
    assert res["restore"]["model_dir"] == kept
    bad = {"failed": True, "phase": "oom", "msg": "oom: no", "evidence": []}
    done = call(tmp, state="rolled_back", diagnosis=DIAG, good=res["good"], failed_at=res["failed_at"], restored_gate=bad,
                deployment=res["deployment"])
    assert done["phase"] == "rollback_failed" and "model revision r1 from the copy kept under" in done["msg"]
    assert "failed" not in dp.load(dp.record_path(str(tmp / "state"), "sglang.service"))
    fast = call(tmp, state="checked", service=svc, model_revision="r1")
    assert fast.get("failed") is not True


def test_a_model_revision_that_was_not_kept_is_not_rolled_back_to(host):
    tmp, v = host
    svc = dict(service(v), model_dir=str(tmp / "model"))
    call(tmp, state="recorded", service=svc, model_revision="r1")
    before = dp.load(dp.record_path(str(tmp / "state"), "sglang.service"))
    res = call(tmp, state="failed", service=svc, diagnosis=DIAG, venvs_dir=str(tmp / "venvs"), model_revision="r2")
    assert res["failed"] and res["phase"] == "degenerate_output" and res["rolled_back"] is False and "restore" not in res
    assert "not rolled back: the model files of revision r1 are not kept on this host" in res["msg"]
    assert "model_revision: r1" in res["msg"] and dp.load(dp.record_path(str(tmp / "state"), "sglang.service")) == before


def test_a_multi_node_server_is_not_rolled_back(host):
    tmp, v = host
    call(tmp, state="recorded", service=service(v))
    venv(str(tmp / "venvs" / OLD[:16]), OLD)
    venv(v, NEW)
    res = call(tmp, state="failed", service=service(v, nnodes=2, node_rank=0), diagnosis=DIAG, venvs_dir=str(tmp / "venvs"))
    assert res["failed"] and res["phase"] == "degenerate_output" and "rollback is not done for multi-node servers (nnodes 2)" in res["msg"]
    assert res["rolled_back"] is False and "restore" not in res and res["changed"] is False


def test_diff_shows_the_record_as_it_would_be_written(host):
    tmp, v = host
    args = dict(state="recorded", service=service(v), model_revision="main", _ansible_diff=True)
    seen = call(tmp, check_mode=True, **args)
    assert seen["diff"]["before"] == "" and '"lock_sha256": "%s"' % OLD in seen["diff"]["after"]
    assert not os.path.exists(str(tmp / "state"))
    call(tmp, **args)
    path = dp.record_path(str(tmp / "state"), "sglang.service")
    with open(path) as f:
        assert f.read() == seen["diff"]["after"]
    assert "diff" not in call(tmp, **args)  # unchanged: nothing to show
