"""The memory plan keyed by SGLang release: per changed rule, the last release before and the first after.

Inputs: the kpro5 model (tests/unit/fixtures/qwen3.6-27b, hybrid GDN, multimodal) at TP 2; each docstring names the
line of the release's wheel (sglang/srt/...) that the expected value follows.
"""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan as sp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan_versions as pv

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "qwen3.6-27b")
CONFIG, INDEX = os.path.join(FIX, "config.json"), os.path.join(FIX, "model.safetensors.index.json")
A6000 = 49140
NEXTN = dict(tp=2, context_length=65536, speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
             speculative_num_draft_tokens=4)


def _plan(options, version, gpu=A6000):
    return sp.plan(CONFIG, INDEX, dict(options), gpu_total_mib=[gpu, gpu], gpu_baseline_mib=[300, 300], sglang_version=version)


def _vlm(mf):
    """adjust_mem_fraction_for_vlm (0.5.11 server_args.py:7137-7173, unchanged through 0.5.23 memory_hook.py) for the
    fixture's tower: no num_hidden_layers (24 assumed), hidden_size 1152."""
    return mf * 0.95 * (1.0 - 0.1 * (1152 * 1152 / (1024.0 * 1024) - 1.0))


def test_spec_reserve_gone_in_0514():
    """0.5.13 server_args.py:1625-1633 adds 4096 MiB for an EAGLE draft to the default reserve; 0.5.14
    server_args.py:3276-3315 does not (the KV profile counts the draft weights, model_runner_kv_cache_mixin.py:84-117)."""
    piecewise_off = 512 + 4096 * 1.5 + 32 * 2 + 2 / 8.0 * 1024   # multimodal: no piecewise graphs
    before = _plan(dict(NEXTN, disable_radix_cache=True), "0.5.13.post1")["options"]["mem_fraction_static"]
    after = _plan(dict(NEXTN, disable_radix_cache=True), "0.5.14")["options"]["mem_fraction_static"]
    assert before == _vlm(round((A6000 - piecewise_off - 4096) / A6000, 3))
    assert after == _vlm(round((A6000 - piecewise_off) / A6000, 3))


def test_radix_refusal_gone_in_0514():
    """0.5.13 server_args.py:2755 refuses speculative decoding with the radix cache on and no_buffer; 0.5.14
    server_args.py:4380-4399 picks extra_buffer for "auto" (overlap on, linear_attn_backend triton) and refuses nothing."""
    before, after = _plan(NEXTN, "0.5.13.post1"), _plan(NEXTN, "0.5.14")
    assert before["phase"] == "init_failed_before_gpu" and "not compatible with radix cache" in before["reason"]
    assert after["phase"] != "init_failed_before_gpu"
    assert after["options"]["mamba_scheduler_strategy"] == "extra_buffer"
    plain = _plan(dict(tp=2, context_length=65536), "0.5.14")["options"]["mamba_scheduler_strategy"]
    # without speculative decoding too: the overlap scheduler is on, so extra_buffer (ratio 3 + 2, not 3)
    assert (plain, _plan(dict(tp=2, context_length=65536), "0.5.13.post1")["options"]["mamba_scheduler_strategy"]) == ("extra_buffer", "no_buffer")
    no_radix = _plan(dict(tp=2, context_length=65536, disable_radix_cache=True), "0.5.14")["options"]["mamba_scheduler_strategy"]
    assert no_radix == "no_buffer"


def test_extra_buffer_without_radix_refused_only_before_0514():
    """0.5.13 server_args.py:2699 refuses extra_buffer with --disable-radix-cache; 0.5.14 returns first (4381-4382)."""
    opts = dict(tp=2, context_length=65536, mamba_scheduler_strategy="extra_buffer", disable_radix_cache=True)
    assert _plan(opts, "0.5.13.post1")["phase"] == "init_failed_before_gpu"
    assert _plan(opts, "0.5.14")["phase"] != "init_failed_before_gpu"


def test_small_tier_4k_from_0520():
    """The 20-35 GiB tier: 0.5.19 memory_hook.py chunked 2048 / max bs 24; 0.5.20 memory_hook.py:100-117 4096 / 48."""
    gpu = 32607
    opts = dict(tp=2, context_length=32768)
    before = sp.plan(CONFIG, INDEX, opts, gpu_total_mib=[gpu, gpu], sglang_version="0.5.19")["options"]["mem_fraction_static"]
    after = sp.plan(CONFIG, INDEX, opts, gpu_total_mib=[gpu, gpu], sglang_version="0.5.20")["options"]["mem_fraction_static"]
    assert before == _vlm(round((gpu - (512 + 2048 * 1.5 + 24 * 2 + 256)) / gpu, 3))
    assert after == _vlm(round((gpu - (512 + 4096 * 1.5 + 48 * 2 + 256)) / gpu, 3))


def test_graph_bs_capped_by_running_requests_from_0522():
    """0.5.22 memory_hook.py:182-188 caps the default decode graph max bs (32 on an A6000) at a given
    --max-running-requests; 0.5.21 does not."""
    opts = dict(tp=2, context_length=65536, max_running_requests=8)
    base = 512 + 4096 * 1.5 + 2 / 8.0 * 1024
    assert _plan(opts, "0.5.21")["options"]["mem_fraction_static"] == _vlm(round((A6000 - base - 32 * 2) / A6000, 3))
    assert _plan(opts, "0.5.22")["options"]["mem_fraction_static"] == _vlm(round((A6000 - base - 8 * 2) / A6000, 3))


def test_0511_and_none_are_the_same_plan():
    """No version and 0.5.11 plan alike, with no note about the version."""
    a, b = _plan(NEXTN, None), _plan(NEXTN, "0.5.11")
    assert a == b and not any("newer than" in w for w in a["warnings"])


def test_unknown_newer_version_uses_newest_rules_and_says_so():
    """A release after the table's newest gets the newest rules and a warning, not a traceback."""
    p = _plan(dict(tp=2, context_length=65536, max_running_requests=8), "0.6.0")
    assert p["options"]["mem_fraction_static"] == _plan(dict(tp=2, context_length=65536, max_running_requests=8), pv.NEWEST)["options"]["mem_fraction_static"]
    assert any("0.6.0 is newer than the memory plan's rules (read up to %s)" % pv.NEWEST in w for w in p["warnings"])


def test_version_keys():
    """post releases sort after their release; unreadable versions get 0.5.11's rules."""
    assert pv.key("0.5.13") < pv.key("0.5.13.post1") < pv.key("0.5.14")
    assert pv.resolve("garbage") == (pv.BASE, None) and pv.resolve("0.5.10") == (pv.BASE, None)
    assert pv.has("0.5.13.post1", "no_spec_reserve") is False and pv.has("0.5.14", "no_spec_reserve") is True


def test_a_speculative_verdict_the_plan_does_not_model_is_advice_from_0514():
    """From 0.5.14 the KV pool of a speculative launch is sized with the draft weights and the speculative working memory
    inside the mamba budget (model_runner_kv_cache_mixin.py:84-200), which the plan does not model: its "does not fit"
    for NEXTN with the radix cache on is a warning there, not a refusal; 0.5.11's refusal rules stay."""
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_restart
    after = _plan(NEXTN, "0.5.14")
    assert not after["fits"] and after["phase"] == "kv_cache_oom" and after["advisory"] is True and sglang_restart.plan_refusal(after) is None
    assert any("not enforced" in w for w in after["warnings"])
    plain = _plan(dict(tp=2, context_length=10 ** 7, disable_radix_cache=True), "0.5.14")  # no speculative: enforced
    assert not plain["fits"] and not plain.get("advisory") and sglang_restart.plan_refusal(plain) is not None
