from __future__ import annotations

import re

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import compat as c

DENSE = "Qwen3_5ForConditionalGeneration"
QWEN36_27B = {"architectures": [DENSE], "text_config": {"linear_num_key_heads": 16, "linear_num_value_heads": 48}}


@pytest.mark.parametrize("version,tp,action,pr", [
    ("0.5.9", 2, "refuse", "#19070"),
    ("0.5.9.post1", 2, "refuse", "#19070"),
    ("0.5.9rc0", 2, "refuse", "#19070"),
    ("0.5.9", 1, "ok", None),
    ("0.5.10", 2, "refuse", "#22312"),
    ("0.5.10.post1", 2, "refuse", "#22312"),
    ("0.5.10.post1", 1, "refuse", "#22312"),
    ("0.5.11", 2, "ok", None),
    ("0.5.11.post1", 2, "ok", None),
    ("0.5.23", 2, "ok", None),
])
def test_table_for_qwen36_27b(version, tp, action, pr):
    res = c.check(version, DENSE, tp, config=QWEN36_27B)
    assert res["action"] == action
    if action == "refuse":
        assert res["phase"] == "known_bad_version"
        assert pr in res["message"] and ">= 0.5.11" in res["remedy"]
        assert [r["pr"] for r in res["rules"]] == [pr]
    else:
        assert res["phase"] is None and res["rules"] == []


def test_other_architectures_are_not_refused():
    assert c.check("0.5.9", "Qwen3_5MoeForConditionalGeneration", 2)["action"] == "ok"
    assert c.check("0.5.9", "LlamaForCausalLM", 8)["action"] == "ok"
    assert c.check("0.5.9", "Qwen3_5ForCausalLM", 2)["action"] == "refuse"


def test_gdn_rule_depends_on_the_head_ratio():
    ratio2 = {"text_config": {"linear_num_key_heads": 16, "linear_num_value_heads": 32}}
    assert c.check("0.5.10", DENSE, 2, config=ratio2)["action"] == "ok"
    assert c.check("0.5.10", DENSE, 2, config=QWEN36_27B)["action"] == "refuse"
    assert c.check("0.5.10", DENSE, 2)["action"] == "refuse"   # no config: assume it applies


def test_overrides_and_extra_rules():
    res = c.check("0.5.9", DENSE, 2, overrides={"sglang-0.5.9-qwen3.5-dense-tp": "warn"})
    assert res["action"] == "warn" and res["phase"] is None and res["rules"][0]["overridden_from"] == "refuse"
    res = c.check("0.5.9", DENSE, 2, overrides={"sglang-0.5.9-qwen3.5-dense-tp": "ignore"})
    assert res["action"] == "ok" and "Overridden" in res["message"]
    extra = c.RULES + [{"id": "site-x", "sglang": "==0.5.11", "architectures": ["*"], "tp": ">=4", "action": "warn", "pr": "#1",
                        "reason": "r"}]
    assert c.check("0.5.11", DENSE, 4, rules=extra)["action"] == "warn"
    assert c.check("0.5.11", DENSE, 2, rules=extra)["action"] == "ok"


@pytest.mark.parametrize("a,b,expected", [
    ("0.5.9", "0.5.10", -1), ("0.5.10", "0.5.10.post1", -1), ("0.5.10.post1", "0.5.11", -1), ("0.5.11rc1", "0.5.11", -1),
    ("0.5.11.dev2", "0.5.11rc1", -1), ("0.5.11a1", "0.5.11b1", -1), ("1.0", "1.0.0", 0), ("1.0+local", "1.0", 0),
    ("1!0.1", "2.0", 1), ("0.5.10.post1.dev1", "0.5.10.post1", -1), ("0.5.10-1", "0.5.10.post1", 0), ("V0.5.9", "0.5.9", 0),
])
def test_compare(a, b, expected):
    assert c.compare(a, b) == expected


@pytest.mark.parametrize("version,spec,expected", [
    ("0.5.9", ">=0.5.9,<0.5.10", True), ("0.5.10", ">=0.5.9,<0.5.10", False), ("0.5.9.post2", ">=0.5.9,<0.5.10", True),
    ("0.5.10rc1", "<0.5.10", False), ("0.5.10rc1", "<0.5.10rc2", True), ("0.5.10.post1", ">0.5.10", False),
    ("0.5.11", ">0.5.10", True), ("0.5.10.3", "==0.5.10.*", True), ("0.5.11", "==0.5.10.*", False), ("0.5.11", "!=0.5.10.*", True),
    ("0.5.12", "~=0.5.10", True), ("0.6.0", "~=0.5.10", False), ("0.5.9", "", True), ("0.5.9", "*", True), ("0.5.9", "==0.5.9", True),
    ("0.5.9", "!=0.5.9", False), ("0.5.9", "===0.5.9", True),
])
def test_version_matches(version, spec, expected):
    assert c.version_matches(version, spec) is expected


def test_invalid():
    with pytest.raises(c.InvalidVersion):
        c.parse_version("latest")
    with pytest.raises(c.InvalidVersion):
        c.version_matches("0.5.9", "=>0.5")
    with pytest.raises(ValueError):
        c.check("0.5.9", DENSE, 2, rules=[{"id": "x", "sglang": "", "tp": "many", "action": "warn"}])


JIT = "sglang-jit-activation-nvcc"


@pytest.mark.parametrize("version,action", [
    ("0.5.10.post1", None),        # no jit_kernel/activation.py yet: sgl_kernel's prebuilt silu_and_mul
    ("0.5.11", "warn"), ("0.5.11.dev3", "warn"), ("0.5.12", "warn"), ("0.5.12.post1", "warn"),
    ("0.5.13", None), ("0.5.13.post1", None), ("0.5.23", None),
])
def test_jit_activation_rule_range(version, action):
    # every architecture and tp: SiluAndMul runs through jit_kernel on CUDA whatever the model
    for arch, tp in (("LlamaForCausalLM", 1), ("Qwen3_5MoeForConditionalGeneration", 8), (DENSE, None)):
        res = c.check(version, arch, tp, start_failures=True)
        jit = [r for r in res["rules"] if r["id"] == JIT]
        if action is None:
            assert jit == [], (version, arch)
        else:
            assert [r["action"] for r in jit] == ["warn"] and res["phase"] is None, (version, arch)
            assert "#26444" in res["message"] and "#25487" in res["message"] and "#25682" in res["message"]
            assert "CUDA graph capture" in res["message"] and "Pin sglang >= 0.5.13" in res["remedy"]
            if arch != DENSE:
                assert res["action"] == "warn"


def test_jit_activation_rule_is_a_start_failure_only():
    # not among the suspects of a running server's wrong answer (known_answer.py calls check() without start_failures)
    assert c.check("0.5.11", DENSE, 2, config=QWEN36_27B)["action"] == "ok"
    assert c.check("0.5.11", DENSE, 2, config=QWEN36_27B, start_failures=True)["action"] == "warn"
    # a refusal still wins over the warning where both apply (0.5.11 has no refusing rule: an extra one)
    extra = c.RULES + [{"id": "site-y", "sglang": "==0.5.11", "architectures": ["*"], "tp": "any", "action": "refuse", "pr": "#2"}]
    res = c.check("0.5.11", DENSE, 2, rules=extra, start_failures=True)
    assert res["action"] == "refuse" and sorted(r["id"] for r in res["rules"]) == [JIT, "site-y"]


def test_jit_activation_override():
    res = c.check("0.5.11", DENSE, 2, overrides={JIT: "ignore"}, start_failures=True)
    assert res["action"] == "ok" and "Overridden: %s (warn -> ignore)" % JIT in res["message"]
    res = c.check("0.5.12", DENSE, 2, overrides={JIT: "refuse"}, start_failures=True)
    assert res["action"] == "refuse" and res["phase"] == "known_bad_version"


def test_verdict_warns_with_the_remedy_and_asks_for_start_failures():
    warned = []
    out = c.verdict("0.5.11", DENSE, 2, {}, QWEN36_27B, warn=warned.append)
    assert out["action"] == "warn" and out["prs"] == ["#26444"] and [r["id"] for r in out["rules"]] == [JIT]
    # then the release that fixes it (test_compat_fixes.py)
    assert len(warned) == 2 and warned[0].startswith(out["message"]) and warned[0].endswith("Remedy: " + out["remedy"])
    assert warned[1].startswith("SGLang 0.5.13 fixes %s (#26444)" % JIT)
    warned = []
    out = c.verdict("0.5.11", DENSE, 2, {JIT: "ignore"}, warn=warned.append)
    assert out["action"] == "ok" and warned == []
    assert c.verdict("0.5.13", DENSE, 2, {}, warn=warned.append)["action"] == "ok" and warned == []


def test_each_known_bad_entry_cites_its_source():
    """Every rule names the upstream PR that fixed it, and that PR is among its sources."""
    for rule in c.RULES:
        assert re.match(r"^#\d+$", rule["pr"]), rule["id"]
        assert "https://github.com/sgl-project/sglang/pull/%s" % rule["pr"][1:] in rule["sources"], rule["id"]
        assert all(re.match(r"^https://github\.com/[\w.-]+/[\w.-]+/(pull|issues)/\d+$", s) for s in rule["sources"]), rule["id"]


@pytest.mark.parametrize("version,warns", [("0.5.23", False), ("0.5.23.post1", True), ("0.5.24", True), ("0.6.0rc1", True),
                                           ("0.5.13", False)])
def test_a_version_after_the_table_is_a_warning(version, warns):
    warned = []
    out = c.verdict(version, DENSE, 2, {}, QWEN36_27B, warn=warned.append)
    assert out["action"] == "ok"
    said = [w for w in warned if "is not in the compatibility table (newest known: 0.5.23)" in w]
    assert said == (["sglang %s is not in the compatibility table (newest known: 0.5.23): no known-bad rule or argument "
                     "change after 0.5.23 is known; add it with tests/tools/sglang_release_diff.py "
                     "(docs/sglang-releases.md)." % version] if warns else [])
