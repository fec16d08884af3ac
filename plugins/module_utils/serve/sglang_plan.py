# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory-fit plan for an SGLang launch, before the launch.

Follows SGLang 0.5.11's own sizing (sglang-0.5.11 wheel; 0.5.9: profile_max_num_token and handle_max_mamba_cache,
sglang-0.5.9 wheel model_executor/model_runner_kv_cache_mixin.py:116-210),
per TP rank:

    free        = free GPU memory after distributed init (card total - baseline use - PRE_WEIGHTS_MIB)
                  ("pre_model_load_memory", model_executor/model_runner.py:1214-1239)
    weights     = (safetensors total_size - the mtp.* tensors) / tp   (Qwen3.5's loader skips mtp.* for the target,
                  models/qwen3_5.py:1171; the draft worker loads them); with pp_size > 1 the largest pipeline
                  stage's share (stage_sizes), x the bytes of an explicit --dtype over the checkpoint's
    available   = free - weights                              # "Load weight end. avail mem"
    rest        = available - free * (1 - mem_fraction_static)           (model_runner_kv_cache_mixin.py:56-70)
    rest       -= mamba_cache_per_req * max_running_requests * draft_tokens   (speculative decoding, 78-95)
    rest       -= max_mamba_cache_size * mamba_cache_per_req                   (GDN/mamba state pool, 97-134)
    kv_tokens   = rest // kv_cell_bytes // page * page         (pool_configurator.py:170-181; the cell counts the
                                                                full-attention layers of the largest stage)
    kv_tokens   = min(kv_tokens, max_total_tokens)              (model_runner_kv_cache_mixin.py:668-691)
    max_running_requests = _resolve_max_num_reqs                (model_runner_kv_cache_mixin.py:698-716)

and the launch fits when ``kv_tokens >= context_length`` (one full-length request). Which options it reads, and
their SGLang defaults: the option table (sglang_options.py, its "sized" rows). Before any of this, the
start-up refusals of SGLang's argument parsing are checked (sglang_rules.startup_refusal): 0.5.10+ refuses
speculative decoding on a hybrid model with the radix cache on. The draft model's weights, its one-layer KV pool
and the CUDA graphs come out of the ``(1 - mem_fraction_static)`` reserve afterwards; the plan reports them as
warnings.

Standard library only; runs on the target's Python 3.9+.
"""

from __future__ import annotations

import json
import math

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_options
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan_versions as pv
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_rules as rules

MIB = 1 << 20
GIB = 1 << 30

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "auto": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

# SGLang's defaults of the options the plan computes with (the option table's "sized" rows, by SGLang's names), and the
# plan's own: tp (tp_size's value), the memory one rank holds before its weights.
DEFAULTS = dict(sglang_options.plan_defaults(), tp=1, context_overhead_mib=rules.PRE_WEIGHTS_MIB)
DEFAULTS.pop("tp_size")

# the options plan() understands (sglang_unit.plan_options passes SGLang's own names through)
PLAN_OPTIONS = tuple(sorted(DEFAULTS))


def load_json(path):
    with open(path) as f:
        return json.load(f)


def text_config(config):
    """The language-model part of a config (Qwen3_5ForConditionalGeneration nests it under text_config)."""
    tc = config.get("text_config")
    if isinstance(tc, dict) and tc:
        merged = dict(config)
        merged.update(tc)
        return merged
    return config


def architecture(config):
    archs = config.get("architectures") or []
    return archs[0] if archs else None


def _layer_kinds(tc):
    """(full-attention layer ids, number of linear-attention layers) of a hybrid (GDN/mamba) or plain model."""
    n = int(tc.get("num_hidden_layers") or 0)
    types = tc.get("layer_types")
    if isinstance(types, list) and types:
        full = [i for i, t in enumerate(types) if t in ("full_attention", "attention", "sliding_attention")]
        linear = sum(1 for t in types if t in ("linear_attention", "mamba", "gated_delta_net"))
        return full, linear
    interval = tc.get("full_attention_interval")
    if interval and ("linear_num_value_heads" in tc or "linear_num_key_heads" in tc):
        interval = int(interval)
        full = [i for i in range(n) if (i + 1) % interval == 0]
        return full, n - len(full)
    return list(range(n)), 0


def _vision_params(vision):
    """About the parameters of a ViT tower (attention 4h^2 + MLP 2h x intermediate per block, the patch merger), the
    part of the checkpoint that every pipeline stage holds (models/qwen3_vl.py:1099, built on every rank)."""
    if not vision:
        return 0
    h, inter = int(vision.get("hidden_size") or 0), int(vision.get("intermediate_size") or 0)
    depth = int(vision.get("depth") or vision.get("num_hidden_layers") or 0)
    merged = h * int(vision.get("spatial_merge_size") or 2) ** 2
    return depth * (4 * h * h + 2 * h * inter) + merged * merged + merged * int(vision.get("out_hidden_size") or h)


def model_geometry(config):
    """The numbers the sizing needs, from config.json (nested text_config handled)."""
    tc = text_config(config)
    full_ids, linear = _layer_kinds(tc)
    heads = int(tc.get("num_attention_heads") or 0)
    hidden = int(tc.get("hidden_size") or 0)
    head_dim = int(tc.get("head_dim") or (hidden // heads if heads else 0))
    arch = architecture(config)
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else None
    geo = {
        "architecture": arch,
        "model_type": config.get("model_type"),
        "layer_types": list(tc.get("layer_types") or []),
        "num_hidden_layers": int(tc.get("num_hidden_layers") or 0),
        "full_attention_layers": len(full_ids),
        "full_attention_ids": full_ids,
        "linear_attention_layers": linear,
        "num_attention_heads": heads,
        "num_key_value_heads": int(tc.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "v_head_dim": int(tc.get("v_head_dim") or head_dim),
        "hidden_size": hidden,
        "intermediate_size": int(tc.get("intermediate_size") or 0),
        "max_position_embeddings": tc.get("max_position_embeddings"),
        "mamba_ssm_dtype": tc.get("mamba_ssm_dtype"),
        "mtp_num_hidden_layers": int(tc.get("mtp_num_hidden_layers") or tc.get("num_nextn_predict_layers") or 0),
        "mtp_params": rules.mtp_param_count(tc),
        "torch_dtype": tc.get("torch_dtype") or tc.get("dtype") or config.get("torch_dtype"),
        # multimodal as the stand-in and SGLang's default-memory rule see it (a vision tower + *ForConditionalGeneration)
        "is_multimodal": bool(vision) and str(arch or "").endswith("ForConditionalGeneration"),
        "vit_layers": int((vision or {}).get("num_hidden_layers") or 24),
        "vit_hidden": int((vision or {}).get("hidden_size") or 1024),
        "vocab_size": int(tc.get("vocab_size") or 0),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", tc.get("tie_word_embeddings", True))),  # HF's default: tied
        "vision_params": _vision_params(vision),
    }
    if linear:
        geo.update({
            "linear_num_key_heads": int(tc.get("linear_num_key_heads") or 0),
            "linear_num_value_heads": int(tc.get("linear_num_value_heads") or 0),
            "linear_key_head_dim": int(tc.get("linear_key_head_dim") or 0),
            "linear_value_head_dim": int(tc.get("linear_value_head_dim") or 0),
            "linear_conv_kernel_dim": int(tc.get("linear_conv_kernel_dim") or 4),
        })
    return geo


def kv_cell_bytes(geo, tp, kv_dtype_bytes, layers=None):
    """Bytes of KV cache per token per rank: kv_heads/tp x (head_dim + v_head_dim) x full-attention layers x dtype
    (pool_configurator.py:158-165)."""
    kv_heads = max(1, geo["num_key_value_heads"] // tp)
    layers = geo["full_attention_layers"] if layers is None else layers
    return kv_heads * (geo["head_dim"] + geo["v_head_dim"]) * layers * kv_dtype_bytes


def mamba_cache_per_req_bytes(geo, tp, ssm_bytes=4, conv_bytes=2):
    """GDN/mamba state of one request per rank: conv state + temporal (SSM) state over the linear layers
    (configs/mamba_utils.py:117-127 mamba_cache_per_req)."""
    if not geo.get("linear_attention_layers"):
        return 0
    conv_dim = geo["linear_value_head_dim"] * geo["linear_num_value_heads"] + 2 * geo["linear_num_key_heads"] * geo["linear_key_head_dim"]
    conv = (conv_dim // tp) * (geo["linear_conv_kernel_dim"] - 1) * conv_bytes
    temporal = (geo["linear_num_value_heads"] // tp) * geo["linear_value_head_dim"] * geo["linear_key_head_dim"] * ssm_bytes
    return (conv + temporal) * geo["linear_attention_layers"]


def mtp_checkpoint_bytes(geo, index=None):
    """Bytes of the checkpoint's mtp.* tensors that the target model's loader skips (0 for other architectures)."""
    if geo.get("architecture") not in rules.MTP_SKIPPING_ARCHS or not geo.get("mtp_params"):
        return 0
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if isinstance(wm, dict) and wm and not any("mtp" in name for name in wm):
        return 0    # a checkpoint without its MTP head
    return geo["mtp_params"] * _dtype_bytes(geo.get("torch_dtype"), 2)


def draft_weights_bytes(geo, dtype_bytes=2, tp=1):
    """The MTP draft's own weights per rank, as qwen3_5_mtp.py builds them: fc (an nn.Linear, 69) and the norms on
    every rank, the decoder layer's projections split over tp; embed_tokens and lm_head are the target's."""
    total = geo.get("mtp_params") or 0
    if not total:
        return 0
    h, hd = geo["hidden_size"], geo["head_dim"]
    replicated = 2 * h * h + 3 * h + geo["mtp_num_hidden_layers"] * (2 * h + 2 * hd)
    return ((total - replicated) / float(tp) + replicated) * dtype_bytes


def weights_total_bytes(index):
    """metadata.total_size of model.safetensors.index.json (dict or path)."""
    if isinstance(index, str):
        index = load_json(index)
    if isinstance(index, (int, float)):
        return int(index)
    return int((index.get("metadata") or {}).get("total_size") or 0)


def pp_stages(num_layers, pp):
    """[(start, end)] of the decoder layers of each pipeline stage, as get_pp_indices splits them
    (distributed/utils.py:99-135, without SGLANG_PP_LAYER_PARTITION): the last num_layers % pp stages get one more."""
    base, extra = divmod(int(num_layers), int(pp))
    out, start = [], 0
    for rank in range(int(pp)):
        n = base + (1 if rank >= pp - extra else 0)
        out.append((start, start + n))
        start += n
    return out


def _head_in_checkpoint(geo, index):
    """Whether the checkpoint holds an LM head of its own (its tensor names say so; else not tie_word_embeddings)."""
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if isinstance(wm, dict) and wm:
        return any(name.endswith("lm_head.weight") for name in wm)
    return not geo.get("tie_word_embeddings", True)


def stage_sizes(geo, weights, index, pp):
    """(weights bytes, KV layers) of the pipeline stage that holds the most of each; (weights, all) with pp 1.

    A stage holds its decoder layers (their share of the checkpoint less the embedding, the LM head and the vision
    tower), the vision tower (every rank, models/qwen3_vl.py:1099), the embedding on the first stage
    (models/qwen3_5.py:1019-1027) and an LM head on the last (its own with pp > 1 even when tied, qwen3_vl.py:1129-1145);
    its KV cells count its own full-attention layers (pool_configurator.py:83-91)."""
    if pp <= 1:
        return weights, geo["full_attention_layers"]
    ckpt = _dtype_bytes(geo.get("torch_dtype"), 2)
    emb = geo["vocab_size"] * geo["hidden_size"] * ckpt
    vit = geo["vision_params"] * ckpt
    body = max(0.0, weights - emb - vit - (emb if _head_in_checkpoint(geo, index) else 0))
    per_layer = body / float(max(1, geo["num_hidden_layers"]))
    stages = pp_stages(geo["num_hidden_layers"], pp)
    sizes = [(end - start) * per_layer + vit + (emb if r == 0 else 0) + (emb if r == pp - 1 else 0)
             for r, (start, end) in enumerate(stages)]
    kv = [len([i for i in geo["full_attention_ids"] if start <= i < end]) for start, end in stages]
    return max(sizes), max(kv)


def _dtype_bytes(name, default):
    if name is None:
        return default
    return _DTYPE_BYTES.get(str(name).lower().replace("torch.", ""), default)


def _mib(b):
    return int(round(b / MIB))


def _speculative_defaults(o, geo, notes):
    """steps / topk / draft tokens and max_running_requests as _handle_speculative_decoding sets them
    (server_args.py:3286-3570)."""
    spec = o["speculative_algorithm"]
    steps, topk, ndt = o.get("speculative_num_steps"), o.get("speculative_eagle_topk"), o.get("speculative_num_draft_tokens")
    if spec == "NGRAM":
        # 3557-3579: topk follows --speculative-ngram-max-bfs-breadth, draft tokens default to 12
        topk = int(o.get("speculative_ngram_max_bfs_breadth") or 1)
        ndt = 12 if ndt is None else int(ndt)
    else:
        if steps is None:
            # 3520-3528: auto_choose_speculative_params (7471-7506): (5, 4, 8) for Llama and Grok, else (3, 1, 4)
            auto = (5, 4, 8) if geo.get("architecture") in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM") else (3, 1, 4)
            if topk is None and ndt is None:
                steps, topk, ndt = auto
                notes.append("speculative steps/topk/draft tokens not given: SGLang picks %d/%d/%d" % auto)
            else:
                steps = auto[0]
                notes.append("--speculative-num-steps is missing while topk or draft tokens are given: SGLang asserts on this "
                             "(server_args.py:3521); assuming %d steps" % steps)
        steps = int(steps)
        topk = 1 if topk is None else int(topk)
        if topk == 1 and (ndt is None or int(ndt) != steps + 1):
            if ndt is not None:
                notes.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")
            ndt = steps + 1
        ndt = int(ndt) if ndt is not None else steps + 1
    o.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndt)
    if o.get("max_running_requests") is None and spec in rules.SPEC_MRR_48:
        o["max_running_requests"] = rules.SPEC_DEFAULT_MRR
        notes.append("Max running requests is reset to 48 for speculative decoding")


def resolve_options(options, geo, environment=None, version=pv.BASE):
    """SGLang's own defaults and rewrites applied to the options (what server_args= would show), with the rules of
    release ``version`` (sglang_plan_versions.resolve).

    mem_fraction_static stays None when not given: plan() fills in SGLang's default for the card.
    """
    o = dict(DEFAULTS)
    given = dict((k, v) for k, v in (options or {}).items() if v is not None)
    if "tp" not in given and "tp_size" in given:
        given["tp"] = given["tp_size"]      # SGLang's own name (sglang_unit.plan_options passes it through)
    o.update(given)
    notes = []
    spec = o.get("speculative_algorithm")
    o["_spec_given"] = str(spec).upper() if spec else None
    o["_mrr_given"] = given.get("max_running_requests")
    if spec:
        spec = str(spec).upper()
        if spec == "NEXTN":
            notes.append("NEXTN is run as EAGLE")
            spec = "EAGLE"          # server_args.py:3310-3311
        o["speculative_algorithm"] = spec
        _speculative_defaults(o, geo, notes)
    else:
        o["speculative_algorithm"] = None
        o["speculative_num_draft_tokens"] = 0
    o["disable_radix_cache"] = bool(o.get("disable_radix_cache"))
    if int(o.get("pp_size") or 1) > 1:
        o["disable_overlap_schedule"] = True            # server_args.py:3175-3180 (_handle_pipeline_parallelism)
    if o.get("mamba_scheduler_strategy") in (None, "auto"):
        o["mamba_scheduler_strategy"] = _auto_strategy(o, geo, version)
    if o.get("context_length") is None:
        o["context_length"] = geo.get("max_position_embeddings")
    ssm, conv, dnotes = rules.mamba_state_dtypes(o, geo.get("mamba_ssm_dtype"), environment)
    o["mamba_ssm_dtype"], o["mamba_conv_dtype"] = ssm, conv
    notes.extend(dnotes if geo.get("linear_attention_layers") else [])
    o["_notes"] = notes
    return o


def _auto_strategy(o, geo, version):
    """What "auto" becomes: no_buffer in 0.5.11 (server_args.py:1079-1082); from 0.5.14 extra_buffer for the radix cache
    with the overlap scheduler on, on a hybrid model extra_buffer serves (sglang_plan_versions.SINCE)."""
    if (pv.has(version, "mamba_auto_extra_buffer") and not o["disable_radix_cache"] and not o.get("disable_overlap_schedule")
            and geo.get("architecture") in pv.EXTRA_BUFFER_ARCHS):
        return "extra_buffer"
    return "no_buffer"


def _as_list(v):
    if v is None:
        return None
    return [float(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


def _gpu_memory(o, gpu_total_mib, gpu_baseline_mib, gpu_free_mib):
    """(card total MiB, free MiB before the weights) per rank; SGLang min-reduces over the ranks
    (get_available_gpu_memory(distributed=True), model_runner.py:1214-1220)."""
    totals, bases, frees = _as_list(gpu_total_mib), _as_list(gpu_baseline_mib), _as_list(gpu_free_mib)
    overhead = float(o["context_overhead_mib"])
    if frees:
        return (min(totals) if totals else min(frees)), min(frees) - overhead
    if totals:
        used = bases if bases else [0.0] * len(totals)
        free = min(t - (used[i] if i < len(used) else 0.0) for i, t in enumerate(totals)) - overhead
        return min(totals), free
    raise ValueError("gpu_total_mib or gpu_free_mib is required")


def _budget(geo, o, index, total_mib, free_mib):
    """The memory profile of one rank, as model_runner_kv_cache_mixin.py:56-134 and pool_configurator.py:190-195 do it."""
    tp = int(o["tp"])
    mf = float(o["mem_fraction_static"])
    b = {"free": free_mib * MIB, "total_mib": total_mib}
    index = load_json(index) if isinstance(index, str) else index
    # never more than the checkpoint: a bare total (no tensor names) cannot say whether it holds the mtp.* tensors
    b["mtp_bytes"] = min(mtp_checkpoint_bytes(geo, index), weights_total_bytes(index))
    stage, kv_layers = stage_sizes(geo, weights_total_bytes(index) - b["mtp_bytes"], index, int(o.get("pp_size") or 1))
    # an explicit --dtype loads the checkpoint in that dtype (float32 doubles a bf16 checkpoint)
    scale = 1.0 if o["dtype"] in (None, "auto") else _dtype_bytes(o["dtype"], 2) / float(_dtype_bytes(geo.get("torch_dtype"), 2))
    b["weights"] = stage * scale / float(tp)
    b["available"] = b["free"] - b["weights"]
    b["reserve"] = b["free"] * (1.0 - mf)
    b["rest0"] = b["available"] - b["reserve"]
    kv_bytes = _dtype_bytes(o["kv_cache_dtype"], _dtype_bytes(o["dtype"], _dtype_bytes(geo.get("torch_dtype"), 2)))
    b["kv_bytes"] = kv_bytes
    b["cell"] = kv_cell_bytes(geo, tp, kv_bytes, layers=kv_layers)
    b["ssm_b"] = _dtype_bytes(o["mamba_ssm_dtype"], 4)
    b["per_req"] = per_req = mamba_cache_per_req_bytes(geo, tp, b["ssm_b"], _dtype_bytes(o["mamba_conv_dtype"], 2))
    mrr, ndt = o.get("max_running_requests"), int(o.get("speculative_num_draft_tokens") or 0)
    rest = b["rest0"]
    b["spec_res"] = 0.0
    if o.get("speculative_algorithm") and per_req:
        b["spec_res"] = float(per_req) * int(mrr or 0) * ndt       # 78-95: intermediate states for verification
        rest -= b["spec_res"]
    b["mamba_size"], b["mamba_mem"], b["ratio_mode"] = None, 0.0, False
    if per_req:
        if o.get("max_mamba_cache_size") is not None:
            size = int(o["max_mamba_cache_size"])
        elif o.get("disable_radix_cache") and mrr is not None:
            size = int(mrr)
        else:
            ratio = float(o["mamba_full_memory_ratio"])
            size = int(max(0.0, rest) * ratio / (1.0 + ratio) // per_req)
            b["ratio_mode"] = True
        b["mamba_size"], b["mamba_mem"] = size, float(size) * per_req
        rest -= b["mamba_mem"]
    b["kv_budget"] = rest
    tokens = int(rest // b["cell"]) if rest > 0 and b["cell"] else 0
    page = int(o.get("page_size") or 1)
    b["kv_capacity"] = b["kv_tokens"] = tokens // page * page
    if o.get("max_total_tokens") is not None:
        # _apply_token_constraints (model_runner_kv_cache_mixin.py:668-691): the smaller of the profiled capacity and the
        # cap, in whole pages (calculate_pool_sizes_from_max_tokens, pool_configurator.py:177-181)
        b["kv_tokens"] = min(b["kv_capacity"], int(o["max_total_tokens"])) // page * page
    ctx = int(o["context_length"]) if o.get("context_length") else None
    b["mrr"] = rules.max_running_requests(b["kv_tokens"], ctx, mrr, b["mamba_size"] if per_req else None, rules.mamba_ratio(o))
    # the draft worker (EAGLE family with the model's own MTP head): its weights and its one-layer KV pool
    drafting = o.get("speculative_algorithm") == "EAGLE" and geo.get("mtp_num_hidden_layers")
    b["d_weights"] = draft_weights_bytes(geo, _dtype_bytes(geo.get("torch_dtype"), 2), tp) if drafting else 0.0
    d_cell = kv_cell_bytes(geo, tp, kv_bytes, layers=max(1, geo.get("mtp_num_hidden_layers") or 1)) if drafting else 0
    b["d_kv"] = float(d_cell) * b["kv_tokens"]
    return b


def _per_gpu(b):
    return {
        "total_mib": int(b["total_mib"]),
        "free_mib": _mib(b["free"]),
        "static_pool_mib": _mib(b["free"] - b["reserve"]),
        "reserve_mib": _mib(b["reserve"]),
        "weights_mib": _mib(b["weights"]),
        "mtp_weights_mib": _mib(b["mtp_bytes"]),
        "available_mib": _mib(b["available"]),
        "rest_mib": _mib(b["rest0"]),
        "mamba_cache_per_req_mib": round(b["per_req"] / float(MIB), 2),
        "max_mamba_cache_size": b["mamba_size"] or 0,
        "mamba_state_mib": _mib(b["mamba_mem"]),
        "spec_reservation_mib": _mib(b["spec_res"]),
        "kv_budget_mib": _mib(b["kv_budget"]),
        "kv_cell_bytes": b["cell"],
        "kv_tokens": b["kv_tokens"],
        "kv_capacity_tokens": b["kv_capacity"],
        "draft_weights_mib": _mib(b["d_weights"]),
        "draft_kv_mib": _mib(b["d_kv"]),
    }


def plan(config, index, options=None, gpu_total_mib=None, gpu_baseline_mib=None, gpu_free_mib=None, environment=None,
         sglang_version=None):
    """Plan whether a launch fits, per GPU, with SGLang 0.5.11's rules and formula, keyed by ``sglang_version`` where a
    later release changed one (sglang_plan_versions).

    config: config.json (dict or path); index: model.safetensors.index.json (dict, path, or total bytes);
    options: dict of the option table's "sized" rows by SGLang's names (tp_size or tp, pp_size, context_length,
      mem_fraction_static, max_running_requests, max_total_tokens, ...: DEFAULTS) and context_overhead_mib (default
      sglang_rules.PRE_WEIGHTS_MIB);
    gpu_total_mib: per-GPU total memory (int or list; the smallest is used, as SGLang min-reduces over ranks);
    gpu_baseline_mib: per-GPU memory already used before the launch (subtracted);
    gpu_free_mib: measured free memory per GPU instead of total - baseline;
    environment: the server's environment (SGLANG_MAMBA_SSM_DTYPE, SGLANG_MAMBA_CONV_DTYPE, SGLANG_ENABLE_SPEC_V2);
    sglang_version: the installed SGLang, whose flags the remedies name (sglang_options.flag) and whose rules the plan
      follows (None: 0.5.11's; newer than sglang_plan_versions.NEWEST: NEWEST's, with a warning saying so).

    Returns dict(fits, phase (None when it fits; else the diagnosis phase the launch would end in), per_gpu{total_mib,
    free_mib, static_pool_mib, reserve_mib, weights_mib, mtp_weights_mib, available_mib, rest_mib, mamba_state_mib,
    spec_reservation_mib, kv_budget_mib, kv_cell_bytes, kv_tokens, kv_capacity_tokens (before max_total_tokens),
    mamba_cache_per_req_mib, max_mamba_cache_size,
    draft_weights_mib, draft_kv_mib}, context_length, max_running_requests, reason, remedy, suggestions[{flag, value,
    effect}], warnings, options (resolved), model (geometry)).
    """
    if isinstance(config, str):
        config = load_json(config)
    geo = model_geometry(config)
    version, version_note = pv.resolve(sglang_version)
    o = resolve_options(options, geo, environment, version)
    o["_notes"].extend([version_note] if version_note else [])
    total_mib, free_mib = _gpu_memory(o, gpu_total_mib, gpu_baseline_mib, gpu_free_mib)
    if o.get("mem_fraction_static") is None:
        gpu_mem = min(_as_list(gpu_total_mib)) if gpu_total_mib is not None else None
        o["mem_fraction_static"] = rules.default_mem_fraction_static(gpu_mem, o, geo, version) if gpu_mem else 0.88
        o["_notes"].append("mem_fraction_static not given: SGLang's default for this card is %.3f" % o["mem_fraction_static"])
    refusal = rules.startup_refusal(geo, o, environment, sglang_version)
    sized = o
    if refusal:
        # size the launch as it would run with the first remedy, so the operator sees whether that fits
        flag, value, _effect = refusal["flags"][0]
        sized = dict(o, **({"disable_radix_cache": True} if flag == "--disable-radix-cache" else {"mamba_scheduler_strategy": value}))
    b = _budget(geo, sized, index, total_mib, free_mib)
    result = {
        "fits": False,
        "phase": None,
        "per_gpu": _per_gpu(b),
        "context_length": int(o["context_length"]) if o.get("context_length") else None,
        "max_running_requests": b["mrr"],
        "reason": "",
        "remedy": "",
        "suggestions": [],
        "warnings": list(o.pop("_notes")),
        "options": dict((k, v) for k, v in o.items() if not k.startswith("_")),
        "model": geo,
    }
    if o.get("max_total_tokens") is not None and int(o["max_total_tokens"]) > b["kv_capacity"]:
        # model_runner_kv_cache_mixin.py:678-682
        result["warnings"].append("max_total_tokens=%s is larger than the profiled value %d. Use the profiled value instead."
                                  % (o["max_total_tokens"], b["kv_capacity"]))
    if _node(o):
        result["node"] = _node(o)
    if refusal:
        return _refused(result, refusal, _verdict(dict(result, warnings=[]), sized, b))
    return _advisory(_verdict(result, o, b), o, version)


def _advisory(result, o, version):
    """From 0.5.14 SGLang sizes the KV pool with the draft model's weights and the speculative working memory counted
    inside the mamba budget (model_runner_kv_cache_mixin.py:84-200 of that wheel), which this plan does not model yet:
    its "does not fit" for a speculative launch is then advice, not a refusal (the gate still names a real OOM)."""
    if result["fits"] or result["phase"] != "kv_cache_oom" or not o.get("speculative_algorithm") or not pv.has(
            version, "no_spec_reserve"):
        return result
    result["advisory"] = True
    result["warnings"].append("SGLang %s sizes the KV cache of a speculative launch in a way this plan does not model yet: its "
                              "'does not fit' (%s) is not enforced; the gate names a real OOM" % (version, result["reason"]))
    return result


def _node(o):
    """This node of a multi-node server (each plans its own GPUs: 1/tp of the weights and KV heads per GPU, as
    SGLang's ranks hold them on any node), or None for a single node."""
    nnodes = int(o.get("nnodes") or 1)
    if nnodes <= 1:
        return None
    return {"nnodes": nnodes, "node_rank": int(o.get("node_rank") or 0), "gpus": int(o["tp"]) * int(o.get("pp_size") or 1) // nnodes}


def _refused(result, refusal, with_flag):
    """SGLang would stop while parsing its arguments: no GPU memory touched, a traceback, exit 1."""
    flag, value, effect = refusal["flags"][0]
    result["phase"] = "init_failed_before_gpu"
    then = ("with it the launch fits: %s" % with_flag["reason"]) if with_flag["fits"] else (
        "with it the memory plan still refuses the launch: %s %s" % (with_flag["reason"], with_flag["remedy"]))
    result["reason"] = ("SGLang 0.5.10+ refuses this configuration at start-up, before touching a GPU "
                        "(sglang/srt/server_args.py, the mamba scheduler strategy check): ValueError: %s Add %s; %s"
                        % (refusal["error"], flag if value is True else "%s %s" % (flag, value), then))
    result["suggestions"] = [{"flag": f, "value": v, "effect": e} for f, v, e in refusal["flags"]]
    result["remedy"] = "Add %s (%s)%s." % (
        flag if value is True else "%s %s" % (flag, value), effect,
        "".join("; or %s %s (%s)" % (f, v, e) for f, v, e in refusal["flags"][1:]))
    result["warnings"].extend(w for w in with_flag["warnings"] if w not in result["warnings"])
    return result


def _verdict(result, o, b):
    """fits / weights_oom / kv_cache_oom with the reason, the numbers and the levers."""
    tp, mf = int(o["tp"]), float(o["mem_fraction_static"])
    ctx = result["context_length"]
    if b["weights"] > b["free"]:
        result["phase"] = "weights_oom"
        result["reason"] = ("The weights per GPU (%d MiB = (total_size - mtp.* %d MiB) / tp %d) do not fit in the %d MiB free per GPU."
                            % (_mib(b["weights"]), _mib(b["mtp_bytes"]), tp, _mib(b["free"])))
        need_tp = int(math.ceil(b["weights"] * tp / (b["free"] * 0.8)))
        result["suggestions"] = [{"flag": "--tp-size", "value": need_tp, "effect": "weights per GPU %d MiB" % _mib(b["weights"] * tp / need_tp)},
                                 {"flag": "--quantization", "value": "fp8", "effect": "about half the weights"}]
        result["remedy"] = "Raise --tp-size to %d (more GPUs) or use a quantized checkpoint (--quantization fp8)." % need_tp
        return result
    if b["rest0"] <= 0:
        result["phase"] = "kv_cache_oom"
        need_mf = 1.0 - (b["available"] - 1.0 * GIB) / b["free"]
        result["reason"] = ("After the weights (%d MiB per GPU) only %d MiB are free, less than the %d MiB reserve that "
                            "--mem-fraction-static %.3g keeps out of the pool." % (_mib(b["weights"]), _mib(b["available"]), _mib(b["reserve"]), mf))
        result["suggestions"] = [{"flag": "--mem-fraction-static", "value": round(min(0.95, need_mf + 0.005), 3),
                                  "effect": "leaves 1 GiB for KV cache"},
                                 {"flag": "--tp-size", "value": tp * 2, "effect": "halves the weights per GPU"}]
        result["remedy"] = _remedy_text(result["suggestions"])
        return result
    if b["kv_tokens"] >= (ctx or 1) and b["mrr"] > 0:
        return _fits(result, b, ctx)
    if b["kv_capacity"] >= (ctx or 1) > b["kv_tokens"]:
        return _capped(result, o, b, ctx)
    return _does_not_fit(result, o, b, ctx)


def _capped(result, o, b, ctx):
    """max_total_tokens caps the pool below one full-length request that the memory would hold: the cap is the lever."""
    result["phase"] = "kv_cache_oom"
    result["reason"] = ("max_total_tokens %s caps the KV pool at %d tokens per GPU, fewer than context_length %s; the memory "
                        "would hold %d tokens." % (o["max_total_tokens"], b["kv_tokens"], ctx, b["kv_capacity"]))
    result["suggestions"] = [{"flag": "--max-total-tokens", "value": ctx, "effect": "one full-length request fits"},
                             {"flag": "--context-length", "value": b["kv_tokens"], "effect": "requests no longer than the capped pool"}]
    result["remedy"] = _remedy_text(result["suggestions"])
    return result


def _fits(result, b, ctx):
    result["fits"] = True
    result["reason"] = ("KV cache holds %d tokens per GPU (%d MiB at %d bytes/token) for context %s; %d MiB of GDN/mamba state "
                        "(%d slots), %d MiB reserved for speculative verification; max_running_requests %d."
                        % (b["kv_tokens"], _mib(b["kv_tokens"] * b["cell"]), b["cell"], ctx, _mib(b["mamba_mem"]), b["mamba_size"] or 0,
                           _mib(b["spec_res"]), b["mrr"]))
    # the reserve has to hold the draft model, CUDA graphs and activations
    if b["d_weights"] and b["d_weights"] + b["d_kv"] > b["reserve"] * 0.5:
        result["warnings"].append("the draft model (%d MiB weights + %d MiB KV) takes more than half of the %d MiB reserve left for "
                                  "CUDA graphs and activations" % (_mib(b["d_weights"]), _mib(b["d_kv"]), _mib(b["reserve"])))
    if ctx and b["kv_tokens"] < ctx * 2:
        result["warnings"].append("the KV pool holds fewer than two full-length requests (%d tokens for context %d)" % (b["kv_tokens"], ctx))
    return result


def _does_not_fit(result, o, b, ctx):
    """The KV pool is too small for one full-length request (or no request slot is left): the numbers and the levers, in order."""
    result["phase"] = "kv_cache_oom"
    mf, mrr, ndt, per_req = float(o["mem_fraction_static"]), o.get("max_running_requests"), int(o.get("speculative_num_draft_tokens") or 0), b["per_req"]
    need = (ctx or 1) * b["cell"]
    result["reason"] = ("The KV-cache pool does not fit: %d MiB per GPU after weights %d MiB, reserve %d MiB (mem_fraction_static %.3g), "
                        "GDN/mamba state %d MiB (%d slots x %.1f MiB) and speculative reservation %d MiB (%s requests x %d draft tokens "
                        "x %.1f MiB) leaves %d MiB for KV = %d tokens, context_length %s needs %d MiB."
                        % (_mib(b["available"]), _mib(b["weights"]), _mib(b["reserve"]), mf, _mib(b["mamba_mem"]), b["mamba_size"] or 0,
                           per_req / float(MIB), _mib(b["spec_res"]), mrr, ndt, per_req / float(MIB), _mib(b["kv_budget"]), b["kv_tokens"],
                           ctx, _mib(need)))
    if b["kv_tokens"] >= (ctx or 1):
        result["reason"] += (" The pool holds the tokens, but max_running_requests comes out as %d (max_mamba_cache_size %d // %d): "
                             "SGLang asserts \"max_running_request is zero\" (managers/tp_worker.py:297)."
                             % (b["mrr"], b["mamba_size"] or 0, rules.mamba_ratio(o)))
    sug = _suggestions(o, b, need)
    result["suggestions"] = sug
    result["remedy"] = _remedy_text(sug) if sug else "Use more GPUs (--tp-size) or a smaller model: short by %d MiB per GPU." % _mib(need - b["kv_budget"])
    return result


def _suggestions(o, b, need):
    sug = []
    spec, ndt = o.get("speculative_algorithm"), int(o.get("speculative_num_draft_tokens") or 0)
    per_req, rest0 = b["per_req"], b["rest0"]
    if spec and per_req:
        per_mrr = float(per_req) * (ndt + 1)   # reservation + one state slot per request
        max_mrr = int((rest0 - need) // per_mrr) if rest0 > need else 0
        if max_mrr >= 1:
            val = min(max_mrr, 16)
            sug.append({"flag": "--max-running-requests", "value": val,
                        "effect": "speculative reservation %d MiB + state %d MiB, KV %d tokens"
                                  % (_mib(per_req * val * ndt), _mib(per_req * val), int((rest0 - per_mrr * val) // b["cell"]))})
        if ndt > 2:
            sug.append({"flag": "--speculative-num-draft-tokens", "value": 2,
                        "effect": "with --speculative-num-steps 1 --speculative-eagle-topk 1"})
    if b["mamba_mem"] + b["spec_res"] > 0 and b["ssm_b"] == 4:
        sug.append({"flag": "--mamba-ssm-dtype", "value": "bfloat16", "effect": "halves the GDN temporal state (accuracy trade-off)"})
    max_ctx = int(b["kv_budget"] // b["cell"]) if b["kv_budget"] > 0 else 0
    if max_ctx >= 4096:
        sug.append({"flag": "--context-length", "value": int(max_ctx // 1024 * 1024), "effect": "the largest context this pool holds"})
    # mem_fraction_static needed: available - free*(1-mf) - mamba - spec >= need
    if b["ratio_mode"]:
        # the mamba pool takes ratio/(1+ratio) of whatever is left: the rest must cover the KV share
        r = float(o["mamba_full_memory_ratio"])
        need_mf = 1.0 - (b["available"] - b["spec_res"] - need * (1.0 + r)) / b["free"]
    else:
        need_mf = 1.0 - (b["available"] - b["mamba_mem"] - b["spec_res"] - need) / b["free"]
    if need_mf <= 0.95:
        sug.append({"flag": "--mem-fraction-static", "value": round(need_mf + 0.005, 3),
                    "effect": "shrinks the %d MiB reserve left for CUDA graphs/activations to %d MiB"
                              % (_mib(b["reserve"]), _mib(b["free"] * (1 - need_mf - 0.005)))})
    if spec:
        sug.append({"flag": "--speculative-algorithm", "value": None, "effect": "no speculative reservation (turn MTP off)"})
    return sug


def _remedy_text(suggestions):
    parts = []
    for s in suggestions:
        if s["value"] is None:
            parts.append("drop %s (%s)" % (s["flag"], s["effect"]))
        else:
            parts.append("%s %s (%s)" % (s["flag"], s["value"], s["effect"]))
    return "Change one of, in this order: " + "; ".join(parts) + "."
