from __future__ import annotations

import copy
import json
import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan as sp

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "qwen3.6-27b")
CONFIG = os.path.join(FIX, "config.json")
INDEX = os.path.join(FIX, "model.safetensors.index.json")
A6000 = [49140, 49140]   # nvidia-smi memory.total of an RTX A6000, MiB
GIB_MIB = 1024.0
SEED = dict(tp=2, context_length=65536, mem_fraction_static=0.85, speculative_algorithm="NEXTN", speculative_num_steps=3,
            speculative_eagle_topk=1, speculative_num_draft_tokens=4)
MTP_EXAMPLE = dict(SEED, disable_radix_cache=True, max_running_requests=8)
# the fixture's MTP head (mtp_num_hidden_layers 1, hidden 5120, 24 heads x 256 with the output gate, 4 KV heads, MLP 17408), bf16:
# fc 2h.h + 2 pre-fc norms + final norm + q/k/v/o + q/k norms + 2 layer norms + gate/up/down
MTP_PARAMS = (2 * 5120 * 5120 + 3 * 5120 + 5120 * 24 * 256 * 2 + 2 * 5120 * 4 * 256 + 24 * 256 * 5120 + 2 * 256 + 2 * 5120
              + 3 * 5120 * 17408)
MTP_BYTES = MTP_PARAMS * 2


def test_geometry_from_nested_text_config():
    with open(CONFIG) as f:
        cfg = json.load(f)
    geo = sp.model_geometry(cfg)
    assert geo["architecture"] == "Qwen3_5ForConditionalGeneration"
    assert (geo["full_attention_layers"], geo["linear_attention_layers"]) == (16, 48)
    assert geo["num_key_value_heads"] == 4 and geo["head_dim"] == 256 and geo["mtp_num_hidden_layers"] == 1
    # the same without layer_types (full_attention_interval only) and flat (no text_config)
    flat = dict(cfg["text_config"], architectures=["Qwen3_5ForCausalLM"])
    del flat["layer_types"]
    geo2 = sp.model_geometry(flat)
    assert (geo2["full_attention_layers"], geo2["linear_attention_layers"]) == (16, 48)
    assert sp.kv_cell_bytes(geo, 2, 2) == 32 * 1024            # (4/2) x (256+256) x 16 x 2 = 32 KiB / token
    assert sp.mamba_cache_per_req_bytes(geo, 2) / 2 ** 20 == pytest.approx(73.4, abs=0.05)
    assert sp.mamba_cache_per_req_bytes(geo, 2, ssm_bytes=2) / 2 ** 20 == pytest.approx(37.4, abs=0.1)


def test_seed_is_refused_before_launch_naming_the_flag():
    """65536 context, 0.85, NEXTN 3/1/4 with the radix cache on (SGLang's default) on 2x A6000: SGLang 0.5.10+ raises
    the ValueError of server_args.py:2453-2456 while parsing its arguments; the plan refuses with the same text."""
    p = sp.plan(CONFIG, INDEX, SEED, gpu_total_mib=A6000)
    assert p["fits"] is False and p["phase"] == "init_failed_before_gpu"
    assert ("ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache when using "
            "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use --mamba-scheduler-strategy "
            "extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.") in p["reason"]
    assert p["suggestions"][0] == {"flag": "--disable-radix-cache", "value": True,
                                   "effect": "speculative decoding without prefix caching (SGLang 0.5.9 did this by itself)"}
    assert p["suggestions"][1]["flag"] == "--mamba-scheduler-strategy" and p["suggestions"][1]["value"] == "extra_buffer"
    assert p["remedy"].startswith("Add --disable-radix-cache") and "SGLANG_ENABLE_SPEC_V2=1" in p["remedy"]
    # the numbers are those of the launch with the flag: still no KV pool with SGLang's default of 48 requests
    assert "with it the memory plan still refuses the launch" in p["reason"] and "48 requests x 4 draft tokens" in p["reason"]
    assert p["max_running_requests"] == 48 and p["options"]["speculative_algorithm"] == "EAGLE"
    # a non-speculative launch, the flag given, or extra_buffer: no refusal at parsing
    assert sp.plan(CONFIG, INDEX, dict(SEED, speculative_algorithm=None), gpu_total_mib=A6000)["phase"] is None
    assert sp.plan(CONFIG, INDEX, dict(SEED, disable_radix_cache=True), gpu_total_mib=A6000)["phase"] == "kv_cache_oom"
    assert sp.plan(CONFIG, INDEX, dict(SEED, mamba_scheduler_strategy="extra_buffer"), gpu_total_mib=A6000)["phase"] != "init_failed_before_gpu"
    # extra_buffer with --disable-radix-cache is refused too (server_args.py:2397-2401)
    q = sp.plan(CONFIG, INDEX, dict(SEED, mamba_scheduler_strategy="extra_buffer", disable_radix_cache=True), gpu_total_mib=A6000)
    assert q["phase"] == "init_failed_before_gpu" and "mamba extra_buffer is not compatible with --disable-radix-cache" in q["reason"]
    assert q["suggestions"][0]["flag"] == "--mamba-scheduler-strategy" and q["suggestions"][0]["value"] == "no_buffer"


def test_seed_with_the_flag_is_refused_with_numbers():
    """With --disable-radix-cache the seed runs into the KV pool: SGLang said "Not enough memory"."""
    p = sp.plan(CONFIG, INDEX, dict(SEED, disable_radix_cache=True), gpu_total_mib=A6000)
    g = p["per_gpu"]
    assert p["fits"] is False and p["phase"] == "kv_cache_oom"
    assert p["max_running_requests"] == 48                     # NEXTN is EAGLE: 48 (server_args.py:3454-3458)
    assert p["options"]["speculative_num_draft_tokens"] == 4
    assert g["total_mib"] == 49140 and g["weights_mib"] == pytest.approx((55600000000 - MTP_BYTES) / 2 / 2 ** 20, abs=1)
    assert g["spec_reservation_mib"] == pytest.approx(48 * 4 * 73.41, rel=0.002)   # ~13.8 GiB
    assert g["mamba_state_mib"] == pytest.approx(48 * 73.41, rel=0.002)           # ~3.4 GiB
    assert (g["spec_reservation_mib"] + g["mamba_state_mib"]) / GIB_MIB == pytest.approx(17.2, abs=0.1)
    assert g["kv_budget_mib"] < 0 and g["kv_tokens"] == 0
    assert "48 requests x 4 draft tokens" in p["reason"] and "context_length 65536" in p["reason"]
    assert p["remedy"].startswith("Change one of")
    flags = [s["flag"] for s in p["suggestions"]]
    assert flags[0] == "--max-running-requests" and "--speculative-algorithm" in flags
    assert p["suggestions"][0]["value"] == 16
    # the seed's retry at 0.88 fails too
    assert sp.plan(CONFIG, INDEX, dict(SEED, disable_radix_cache=True, mem_fraction_static=0.88), gpu_total_mib=A6000)["fits"] is False


def test_the_suggested_max_running_requests_fits():
    p = sp.plan(CONFIG, INDEX, dict(SEED, disable_radix_cache=True), gpu_total_mib=A6000)
    val = p["suggestions"][0]["value"]
    p2 = sp.plan(CONFIG, INDEX, dict(SEED, disable_radix_cache=True, max_running_requests=val), gpu_total_mib=A6000)
    assert p2["fits"] is True and p2["per_gpu"]["kv_tokens"] >= 65536


def test_nextn_with_the_flag_and_8_requests_fits():
    """The role's MTP example (roles/sglang_server/defaults/main.yml): NEXTN 3/1/4, disable_radix_cache, 8 requests."""
    p = sp.plan(CONFIG, INDEX, MTP_EXAMPLE, gpu_total_mib=A6000)
    assert p["fits"] is True and p["phase"] is None
    assert p["per_gpu"]["max_mamba_cache_size"] == 8 and p["max_running_requests"] == 8
    assert p["per_gpu"]["kv_tokens"] > 300000
    assert p["per_gpu"]["draft_weights_mib"] > 0 and p["per_gpu"]["draft_kv_mib"] > 0


def test_without_speculative_decoding_fits_at_65536():
    p = sp.plan(CONFIG, INDEX, dict(tp=2, context_length=65536, mem_fraction_static=0.85), gpu_total_mib=A6000)
    assert p["fits"] is True and p["per_gpu"]["spec_reservation_mib"] == 0
    assert p["options"]["disable_radix_cache"] is False
    assert 80 <= p["per_gpu"]["max_mamba_cache_size"] <= 100               # ratio mode
    assert p["max_running_requests"] == p["per_gpu"]["max_mamba_cache_size"] // 3
    assert p["per_gpu"]["kv_tokens"] > 200000
    assert "tokens per GPU" in p["reason"] and p["remedy"] == ""


def test_worked_example_of_the_reference():
    """This project's estimate (not measured): 47.2 GiB free before weights, 26.5 GiB weights per rank."""
    free = [47.2 * GIB_MIB]
    weights = int(2 * 26.5 * 2 ** 30)
    weights = {"metadata": {"total_size": weights}, "weight_map": {"model.language_model.embed_tokens.weight": "a"}}   # no mtp.*
    base = dict(tp=2, context_length=65536, context_overhead_mib=0)
    for mf, rest in ((0.85, 13.6), (0.88, 15.0)):
        p = sp.plan(CONFIG, weights, dict(base, mem_fraction_static=mf), gpu_free_mib=free)
        assert p["per_gpu"]["rest_mib"] / GIB_MIB == pytest.approx(rest, abs=0.1)
    p = sp.plan(CONFIG, weights, dict(base, mem_fraction_static=0.85, speculative_algorithm="NEXTN", disable_radix_cache=True), gpu_free_mib=free)
    g = p["per_gpu"]
    assert (g["spec_reservation_mib"] + g["mamba_state_mib"]) / GIB_MIB == pytest.approx(17.2, abs=0.1) and not p["fits"]
    p = sp.plan(CONFIG, weights, dict(base, mem_fraction_static=0.85, speculative_algorithm="NEXTN", max_running_requests=8,
                                      disable_radix_cache=True), gpu_free_mib=free)
    g = p["per_gpu"]
    assert (g["spec_reservation_mib"] + g["mamba_state_mib"]) / GIB_MIB == pytest.approx(2.9, abs=0.05)
    assert g["kv_budget_mib"] / GIB_MIB == pytest.approx(10.7, abs=0.1)
    assert g["kv_tokens"] == pytest.approx(350000, rel=0.02)
    p = sp.plan(CONFIG, weights, dict(base, mem_fraction_static=0.85), gpu_free_mib=free)
    g = p["per_gpu"]
    assert g["mamba_state_mib"] / GIB_MIB == pytest.approx(6.4, abs=0.1)
    assert g["max_mamba_cache_size"] == pytest.approx(90, abs=1)
    assert p["max_running_requests"] <= 30
    assert g["kv_budget_mib"] / GIB_MIB == pytest.approx(7.2, abs=0.1)
    assert g["kv_tokens"] == pytest.approx(235000, rel=0.02)


def test_baseline_memory_and_measured_free_reduce_the_budget():
    a = sp.plan(CONFIG, INDEX, MTP_EXAMPLE, gpu_total_mib=A6000)
    b = sp.plan(CONFIG, INDEX, MTP_EXAMPLE, gpu_total_mib=A6000, gpu_baseline_mib=[0, 2000])
    assert b["per_gpu"]["free_mib"] == a["per_gpu"]["free_mib"] - 2000
    assert b["per_gpu"]["kv_tokens"] < a["per_gpu"]["kv_tokens"]
    c = sp.plan(CONFIG, INDEX, MTP_EXAMPLE, gpu_free_mib=[49140 - 2000, 49140])
    assert c["per_gpu"]["free_mib"] == b["per_gpu"]["free_mib"]
    with pytest.raises(ValueError):
        sp.plan(CONFIG, INDEX, SEED)


def test_draft_tokens_follow_steps_when_topk_is_1():
    p = sp.plan(CONFIG, INDEX, dict(MTP_EXAMPLE, speculative_num_draft_tokens=8), gpu_total_mib=A6000)
    assert p["options"]["speculative_num_draft_tokens"] == 4
    assert any("adjusted to speculative_num_steps + 1" in w for w in p["warnings"])


def test_bf16_ssm_state_halves_the_reservation():
    a = sp.plan(CONFIG, INDEX, dict(SEED, disable_radix_cache=True), gpu_total_mib=A6000)
    b = sp.plan(CONFIG, INDEX, dict(SEED, disable_radix_cache=True, mamba_ssm_dtype="bfloat16"), gpu_total_mib=A6000)
    assert b["per_gpu"]["spec_reservation_mib"] == pytest.approx(a["per_gpu"]["spec_reservation_mib"] * 37.4 / 73.4, rel=0.01)


def test_weights_do_not_fit_on_one_gpu():
    p = sp.plan(CONFIG, INDEX, dict(tp=1, context_length=32768, mem_fraction_static=0.85), gpu_total_mib=[49140])
    assert p["fits"] is False and "do not fit" in p["reason"]
    assert p["suggestions"][0]["flag"] == "--tp-size" and p["suggestions"][0]["value"] >= 2


def test_weights_leave_less_than_the_reserve():
    p = sp.plan(CONFIG, INDEX, dict(tp=2, context_length=32768, mem_fraction_static=0.5), gpu_total_mib=A6000)
    assert p["fits"] is False and "reserve" in p["reason"]
    assert p["suggestions"][0]["flag"] == "--mem-fraction-static" and p["suggestions"][0]["value"] > 0.5


def test_context_too_long_suggests_a_context_length():
    p = sp.plan(CONFIG, INDEX, dict(tp=2, context_length=262144, mem_fraction_static=0.85), gpu_total_mib=A6000)
    assert p["fits"] is False
    sug = dict((s["flag"], s["value"]) for s in p["suggestions"])
    assert sug["--context-length"] < 262144 and sug["--context-length"] % 1024 == 0
    ok = sp.plan(CONFIG, INDEX, dict(tp=2, context_length=sug["--context-length"], mem_fraction_static=0.85), gpu_total_mib=A6000)
    assert ok["fits"] is True


def test_plain_dense_model():
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "hidden_size": 4096, "max_position_embeddings": 8192}
    p = sp.plan(cfg, {"metadata": {"total_size": 16 * 2 ** 30}}, dict(tp=1, mem_fraction_static=0.88), gpu_total_mib=[49140])
    assert p["fits"] is True and p["context_length"] == 8192
    assert p["per_gpu"]["kv_cell_bytes"] == 8 * 256 * 32 * 2 and p["per_gpu"]["mamba_state_mib"] == 0


def test_default_context_is_the_models():
    p = sp.plan(CONFIG, INDEX, dict(tp=2, mem_fraction_static=0.85), gpu_total_mib=A6000)
    assert p["context_length"] == 262144


def test_inputs_are_not_modified():
    opts = copy.deepcopy(SEED)
    sp.plan(CONFIG, INDEX, opts, gpu_total_mib=A6000)
    assert opts == SEED
