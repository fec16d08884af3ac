# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 35, "recommend, do not guess": the verdict warns when a newer release in the release table fixes a rule that
matches the configuration (version, architecture, TP, model config), and names the release without a known problem."""
from __future__ import annotations

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import compat

QWEN = "Qwen3_5ForConditionalGeneration"
BAD_RATIO = {"text_config": {"linear_num_key_heads": 16, "linear_num_value_heads": 48}}   # ratio 3 (PR #22312)


def _fixes(version, arch=QWEN, tp=2, overrides=None, config=None):
    warnings = []
    try:
        compat.verdict(version, arch, tp, overrides, model_config=config, warn=warnings.append)
    except Failure:
        pass
    return [w for w in warnings if w.startswith("SGLang ")]


def test_0511_is_told_of_0513_for_the_jit_activation_rule():
    line, = _fixes("0.5.11")
    assert line.startswith("SGLang 0.5.13 fixes sglang-jit-activation-nvcc (#26444); consider sglang_install_version: "
                           "0.5.13.post1 (a lock: roles/sglang_install/files/locks/regenerate.sh 0.5.13.post1 <Python X.Y>")
    # the same at TP 1 and for any architecture: the rule is "*" and "any"
    assert _fixes("0.5.12.post1", "LlamaForCausalLM", 1) == [line]


def test_a_refused_version_is_told_of_the_first_release_with_no_known_problem():
    # 0.5.9 at TP 2 is refused; 0.5.11 to 0.5.12.post1 still warn (JIT), so 0.5.13 is the first clean one
    assert _fixes("0.5.9")[0].startswith("SGLang 0.5.13 fixes sglang-0.5.9-qwen3.5-dense-tp (#19070)")
    # the GDN head-ratio rule matches only a config with that ratio
    assert any("sglang-0.5.10-qwen3.5-gdn-noncontiguous" in w for w in _fixes("0.5.10", config=BAD_RATIO))
    good_ratio = {"text_config": {"linear_num_key_heads": 16, "linear_num_value_heads": 32}}
    assert not any("gdn-noncontiguous" in w for w in _fixes("0.5.10", config=good_ratio))


@pytest.mark.parametrize("version", ["0.5.13", "0.5.23", "0.5.99"])
def test_nothing_to_recommend_without_a_matching_rule(version):
    assert _fixes(version) == []


def test_an_ignored_rule_is_not_recommended_away():
    assert _fixes("0.5.11", overrides={"sglang-jit-activation-nvcc": "ignore"}) == []


def test_newer_fixes_only_for_rules_that_warn_or_refuse():
    matched = compat.check("0.5.11", QWEN, 2, start_failures=True)["rules"]
    assert [w.split()[3] for w in compat.newer_fixes("0.5.11", QWEN, 2, matched)] == ["sglang-jit-activation-nvcc"]
    assert compat.newer_fixes("0.5.11", QWEN, 2, [dict(matched[0], action="ignore")]) == []
