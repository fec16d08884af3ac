# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

from unittest import mock

import pytest

from ansible.module_utils import basic

from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_compat
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module

ARCH = "Qwen3_5ForConditionalGeneration"
QWEN36_27B = {"architectures": [ARCH], "text_config": {"linear_num_key_heads": 16, "linear_num_value_heads": 48}}


def ok(args, check_mode=False):
    warned = []
    with mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: warned.append(msg)):
        with pytest.raises(AnsibleExitJson) as e:
            run_module(sglang_compat, args, check_mode=check_mode)
    e.value.result["warnings"] = warned
    return e.value.result


def refused(args, check_mode=False):
    with pytest.raises(AnsibleFailJson) as e:
        run_module(sglang_compat, args, check_mode=check_mode)
    return e.value.result


@pytest.mark.parametrize("check_mode", [False, True])
def test_059_tp2_refused_with_pr_19070(check_mode):
    res = refused({"version": "0.5.9", "architecture": ARCH, "tp": 2}, check_mode=check_mode)
    assert res["action"] == "refuse" and res["phase"] == "known_bad_version"
    assert res["prs"] == ["#19070"] and "19070" in res["msg"]
    assert res["rules"][0]["id"] == "sglang-0.5.9-qwen3.5-dense-tp"
    assert "0.5.11" in res["remedy"] and res["changed"] is False


@pytest.mark.parametrize("version", ["0.5.10", "0.5.10.post1", "0.5.10rc0"])
def test_0510_refused_with_pr_22312(version):
    res = refused({"version": version, "architecture": ARCH, "tp": 2, "model_config": QWEN36_27B})
    assert res["phase"] == "known_bad_version" and "#22312" in res["prs"] and "22312" in res["msg"]


def test_0510_at_tp1_still_refused_gdn_rule_is_tp_independent():
    res = refused({"version": "0.5.10.post1", "architecture": ARCH, "tp": 1})
    assert res["prs"] == ["#22312"]


def test_059_at_tp1_is_ok():
    res = ok({"version": "0.5.9", "architecture": ARCH, "tp": 1})
    assert res["action"] == "ok" and res["phase"] is None and res["prs"] == [] and res["changed"] is False


@pytest.mark.parametrize("version", ["0.5.13", "0.6.0"])
def test_fixed_versions_ok(version):
    res = ok({"version": version, "architecture": ARCH, "tp": 2})
    assert res["action"] == "ok" and res["rules"] == [] and "no known problem" in res["message"]


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.12.post1"])
def test_jit_activation_versions_warn_with_the_remedy(version):
    # any architecture, any tp: the warning (a normal run's only view of it) carries the reason and the remedy
    res = ok({"version": version, "architecture": "LlamaForCausalLM", "tp": 1})
    assert res["action"] == "warn" and res["phase"] is None and res["prs"] == ["#26444"] and res["changed"] is False
    assert [r["id"] for r in res["rules"]] == ["sglang-jit-activation-nvcc"]
    assert len(res["warnings"]) == 2 and "#25487" in res["warnings"][0] and "Remedy: Pin sglang >= 0.5.13" in res["warnings"][0]
    assert res["warnings"][1].startswith("SGLang 0.5.13 fixes sglang-jit-activation-nvcc (#26444); consider sglang_install_version: 0.5.13.post1")
    res = ok({"version": version, "architecture": ARCH, "tp": 2, "overrides": {"sglang-jit-activation-nvcc": "ignore"}})
    assert res["action"] == "ok" and res["warnings"] == [] and "Overridden" in res["message"]


def test_other_architecture_ok():
    assert ok({"version": "0.5.9", "architecture": "LlamaForCausalLM", "tp": 2})["action"] == "ok"


def test_override_to_warn_runs_knowingly():
    res = ok({"version": "0.5.9", "architecture": ARCH, "tp": 2, "overrides": {"sglang-0.5.9-qwen3.5-dense-tp": "warn"}})
    assert res["action"] == "warn" and res["prs"] == ["#19070"]
    assert res["rules"][0]["overridden_from"] == "refuse"
    assert any("19070" in w for w in res.get("warnings", []))


def test_override_to_ignore():
    res = ok({"version": "0.5.9", "architecture": ARCH, "tp": 2, "overrides": {"sglang-0.5.9-qwen3.5-dense-tp": "ignore"}})
    assert res["action"] == "ok" and res["prs"] == [] and "Overridden" in res["message"]


def test_bad_override_value_and_unknown_rule():
    res = refused({"version": "0.5.11", "architecture": ARCH, "tp": 2, "overrides": {"x": "maybe"}})
    assert "must be one of" in res["msg"]
    res = ok({"version": "0.5.11", "architecture": ARCH, "tp": 2, "overrides": {"no-such-rule": "warn"}})
    assert any("no-such-rule" in w for w in res.get("warnings", []))


def test_invalid_version():
    res = refused({"version": "latest", "architecture": ARCH, "tp": 2})
    assert "PEP 440" in res["msg"] or "not a PEP 440" in res["message"]


def test_failures_name_their_phase():
    res = refused({"version": "0.5.11", "architecture": ARCH, "tp": 2, "overrides": {"x": "maybe"}})
    assert res["phase"] == "bad_input"
    res = refused({"version": "latest", "architecture": ARCH, "tp": 2})
    assert res["phase"] == "bad_version" and res["action"] == "refuse" and "PEP 440" in res["remedy"]
    res = refused({"version": "0.5.10", "architecture": ARCH, "tp": 2})
    assert res["phase"] == "known_bad_version" and res["evidence"] and "Remedy:" in res["msg"]


def test_the_filter_gives_the_modules_verdict_without_raising():
    """The roles' filter (plugins/filter/compat.py): the module's result on the controller; a refusal and an invalid
    input are returned for the role's assert, with the inputs it was asked about."""
    from ansible_collections.kpro.gpu_serving.plugins.filter.compat import sglang_compat
    ok = sglang_compat("0.5.13", "Qwen3_5ForConditionalGeneration", "2", {})
    assert ok["msg"] == ok["message"]
    assert ok["action"] == "ok" and ok["tp"] == 2 and ok["version"] == "0.5.13" and ok["phase"] is None
    # a rule that warns passes the role's assert; the text goes to Ansible's warnings (Display().warning)
    with mock.patch("ansible_collections.kpro.gpu_serving.plugins.filter.compat.Display.warning") as warning:
        warned = sglang_compat("0.5.11", "Qwen3_5ForConditionalGeneration", 2, {})
    assert warned["action"] == "warn" and warned["phase"] is None and warned["prs"] == ["#26444"]
    assert warning.call_count == 2 and "Remedy: Pin sglang >= 0.5.13" in warning.call_args_list[0][0][0]
    assert warning.call_args[0][0].startswith("SGLang 0.5.13 fixes sglang-jit-activation-nvcc (#26444)")
    bad = sglang_compat("0.5.9", "Qwen3_5ForConditionalGeneration", 2)
    assert bad["action"] == "refuse" and bad["phase"] == "known_bad_version" and "#19070" in bad["prs"]
    assert "19070" in bad["message"] and bad["evidence"] == ["rule sglang-0.5.9-qwen3.5-dense-tp (#19070)"] and bad["remedy"]
    assert bad["msg"] == "known_bad_version: %s Remedy: %s" % (bad["message"], bad["remedy"])
    assert sglang_compat("0.5.9", "Qwen3_5ForConditionalGeneration", 1)["action"] == "ok"
    overridden = sglang_compat("0.5.9", "Qwen3_5ForConditionalGeneration", 2, {"sglang-0.5.9-qwen3.5-dense-tp": "warn"})
    assert overridden["action"] == "warn"
    assert sglang_compat("five", "Qwen3_5ForConditionalGeneration", 2)["phase"] == "bad_version"
    assert sglang_compat("0.5.11", "X", 2, {"x": "maybe"})["phase"] == "bad_input"
