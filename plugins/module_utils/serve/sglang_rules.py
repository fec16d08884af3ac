# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang 0.5.11's own start-up decisions that the memory-fit plan (sglang_plan.py) needs.

Each rule cites the file and line of the sglang-0.5.11 wheel (``sglang/srt/...``) it follows, and says
where 0.5.9 differed. Standard library only; runs on the target's Python 3.9+.
"""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_options import flag
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan_versions as pv

# The memory one SGLang rank uses before its weights load (CUDA context + torch init + NCCL and the custom
# all-reduce buffers), per GPU, counted from NVML's memory.total: free before weights = total - baseline - this.
# The lab's SGLang stand-in allocates the same amount (tests/lab/sglang_standin/.../memory.py PRE_WEIGHTS_MIB;
# tests/unit/lab/test_sglang_standin.py checks that both agree). No real `Load weight begin. avail mem=` line of
# an RTX A6000 was found in the public issues and pages searched; 800 MiB is this project's estimate (about
# 47.2 GiB free before weights on a 49140 MiB A6000), not a measurement. SGLang measures the value as
# pre_model_load_memory, the minimum over the ranks, at the end of init_torch_distributed (model_runner.py:
# 1214-1219); `Load weight begin. avail mem=` (1289-1291) prints the rank's own. Replace it by a measured or
# published value for this GPU class when one is at hand.
PRE_WEIGHTS_MIB = 800

# server_args.py:2138-2296 (_handle_model_specific_adjustments): the hybrid (linear attention / mamba)
# architectures that call _handle_mamba_radix_cache with support_mamba_cache=True. GraniteMoeHybrid only
# when its layer_types has a "mamba" layer (2279-2290).
MAMBA_RADIX_ARCHS = frozenset([
    "NemotronHForCausalLM",                                                                        # 2143, 2174
    "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",  # 2213, 2236
    "FalconH1ForCausalLM", "JetNemotronForCausalLM", "JetVLMForConditionalGeneration",             # 2267, 2272
    "Lfm2ForCausalLM",                                                                             # 2292
])
GRANITE_HYBRID = "GraniteMoeHybridForCausalLM"

# server_args.py:2453-2456, raised by ServerArgs.__post_init__ -> _handle_model_specific_adjustments
# (server_args.py:845), before _handle_speculative_decoding (882) rewrites NEXTN to EAGLE. The two literals are
# concatenated without a space in the source, hence "no_buffer.To use". 0.5.9 logged "Disabling radix cache since
# speculative decoding for ... is not supported with radix cache yet." and went on (0.5.9 server_args.py:1762).
SPEC_RADIX_ERROR = ("Speculative decoding for %s is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
                    "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set "
                    "SGLANG_ENABLE_SPEC_V2=1.")
# server_args.py:2397-2401: extra_buffer together with --disable-radix-cache
EXTRA_BUFFER_ERROR = ("mamba extra_buffer is not compatible with --disable-radix-cache Overlap scheduling is already supported "
                      "with no_buffer + disable_radix_cache. Please use --mamba-scheduler-strategy no_buffer instead.")

# Speculative algorithms whose max_running_requests defaults to 48 (server_args.py:3430-3434 DFLASH,
# 3454-3458 EAGLE/EAGLE3/STANDALONE, 3563-3567 NGRAM; NEXTN is EAGLE since 3310-3311). 0.5.9: EAGLE, EAGLE3,
# STANDALONE and NGRAM (0.5.9 server_args.py:2363, 2468).
SPEC_MRR_48 = frozenset(["EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "NEXTN"])
SPEC_DEFAULT_MRR = 48

# model_runner_kv_cache_mixin.py:45-47
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP = 2
MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP = 1

# configs/mamba_utils.py:63-67 (dtype_map) and environ.py:484-485
_MAMBA_DTYPES = ("float32", "bfloat16", "float16")

# Loaders that skip every tensor whose name contains "mtp" for the target model (models/qwen3_5.py:1171, 1314,
# 1517, 1764; models/qwen3_next.py:1076): those tensors are loaded by the draft worker
# (models/qwen3_5_mtp.py:253) when speculative decoding is on, and not at all otherwise.
MTP_SKIPPING_ARCHS = frozenset([
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
    "Qwen3NextForCausalLM",
])


def is_mamba_radix_model(geo):
    """Whether SGLang 0.5.11 runs its mamba radix-cache rules for this model (server_args.py:2138-2296)."""
    arch = geo.get("architecture")
    if arch == GRANITE_HYBRID:
        return "mamba" in (geo.get("layer_types") or [])
    return arch in MAMBA_RADIX_ARCHS


def startup_refusal(geo, o, environment=None, version=None):
    """The ValueError SGLang 0.5.11 raises while parsing its arguments for this configuration, or None.

    _handle_mamba_radix_cache (server_args.py:2366-2456): for a hybrid model, extra_buffer with
    --disable-radix-cache is refused (2395-2401); with no_buffer (the default, "auto" -> no_buffer at 1079-1082) and
    the radix cache on, any --speculative-algorithm is refused on CUDA (2440-2456; ROCm disables the radix cache
    instead, 2443-2450). Returns dict(error, flags: [(flag, value, effect)]), the flags SGLang ``version``'s.
    """
    if not is_mamba_radix_model(geo) or pv.has(pv.resolve(version)[0], "mamba_auto_extra_buffer"):
        return None     # 0.5.14 dropped both ValueErrors (sglang_plan_versions.SINCE)
    strategy = str(o.get("mamba_scheduler_strategy") or "auto")
    strategy_flag = flag("mamba_scheduler_strategy", version)
    radix_off = bool(o.get("disable_radix_cache"))
    if strategy == "extra_buffer":
        if radix_off:
            return {"error": EXTRA_BUFFER_ERROR,
                    "flags": [(strategy_flag, "no_buffer", "keeps --disable-radix-cache")]}
        return None
    if radix_off or not o.get("_spec_given"):
        return None
    return {"error": SPEC_RADIX_ERROR % geo.get("architecture"),
            "flags": [("--disable-radix-cache", True, "speculative decoding without prefix caching (SGLang 0.5.9 did this by itself)"),
                      (strategy_flag, "extra_buffer",
                       "keeps the radix cache; with SGLANG_ENABLE_SPEC_V2=1 in the server's environment")]}


def mamba_state_dtypes(o, config_ssm_dtype, environment=None):
    """(ssm dtype, conv dtype, notes) of the GDN/mamba state, as SGLang 0.5.11 picks them.

    --mamba-ssm-dtype is exported as SGLANG_MAMBA_SSM_DTYPE (server_args.py:3924-3925); the environment
    variable wins over the config's mamba_ssm_dtype, which wins over float32; an unknown value falls back
    to float32 (configs/mamba_utils.py:69-103). The conv state is SGLANG_MAMBA_CONV_DTYPE, default bfloat16
    (mamba_utils.py:68, environ.py:484).
    """
    env = environment or {}
    notes = []
    ssm = "float32"
    if config_ssm_dtype is not None:
        if config_ssm_dtype in _MAMBA_DTYPES:
            ssm = config_ssm_dtype
        else:
            notes.append("config mamba_ssm_dtype %r is not one of %s: SGLang uses float32" % (config_ssm_dtype, ", ".join(_MAMBA_DTYPES)))
    wanted = o.get("mamba_ssm_dtype") or env.get("SGLANG_MAMBA_SSM_DTYPE")
    if wanted:
        if wanted in _MAMBA_DTYPES:
            ssm = wanted
        else:
            notes.append("mamba_ssm_dtype %r is not one of %s: SGLang uses float32" % (wanted, ", ".join(_MAMBA_DTYPES)))
            ssm = "float32"
    conv = env.get("SGLANG_MAMBA_CONV_DTYPE") or "bfloat16"
    if conv not in _MAMBA_DTYPES:
        conv = "bfloat16"
    return ssm, conv, notes


def env_true(environment, name, default):
    """environ.py EnvBool: "1"/"true"/"yes"/"on" (any case) are true."""
    v = (environment or {}).get(name)
    if v is None:
        return default
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def overlap_schedule(o, environment=None):
    """Whether the overlap scheduler stays on (it only matters for the mamba ratio with extra_buffer).

    Speculative EAGLE/EAGLE3/STANDALONE: off with topk > 1 or SGLANG_ENABLE_SPEC_V2 false (server_args.py:3461-3473;
    the variable defaults to True in 0.5.11, environ.py:459, False in 0.5.9). NGRAM and DFLASH turn it off
    (3436, 3569). Without speculative decoding, no_buffer with the radix cache turns it off (2427-2432).
    """
    if o.get("disable_overlap_schedule"):
        return False
    spec = o.get("speculative_algorithm")
    if spec in ("NGRAM", "DFLASH"):
        return False
    if spec:
        return int(o.get("speculative_eagle_topk") or 1) == 1 and env_true(environment, "SGLANG_ENABLE_SPEC_V2", True)
    return o.get("mamba_scheduler_strategy") == "extra_buffer" or bool(o.get("disable_radix_cache"))


def mamba_ratio(o, environment=None):
    """max_mamba_cache_size // ratio caps the requests: model_runner_kv_cache_mixin.py:180-192 (_calculate_mamba_ratio)."""
    if o.get("disable_radix_cache"):
        return 1
    extra = 0
    if o.get("mamba_scheduler_strategy") == "extra_buffer":
        extra = MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP if overlap_schedule(o, environment) else MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP
    return MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO + extra


def max_running_requests(token_capacity, context_len, requested, mamba_cache_size=None, ratio=1):
    """model_runner_kv_cache_mixin.py:698-716 (_resolve_max_num_reqs), which tp_worker.py:296 takes as is.

    estimated = clamp(int(tokens / context_len * 512), 2048, 4096); a requested value is capped by it, else
    min(estimated, tokens // 2); a hybrid model's value is then capped by max_mamba_cache_size // ratio.
    (0.5.9 took a requested value as is and did not halve the tokens: 0.5.9 model_runner_kv_cache_mixin.py:340-368.)
    """
    estimated = int(token_capacity / float(context_len) * 512) if context_len else 4096
    estimated = max(min(estimated, 4096), 2048)
    if requested is not None:
        n = min(int(requested), estimated)
    else:
        n = min(estimated, int(token_capacity) // 2)
    if mamba_cache_size is not None:
        n = min(n, int(mamba_cache_size) // ratio)
    return n


def tier_defaults(gpu_mem_mib, tp, version=pv.BASE):
    """(chunked_prefill_size, cuda_graph_max_bs) by GPU memory: server_args.py:1318-1377 (the 20-35 GiB tier from 0.5.20:
    sglang_plan_versions.SINCE)."""
    g = gpu_mem_mib
    if g < 20 * 1024:
        return 2048, 8
    if g < 35 * 1024:
        if pv.has(version, "small_tier_4k"):
            return 4096, (48 if tp < 4 else 160)
        return 2048, (24 if tp < 4 else 80)
    if g < 60 * 1024:
        return 4096, (32 if tp < 4 else 160)
    if g < 160 * 1024:
        return 8192, (256 if tp < 4 else 512)
    return 16384, 512


def piecewise_graph_tokens(max_tokens):
    """len(_generate_piecewise_cuda_graph_tokens()) (server_args.py:1550-1568)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return len([s for s in sizes if s <= max_tokens])


def default_mem_fraction_static(gpu_mem_mib, o, geo, version=pv.BASE):
    """SGLang 0.5.11's mem_fraction_static when none is given (server_args.py:1434-1484).

    reserved MiB = 512 + max(chunked_prefill_size, 2048) x 1.5 + cuda_graph_max_bs x 2 + tp x pp / 8 x 1024
    (+ 8 per piecewise CUDA graph size unless disabled, 1456-1463; at least 10 GiB above 60 GiB cards, 1465-1466)
    + 4096 for EAGLE/EAGLE3/NEXTN/DFLASH draft models and graphs, 6144 for STANDALONE, 0 for NGRAM (1468-1475; 0.5.9 added
    2048, 0.5.9 server_args.py:1057); mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3), then x 0.95 x the
    ViT factor for multimodal models (1481-1482, adjust_mem_fraction_for_vlm 7137-7173, not rounded).
    ``version`` (sglang_plan_versions.resolve) keys the tiers, the graph size cap and the draft reserve.
    """
    tp, pp = int(o.get("tp") or 1), int(o.get("pp_size") or 1)
    chunk_d, bs_d = tier_defaults(gpu_mem_mib, tp, version)
    if pv.has(version, "graph_bs_capped_by_mrr") and o.get("_mrr_given"):
        bs_d = min(bs_d, int(o["_mrr_given"]))
    chunked = int(o.get("chunked_prefill_size") or chunk_d)
    graph_bs = int(o.get("cuda_graph_max_bs") or bs_d)
    reserved = 512.0 + max(chunked, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8.0 * 1024
    # piecewise CUDA graphs are off for multimodal models, pp > 1, torch.compile or when disabled (1194-1230); their sizes
    # stop at chunked_prefill_size, or at max_total_tokens when that is smaller (1407-1420)
    if not (geo.get("is_multimodal") or pp > 1 or o.get("enable_torch_compile") or o.get("disable_piecewise_cuda_graph")):
        reserved += piecewise_graph_tokens(min(chunked, int(o.get("max_total_tokens") or chunked))) * 8
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    spec = None if pv.has(version, "no_spec_reserve") else o.get("speculative_algorithm")
    if spec == "STANDALONE":
        reserved += 6 * 1024
    elif spec and spec != "NGRAM":
        reserved += 4 * 1024
    mf = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    if geo.get("is_multimodal"):
        layers, hidden = geo.get("vit_layers") or 24, geo.get("vit_hidden") or 1024
        factor = 1.0 - 0.1 * (layers * hidden * hidden / (24.0 * 1024 * 1024) - 1.0)
        mf = mf * 0.95 * max(0.8, min(1.05, factor))
    return mf


def mtp_param_count(tc):
    """Parameters of the checkpoint's mtp.* tensors for a Qwen3.5/3.6-style MTP head (models/qwen3_5_mtp.py:69-83).

    fc (2h x h), two pre-fc norms, one full-attention decoder layer (q with the output gate, k, v, o, q/k norms,
    two layer norms), its MLP (dense, or the MoE experts + shared expert) and the final norm; embed_tokens and
    lm_head are the target's (set_embed_and_head, qwen3_5_mtp.py:110-117) unless mtp_use_dedicated_embeddings.
    """
    n = int(tc.get("mtp_num_hidden_layers") or tc.get("num_nextn_predict_layers") or 0)
    if not n:
        return 0
    h = int(tc.get("hidden_size") or 0)
    heads = int(tc.get("num_attention_heads") or 0)
    kv = int(tc.get("num_key_value_heads") or heads)
    hd = int(tc.get("head_dim") or (h // heads if heads else 0))
    q_out = heads * hd * (2 if tc.get("attn_output_gate", True) else 1)
    attn = h * q_out + 2 * h * kv * hd + heads * hd * h + 2 * hd + 2 * h
    experts = int(tc.get("num_experts") or 0)
    if experts:
        moe = int(tc.get("moe_intermediate_size") or 0)
        shared = int(tc.get("shared_expert_intermediate_size") or 0)
        mlp = experts * 3 * h * moe + h * experts + 3 * h * shared + h
    else:
        mlp = 3 * h * int(tc.get("intermediate_size") or 0)
    per_layer = attn + mlp
    head = 2 * h * h + 2 * h + h
    emb = int(tc.get("vocab_size") or 0) * h if tc.get("mtp_use_dedicated_embeddings") else 0
    return n * per_layer + head + emb
