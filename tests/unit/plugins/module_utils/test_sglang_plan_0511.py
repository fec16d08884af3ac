"""The memory-fit plan against SGLang 0.5.11's own code, computed here independently of sglang_plan.

Every formula below is written from the sglang-0.5.11 wheel (``pip download --no-deps sglang==0.5.11``); the
comments name the file and lines. The inputs are the kpro5 model (tests/unit/fixtures/qwen3.6-27b) on 2 x RTX A6000.
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan as sp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_rules as rules

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "qwen3.6-27b")
CONFIG = os.path.join(FIX, "config.json")
INDEX = os.path.join(FIX, "model.safetensors.index.json")
A6000 = 49140
NEXTN = dict(tp=2, context_length=65536, mem_fraction_static=0.85, speculative_algorithm="NEXTN", speculative_num_steps=3,
             speculative_eagle_topk=1, speculative_num_draft_tokens=4)


def _cfg():
    with open(CONFIG) as f:
        return json.load(f)


def sglang_0511_tokens(free_gib, weights_gib, mf, tp, max_running_requests, draft_tokens, disable_radix_cache, context_len,
                       mamba_full_memory_ratio=0.9, ssm_itemsize=4, conv_itemsize=2, page_size=1):
    """SGLang 0.5.11's KV pool and request count for Qwen3.6-27B, from its source, in its own units (GiB floats).

    tc: text_config of the fixture (16 full-attention + 48 GDN layers, 4 KV heads x 256, linear 16 x 128 keys, 48 x 128 values,
    conv kernel 4).
    """
    # model_runner.py:1214-1239: pre_model_load_memory = free GiB after distributed init (min over ranks)
    pre_model_load_memory = free_gib
    # model_runner_kv_cache_mixin.py:57-66: post_model_load_memory, rest_memory
    post_model_load_memory = free_gib - weights_gib
    rest_memory = post_model_load_memory - pre_model_load_memory * (1 - mf)
    # configs/mamba_utils.py (Mamba2StateShape for GDN): conv = (conv_dim // tp, kernel - 1), temporal = (v_heads // tp, v_dim, k_dim);
    # mamba_cache_per_req = (conv numel x conv itemsize + temporal numel x ssm itemsize) x len(layers)   (117-127)
    conv_dim = 128 * 48 + 2 * 16 * 128
    conv_numel = (conv_dim // tp) * (4 - 1)
    temporal_numel = (48 // tp) * 128 * 128
    mamba_cache_per_req = (conv_numel * conv_itemsize + temporal_numel * ssm_itemsize) * 48
    # handle_max_mamba_cache (model_runner_kv_cache_mixin.py:72-134)
    if draft_tokens:
        rest_memory -= mamba_cache_per_req * max_running_requests * draft_tokens / (1 << 30)          # 78-95
    if disable_radix_cache and max_running_requests is not None:
        max_mamba_cache_size = max_running_requests                                                     # 103-111
    else:
        raw = rest_memory * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)                    # 118-122
        max_mamba_cache_size = int((raw * (1 << 30)) // mamba_cache_per_req)                           # 124-127
    rest_memory -= max_mamba_cache_size * mamba_cache_per_req / (1 << 30)                              # 129-134
    available_bytes = int(rest_memory * (1 << 30))                                                      # 66
    # pool_configurator.py:158-165 cell_size = kv_heads(tp) x (head_dim + v_head_dim) x full layers x kv itemsize
    cell_size = (4 // tp) * (256 + 256) * 16 * 2
    # pool_configurator.py:190-195
    max_total_num_tokens = available_bytes // cell_size // page_size * page_size
    # model_runner_kv_cache_mixin.py:698-716 (_resolve_max_num_reqs), ratio from 180-192
    estimated = max(min(int(max_total_num_tokens / context_len * 512), 4096), 2048)
    if max_running_requests is not None:
        max_num_reqs = min(max_running_requests, estimated)
    else:
        max_num_reqs = min(estimated, max_total_num_tokens // 2)
    ratio = 1 if disable_radix_cache else 3
    max_num_reqs = min(max_num_reqs, max_mamba_cache_size // ratio)
    return max_total_num_tokens, max_num_reqs, max_mamba_cache_size


def test_nextn_with_the_flag_matches_sglangs_formula():
    """With --disable-radix-cache the NEXTN launch fits and its token count is SGLang's for the same inputs."""
    opts = dict(NEXTN, disable_radix_cache=True, max_running_requests=8)
    p = sp.plan(CONFIG, INDEX, opts, gpu_total_mib=[A6000, A6000], gpu_baseline_mib=[300, 300])
    assert p["fits"] is True and p["phase"] is None
    free_gib = (A6000 - 300 - rules.PRE_WEIGHTS_MIB) / 1024.0
    # the target's weights: the checkpoint less its mtp.* tensors (models/qwen3_5.py:1171 skips them), over tp
    weights_gib = (55600000000 - sp.mtp_checkpoint_bytes(sp.model_geometry(_cfg()), json.load(open(INDEX)))) / 2.0 / (1 << 30)
    tokens, mrr, mamba = sglang_0511_tokens(free_gib, weights_gib, 0.85, 2, 8, 4, True, 65536)
    assert p["per_gpu"]["kv_tokens"] == tokens and p["max_running_requests"] == mrr == 8 and p["per_gpu"]["max_mamba_cache_size"] == mamba
    # and without the flag SGLang would not get that far: the plan refuses, naming it
    q = sp.plan(CONFIG, INDEX, dict(opts, disable_radix_cache=False), gpu_total_mib=[A6000, A6000], gpu_baseline_mib=[300, 300])
    assert q["fits"] is False and q["phase"] == "init_failed_before_gpu" and "--disable-radix-cache" in q["remedy"]
    assert q["per_gpu"]["kv_tokens"] == tokens          # the numbers shown are those of the launch with the flag


@pytest.mark.parametrize("mf,mrr,radix_off", [(0.85, None, False), (0.88, None, True), (0.80, 24, False), (0.85, 4096, False)])
def test_without_speculative_decoding_matches_sglangs_formula(mf, mrr, radix_off):
    """The radix-cache ratio (3), the estimate cap and tokens // 2 of _resolve_max_num_reqs, as SGLang computes them."""
    opts = dict(tp=2, context_length=65536, mem_fraction_static=mf, max_running_requests=mrr, disable_radix_cache=radix_off)
    p = sp.plan(CONFIG, INDEX, opts, gpu_total_mib=[A6000, A6000])
    free_gib = (A6000 - rules.PRE_WEIGHTS_MIB) / 1024.0
    weights_gib = (55600000000 - sp.mtp_checkpoint_bytes(sp.model_geometry(_cfg()), json.load(open(INDEX)))) / 2.0 / (1 << 30)
    tokens, want_mrr, mamba = sglang_0511_tokens(free_gib, weights_gib, mf, 2, mrr, 0, radix_off, 65536)
    assert (p["per_gpu"]["kv_tokens"], p["max_running_requests"], p["per_gpu"]["max_mamba_cache_size"]) == (tokens, want_mrr, mamba)


def test_mtp_tensors_count_where_sglang_loads_them():
    geo = sp.model_geometry(_cfg())
    index = json.load(open(INDEX))
    mtp = sp.mtp_checkpoint_bytes(geo, index)
    assert mtp == geo["mtp_params"] * 2 and 800 * 2 ** 20 < mtp < 900 * 2 ** 20
    p = sp.plan(CONFIG, INDEX, dict(NEXTN, disable_radix_cache=True, max_running_requests=8), gpu_total_mib=[A6000, A6000])
    assert p["per_gpu"]["weights_mib"] == round((55600000000 - mtp) / 2.0 / 2 ** 20)
    assert p["per_gpu"]["mtp_weights_mib"] == round(mtp / 2.0 ** 20)
    # the draft worker holds them: the layer split over tp, fc (a plain nn.Linear, qwen3_5_mtp.py:69) and the norms on every rank
    h = 5120
    assert p["per_gpu"]["draft_weights_mib"] == round(((geo["mtp_params"] - 2 * h * h - 3 * h - 2 * h - 2 * 256) / 2.0 + 2 * h * h + 3 * h
                                                       + 2 * h + 2 * 256) * 2 / 2.0 ** 20)
    # without speculative decoding nobody loads them; a checkpoint without an MTP head has none to leave out
    q = sp.plan(CONFIG, INDEX, dict(tp=2, context_length=65536, mem_fraction_static=0.85), gpu_total_mib=[A6000, A6000])
    assert q["per_gpu"]["weights_mib"] == p["per_gpu"]["weights_mib"] and q["per_gpu"]["draft_weights_mib"] == 0
    no_head = {"metadata": {"total_size": 55600000000}, "weight_map": {"lm_head.weight": "a"}}
    assert sp.mtp_checkpoint_bytes(geo, no_head) == 0
    llama = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 1024,
             "num_nextn_predict_layers": 1}
    assert sp.mtp_checkpoint_bytes(sp.model_geometry(llama), index) == 0


@pytest.mark.parametrize("algo", ["NEXTN", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH"])
def test_48_requests_for_every_speculative_algorithm(algo):
    """server_args.py:3430-3434 (DFLASH), 3454-3458 (EAGLE/EAGLE3/STANDALONE), 3563-3567 (NGRAM); NEXTN is EAGLE (3310-3311)."""
    o = sp.resolve_options(dict(tp=2, speculative_algorithm=algo, disable_radix_cache=True), sp.model_geometry(_cfg()))
    assert o["max_running_requests"] == 48
    assert sp.resolve_options(dict(tp=2, speculative_algorithm=algo, max_running_requests=5), sp.model_geometry(_cfg()))["max_running_requests"] == 5
    if algo == "NGRAM":
        assert o["speculative_num_draft_tokens"] == 12      # 3570-3575


def test_mamba_ssm_dtype_from_the_environment():
    """SGLANG_MAMBA_SSM_DTYPE wins over the config, --mamba-ssm-dtype over both (configs/mamba_utils.py:69-103,
    server_args.py:3924-3925); an unknown value falls back to float32."""
    opts = dict(NEXTN, disable_radix_cache=True, max_running_requests=8)
    base = sp.plan(CONFIG, INDEX, opts, gpu_total_mib=[A6000, A6000])
    env = sp.plan(CONFIG, INDEX, opts, gpu_total_mib=[A6000, A6000], environment={"SGLANG_MAMBA_SSM_DTYPE": "bfloat16"})
    assert base["options"]["mamba_ssm_dtype"] == "float32" and env["options"]["mamba_ssm_dtype"] == "bfloat16"
    assert env["per_gpu"]["mamba_cache_per_req_mib"] == pytest.approx(37.4, abs=0.1) and env["per_gpu"]["kv_tokens"] > base["per_gpu"]["kv_tokens"]
    flag = sp.plan(CONFIG, INDEX, dict(opts, mamba_ssm_dtype="float32"), gpu_total_mib=[A6000, A6000],
                   environment={"SGLANG_MAMBA_SSM_DTYPE": "bfloat16"})
    assert flag["options"]["mamba_ssm_dtype"] == "float32"
    bad = sp.plan(CONFIG, INDEX, opts, gpu_total_mib=[A6000, A6000], environment={"SGLANG_MAMBA_SSM_DTYPE": "fp8"})
    assert bad["options"]["mamba_ssm_dtype"] == "float32" and any("fp8" in w for w in bad["warnings"])
    tokens, _mrr, _m = sglang_0511_tokens((A6000 - rules.PRE_WEIGHTS_MIB) / 1024.0, env["per_gpu"]["weights_mib"] / 1024.0, 0.85, 2, 8, 4,
                                          True, 65536, ssm_itemsize=2)
    assert abs(env["per_gpu"]["kv_tokens"] - tokens) < 64     # weights_mib is rounded to the MiB here


def test_default_mem_fraction_reserves_4096_for_speculative_decoding():
    """server_args.py:1434-1484: reserved = 512 + 4096 x 1.5 + 32 x 2 + 2/8 x 1024 (+ 4096 for an EAGLE draft), then x 0.95 x the
    ViT factor (adjust_mem_fraction_for_vlm, 7137-7173; 27 blocks are not read, num_hidden_layers defaults to 24)."""
    vit = 0.95 * (1.0 - 0.1 * (24 * 1152 * 1152 / (24.0 * 1024 * 1024) - 1.0))
    plain = sp.plan(CONFIG, INDEX, dict(tp=2, context_length=65536), gpu_total_mib=[A6000, A6000])
    spec = sp.plan(CONFIG, INDEX, dict(tp=2, context_length=65536, speculative_algorithm="NEXTN", disable_radix_cache=True),
                   gpu_total_mib=[A6000, A6000])
    assert plain["options"]["mem_fraction_static"] == pytest.approx(round((A6000 - 6976.0) / A6000, 3) * vit)
    assert spec["options"]["mem_fraction_static"] == pytest.approx(round((A6000 - 6976.0 - 4096) / A6000, 3) * vit)
    # a text-only model keeps its piecewise CUDA graphs: 50 sizes up to 4096 tokens, 8 MiB each (1456-1463, 1550-1568)
    dense = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "max_position_embeddings": 8192}
    d = sp.plan(dense, 16 * 2 ** 30, dict(tp=1, speculative_algorithm="EAGLE"), gpu_total_mib=[A6000])
    assert d["options"]["mem_fraction_static"] == round((A6000 - (512 + 6144 + 64 + 128 + 400 + 4096)) / float(A6000), 3)


def test_tp_size_is_read_as_tp():
    p = sp.plan(CONFIG, INDEX, dict(tp_size=2, context_length=65536, mem_fraction_static=0.85), gpu_total_mib=[A6000, A6000])
    assert p["options"]["tp"] == 2 and p["fits"] is True


def test_max_running_requests_rules():
    assert rules.max_running_requests(10000, 65536, None) == 2048 // 1 and rules.max_running_requests(1000, 65536, None) == 500
    assert rules.max_running_requests(10 ** 7, 1024, 9000) == 4096
    assert rules.max_running_requests(400000, 65536, None, mamba_cache_size=96, ratio=3) == 32
    assert rules.mamba_ratio({"disable_radix_cache": True}) == 1
    assert rules.mamba_ratio({"mamba_scheduler_strategy": "extra_buffer", "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1}) == 5
    assert rules.mamba_ratio({"mamba_scheduler_strategy": "extra_buffer", "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1},
                             {"SGLANG_ENABLE_SPEC_V2": "0"}) == 4
