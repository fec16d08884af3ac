# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_verify in-process: the record's deployment and model checked, the two result files written, changed=false, and a
failed task that names the first error's phase."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.modules import gpu_verify
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

REV = "6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5"


@pytest.fixture
def deployed(tmp_path):
    venv, model, state = tmp_path / "venv", tmp_path / "model", tmp_path / "state"
    for d in (venv, model / ".cache" / "kpro-hf" / "trees", state):
        d.mkdir(parents=True)
    (venv / dp.LOCK_STAMP).write_text("a" * 64 + "\n")
    (model / "w.safetensors").write_bytes(b"12345678")
    (model / ".cache" / "kpro-hf" / "trees" / ("org--m--%s.json" % REV)).write_text(
        json.dumps({"repo_id": "org/m", "commit": REV, "files": [{"path": "w.safetensors", "size": 8}]}))
    good = {"service": {"venv": str(venv), "model_dir": str(model)}, "lock_sha256": "a" * 64, "sglang_version": "", "model_revision": REV}
    (state / "sglang-deployment.json").write_text(json.dumps({"good": good}))
    return tmp_path


def args(root, **kw):
    out = {"host": "ct129", "checks": ["model"], "state_dir": str(root / "state"), "json_path": str(root / "out" / "verify.json"),
           "textfile_path": str(root / "prom" / "kpro_gpu_serving.prom")}
    out.update(kw)
    return out


def test_a_clean_model_verifies_unchanged_and_writes_both_files(deployed):
    with pytest.raises(AnsibleExitJson) as e:  # --check: the same result, no file written
        run_module(gpu_verify, args(deployed), check_mode=True)
    assert e.value.result["ok"] is True and e.value.result["changed"] is False
    assert not (deployed / "out").exists() and not (deployed / "prom").exists()
    with pytest.raises(AnsibleExitJson) as e:
        run_module(gpu_verify, args(deployed))
    res = e.value.result
    assert res["changed"] is False and res["ok"] is True and res["findings"] == []
    assert json.loads((deployed / "out" / "verify.json").read_text())["ok"] is True
    fams = dict((f.name, f) for f in text_string_to_metric_families((deployed / "prom" / "kpro_gpu_serving.prom").read_text()))
    assert fams["kpro_gpu_serving_verify_ok"].samples[0].value == 1


def test_a_truncated_file_fails_with_its_phase_or_only_reports(deployed):
    (deployed / "model" / "w.safetensors").write_bytes(b"1234")
    with pytest.raises(AnsibleFailJson) as e:
        run_module(gpu_verify, args(deployed))
    res = e.value.result
    assert res["phase"] == "model_files_changed" and res["changed"] is False
    assert res["findings"][0]["evidence"] == ["w.safetensors: 4 bytes, the revision's 8 bytes"]
    assert res["msg"].startswith("model_files_changed: verify found 1 finding(s), the first error in check model")
    with pytest.raises(AnsibleExitJson) as e:
        run_module(gpu_verify, args(deployed, fail_on_findings=False))
    assert e.value.result["ok"] is False and len(e.value.result["findings"]) == 1
