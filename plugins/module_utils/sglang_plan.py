# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory-fit plan for an SGLang launch, before the launch.

Follows SGLang 0.5.9's own sizing (``shared/reference/sglang.md`` section 4,
``model_runner_kv_cache_mixin.py``): per TP rank,

    free        = free GPU memory after distributed init (card total - baseline use - CUDA/NCCL context)
    weights     = safetensors total_size / tp (the MTP draft layer is loaded later, by the draft worker)
    available   = free - weights                              # "Load weight end. avail mem"
    rest        = available - free * (1 - mem_fraction_static)
    rest       -= mamba_cache_per_req * max_running_requests * draft_tokens   (speculative decoding)
    rest       -= max_mamba_cache_size * mamba_cache_per_req                   (GDN/mamba state pool)
    kv_tokens   = rest // kv_cell_bytes                        # "KV Cache is allocated. #tokens"

and the launch fits when ``kv_tokens >= context_length`` (one full-length request).
The draft model's weights, its one-layer KV pool and the CUDA graphs come out of the
``(1 - mem_fraction_static)`` reserve afterwards; the plan reports them as warnings.

Standard library only; runs on the target's Python 3.9+.
"""

from __future__ import annotations

import json
import math

MIB = 1 << 20
GIB = 1 << 30

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "auto": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

# SGLang 0.5.9: speculative algorithms that reset max_running_requests to 48 (server_args.py:2362-2366)
_SPEC_MRR_48 = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN")

DEFAULTS = {
    "tp": 1,
    "context_length": None,             # None: max_position_embeddings of the model
    "mem_fraction_static": 0.88,        # SGLang's fallback; pass it explicitly
    "max_running_requests": None,
    "max_mamba_cache_size": None,
    "mamba_full_memory_ratio": 0.9,
    "mamba_ssm_dtype": None,            # None: config mamba_ssm_dtype, else float32
    "mamba_conv_dtype": "bfloat16",
    "kv_cache_dtype": "auto",
    "dtype": "auto",
    "disable_radix_cache": None,        # None: SGLang's choice (forced on for hybrid + speculative)
    "speculative_algorithm": None,
    "speculative_num_steps": None,
    "speculative_eagle_topk": None,
    "speculative_num_draft_tokens": None,
    "page_size": 1,
    "chunked_prefill_size": None,
    "cuda_graph_max_bs": None,
    "context_overhead_mib": 800,        # CUDA context + NCCL/custom all-reduce buffers per rank before weights
}


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
    """(full_attention_layers, linear_attention_layers) of a hybrid (GDN/mamba) or plain model."""
    n = int(tc.get("num_hidden_layers") or 0)
    types = tc.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(1 for t in types if t in ("full_attention", "attention", "sliding_attention"))
        linear = sum(1 for t in types if t in ("linear_attention", "mamba", "gated_delta_net"))
        return full, linear
    interval = tc.get("full_attention_interval")
    if interval and ("linear_num_value_heads" in tc or "linear_num_key_heads" in tc):
        interval = int(interval)
        full = len([i for i in range(n) if (i + 1) % interval == 0])
        return full, n - full
    return n, 0


def model_geometry(config):
    """The numbers the sizing needs, from config.json (nested text_config handled)."""
    tc = text_config(config)
    full, linear = _layer_kinds(tc)
    heads = int(tc.get("num_attention_heads") or 0)
    hidden = int(tc.get("hidden_size") or 0)
    head_dim = int(tc.get("head_dim") or (hidden // heads if heads else 0))
    geo = {
        "architecture": architecture(config),
        "model_type": config.get("model_type"),
        "num_hidden_layers": int(tc.get("num_hidden_layers") or 0),
        "full_attention_layers": full,
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
        "torch_dtype": tc.get("torch_dtype") or tc.get("dtype") or config.get("torch_dtype"),
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
    """Bytes of KV cache per token per rank: kv_heads/tp x (head_dim + v_head_dim) x full-attention layers x dtype."""
    kv_heads = max(1, geo["num_key_value_heads"] // tp)
    layers = geo["full_attention_layers"] if layers is None else layers
    return kv_heads * (geo["head_dim"] + geo["v_head_dim"]) * layers * kv_dtype_bytes


def mamba_cache_per_req_bytes(geo, tp, ssm_bytes=4, conv_bytes=2):
    """GDN/mamba state of one request per rank: conv state + temporal (SSM) state over the linear layers."""
    if not geo.get("linear_attention_layers"):
        return 0
    conv_dim = geo["linear_value_head_dim"] * geo["linear_num_value_heads"] + 2 * geo["linear_num_key_heads"] * geo["linear_key_head_dim"]
    conv = (conv_dim // tp) * (geo["linear_conv_kernel_dim"] - 1) * conv_bytes
    temporal = (geo["linear_num_value_heads"] // tp) * geo["linear_value_head_dim"] * geo["linear_key_head_dim"] * ssm_bytes
    return (conv + temporal) * geo["linear_attention_layers"]


def draft_weights_bytes(geo, dtype_bytes=2):
    """Rough size of the MTP/NextN draft layer(s) (attention + MLP + the fc projection; embeddings shared)."""
    n = geo.get("mtp_num_hidden_layers") or 0
    if not n:
        return 0
    h, inter = geo["hidden_size"], geo["intermediate_size"]
    q = geo["num_attention_heads"] * geo["head_dim"]
    kv = geo["num_key_value_heads"] * geo["head_dim"]
    attn = h * (2 * q) + 2 * h * kv + q * h   # q (with gate) / k / v / o
    mlp = 3 * h * inter
    fc = 2 * h * h
    return n * (attn + mlp + fc) * dtype_bytes


def weights_total_bytes(index):
    """metadata.total_size of model.safetensors.index.json (dict or path)."""
    if isinstance(index, str):
        index = load_json(index)
    if isinstance(index, (int, float)):
        return int(index)
    return int((index.get("metadata") or {}).get("total_size") or 0)


def _dtype_bytes(name, default):
    if name is None:
        return default
    return _DTYPE_BYTES.get(str(name).lower().replace("torch.", ""), default)


def resolve_options(options, geo):
    """SGLang's own defaults and rewrites applied to the options (what server_args= would show)."""
    o = dict(DEFAULTS)
    o.update({k: v for k, v in (options or {}).items() if v is not None})
    notes = []
    spec = o.get("speculative_algorithm")
    if spec:
        spec = str(spec).upper()
        if spec == "NEXTN":
            notes.append("NEXTN is run as EAGLE")
        o["speculative_algorithm"] = spec
        steps = o.get("speculative_num_steps")
        topk = o.get("speculative_eagle_topk")
        ndt = o.get("speculative_num_draft_tokens")
        if steps is None and topk is None and ndt is None:
            steps, topk, ndt = 3, 1, 4
            notes.append("speculative steps/topk/draft tokens not given: assuming 3/1/4")
        steps = 3 if steps is None else int(steps)
        topk = 1 if topk is None else int(topk)
        if topk == 1:
            if ndt is not None and int(ndt) != steps + 1:
                notes.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")
            ndt = steps + 1
        ndt = int(ndt) if ndt is not None else steps + 1
        o.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndt)
        if o.get("max_running_requests") is None and spec in _SPEC_MRR_48:
            o["max_running_requests"] = 48
            notes.append("Max running requests is reset to 48 for speculative decoding")
        if geo.get("linear_attention_layers") and o.get("disable_radix_cache") is None:
            o["disable_radix_cache"] = True
            notes.append("radix cache disabled (speculative decoding on a hybrid model)")
    else:
        o["speculative_num_draft_tokens"] = 0
    if o.get("disable_radix_cache") is None:
        o["disable_radix_cache"] = False
    if o.get("context_length") is None:
        o["context_length"] = geo.get("max_position_embeddings")
    if o.get("mamba_ssm_dtype") is None:
        o["mamba_ssm_dtype"] = geo.get("mamba_ssm_dtype") or "float32"
    o["_notes"] = notes
    return o


def _mib(b):
    return int(round(b / MIB))


def plan(config, index, options=None, gpu_total_mib=None, gpu_baseline_mib=None, gpu_free_mib=None):
    """Plan whether a launch fits, per GPU, with SGLang's formula.

    config: config.json (dict or path); index: model.safetensors.index.json (dict, path, or total bytes);
    options: dict of tp, context_length, mem_fraction_static, max_running_requests, max_mamba_cache_size,
      mamba_full_memory_ratio, mamba_ssm_dtype, kv_cache_dtype, dtype, disable_radix_cache,
      speculative_algorithm / speculative_num_steps / speculative_eagle_topk / speculative_num_draft_tokens,
      context_overhead_mib (CUDA context + NCCL per rank, default 800);
    gpu_total_mib: per-GPU total memory (int or list; the smallest is used, as SGLang min-reduces over ranks);
    gpu_baseline_mib: per-GPU memory already used before the launch (subtracted);
    gpu_free_mib: measured free memory per GPU instead of total - baseline.

    Returns dict(fits, per_gpu{total_mib, free_mib, static_pool_mib, reserve_mib, weights_mib, available_mib, rest_mib,
    mamba_state_mib, spec_reservation_mib, kv_budget_mib, kv_cell_bytes, kv_tokens, mamba_cache_per_req_mib,
    max_mamba_cache_size, draft_weights_mib, draft_kv_mib}, context_length, max_running_requests, reason, remedy,
    suggestions[{flag, value, effect}], warnings, options (resolved), model (geometry)).
    """
    if isinstance(config, str):
        config = load_json(config)
    geo = model_geometry(config)
    o = resolve_options(options, geo)
    tp = int(o["tp"])
    mf = float(o["mem_fraction_static"])
    ctx = int(o["context_length"]) if o.get("context_length") else None

    def _as_list(v):
        if v is None:
            return None
        return [float(x) for x in (v if isinstance(v, (list, tuple)) else [v])]

    totals = _as_list(gpu_total_mib)
    bases = _as_list(gpu_baseline_mib)
    frees = _as_list(gpu_free_mib)
    if frees:
        free_mib = min(frees) - float(o["context_overhead_mib"])
        total_mib = min(totals) if totals else min(frees)
    elif totals:
        used = bases if bases else [0.0] * len(totals)
        free_mib = min(t - (used[i] if i < len(used) else 0.0) for i, t in enumerate(totals)) - float(o["context_overhead_mib"])
        total_mib = min(totals)
    else:
        raise ValueError("gpu_total_mib or gpu_free_mib is required")

    free = free_mib * MIB
    weights = weights_total_bytes(index) / float(tp)
    available = free - weights
    reserve = free * (1.0 - mf)
    rest0 = available - reserve

    kv_bytes = _dtype_bytes(o["kv_cache_dtype"], _dtype_bytes(o["dtype"], _dtype_bytes(geo.get("torch_dtype"), 2)))
    cell = kv_cell_bytes(geo, tp, kv_bytes)
    ssm_b = _dtype_bytes(o["mamba_ssm_dtype"], 4)
    conv_b = _dtype_bytes(o["mamba_conv_dtype"], 2)
    per_req = mamba_cache_per_req_bytes(geo, tp, ssm_b, conv_b)
    spec = o.get("speculative_algorithm")
    ndt = int(o.get("speculative_num_draft_tokens") or 0)
    mrr = o.get("max_running_requests")

    rest = rest0
    spec_res = 0.0
    if spec and per_req:
        spec_res = float(per_req) * int(mrr or 0) * ndt
        rest -= spec_res
    mamba_size = 0
    mamba_mem = 0.0
    if per_req:
        if o.get("max_mamba_cache_size") is not None:
            mamba_size = int(o["max_mamba_cache_size"])
        elif o.get("disable_radix_cache") and mrr is not None:
            mamba_size = int(mrr)
        else:
            ratio = float(o["mamba_full_memory_ratio"])
            raw = max(0.0, rest) * ratio / (1.0 + ratio)
            mamba_size = int(raw // per_req)
        mamba_mem = float(mamba_size) * per_req
        rest -= mamba_mem
    kv_budget = rest
    kv_tokens = int(kv_budget // cell) if kv_budget > 0 and cell else 0
    page = int(o.get("page_size") or 1)
    if page > 1:
        kv_tokens = kv_tokens // page * page
    # SGLang's max_running_requests when not given, and the hybrid cap by mamba slots
    if mrr is None:
        eff_mrr = min(max(int(kv_tokens / float(ctx) * 512) if ctx else 2048, 2048), 4096)
        if per_req:
            eff_mrr = min(eff_mrr, mamba_size // (1 if o.get("disable_radix_cache") else 3))
    else:
        eff_mrr = int(mrr)
        if per_req and mamba_size:
            eff_mrr = min(eff_mrr, mamba_size)

    d_weights = draft_weights_bytes(geo, 2) / float(tp) if spec in ("EAGLE", "NEXTN") and geo.get("mtp_num_hidden_layers") else 0.0
    d_cell = kv_cell_bytes(geo, tp, kv_bytes, layers=max(1, geo.get("mtp_num_hidden_layers") or 1)) if d_weights else 0
    d_kv = float(d_cell) * kv_tokens

    per_gpu = {
        "total_mib": int(total_mib),
        "free_mib": _mib(free),
        "static_pool_mib": _mib(free * mf),
        "reserve_mib": _mib(reserve),
        "weights_mib": _mib(weights),
        "available_mib": _mib(available),
        "rest_mib": _mib(rest0),
        "mamba_cache_per_req_mib": round(per_req / float(MIB), 2),
        "max_mamba_cache_size": mamba_size,
        "mamba_state_mib": _mib(mamba_mem),
        "spec_reservation_mib": _mib(spec_res),
        "kv_budget_mib": _mib(kv_budget),
        "kv_cell_bytes": cell,
        "kv_tokens": kv_tokens,
        "draft_weights_mib": _mib(d_weights),
        "draft_kv_mib": _mib(d_kv),
    }
    warnings = list(o.pop("_notes"))
    result = {
        "fits": False,
        "per_gpu": per_gpu,
        "context_length": ctx,
        "max_running_requests": eff_mrr,
        "reason": "",
        "remedy": "",
        "suggestions": [],
        "warnings": warnings,
        "options": o,
        "model": geo,
    }

    # --- the verdict ---------------------------------------------------------------------
    if weights > free:
        result["reason"] = ("The weights per GPU (%d MiB = total_size / tp %d) do not fit in the %d MiB free per GPU."
                            % (_mib(weights), tp, _mib(free)))
        need_tp = int(math.ceil(weights * tp / (free * 0.8)))
        result["suggestions"] = [{"flag": "--tp-size", "value": need_tp, "effect": "weights per GPU %d MiB" % _mib(weights * tp / need_tp)},
                                 {"flag": "--quantization", "value": "fp8", "effect": "about half the weights"}]
        result["remedy"] = "Raise --tp-size to %d (more GPUs) or use a quantized checkpoint (--quantization fp8)." % need_tp
        return result
    if rest0 <= 0:
        need_mf = 1.0 - (available - 1.0 * GIB) / free
        result["reason"] = ("After the weights (%d MiB per GPU) only %d MiB are free, less than the %d MiB reserve that "
                            "--mem-fraction-static %.2f keeps out of the pool." % (_mib(weights), _mib(available), _mib(reserve), mf))
        result["suggestions"] = [{"flag": "--mem-fraction-static", "value": round(min(0.95, need_mf + 0.005), 3),
                                  "effect": "leaves 1 GiB for KV cache"},
                                 {"flag": "--tp-size", "value": tp * 2, "effect": "halves the weights per GPU"}]
        result["remedy"] = _remedy_text(result["suggestions"])
        return result

    need_tokens = ctx or 1
    if kv_tokens >= need_tokens:
        result["fits"] = True
        result["reason"] = ("KV cache holds %d tokens per GPU (%d MiB at %d bytes/token) for context %s; %d MiB of GDN/mamba state "
                            "(%d slots) and %d MiB reserved for speculative verification."
                            % (kv_tokens, _mib(kv_budget), cell, ctx, _mib(mamba_mem), mamba_size, _mib(spec_res)))
        # the reserve has to hold the draft model, CUDA graphs and activations
        if d_weights and d_weights + d_kv > reserve * 0.5:
            warnings.append("the draft model (%d MiB weights + %d MiB KV) takes more than half of the %d MiB reserve left for CUDA "
                            "graphs and activations" % (_mib(d_weights), _mib(d_kv), _mib(reserve)))
        if ctx and kv_tokens < ctx * 2:
            warnings.append("the KV pool holds fewer than two full-length requests (%d tokens for context %d)" % (kv_tokens, ctx))
        return result

    # does not fit: the numbers and the levers, in order
    short = need_tokens * cell - kv_budget
    result["reason"] = ("The KV-cache pool does not fit: %d MiB per GPU after weights %d MiB, reserve %d MiB (mem_fraction_static %.2f), "
                        "GDN/mamba state %d MiB (%d slots x %.1f MiB) and speculative reservation %d MiB (%s requests x %d draft tokens "
                        "x %.1f MiB) leaves %d MiB for KV = %d tokens, context_length %s needs %d MiB."
                        % (_mib(available), _mib(weights), _mib(reserve), mf, _mib(mamba_mem), mamba_size, per_req / float(MIB),
                           _mib(spec_res), mrr, ndt, per_req / float(MIB), _mib(kv_budget), kv_tokens, ctx, _mib(need_tokens * cell)))
    sug = []
    ctx_need = need_tokens * cell
    if spec and per_req:
        per_mrr = float(per_req) * (ndt + 1)   # reservation + one state slot per request
        max_mrr = int((rest0 - ctx_need) // per_mrr) if rest0 > ctx_need else 0
        if max_mrr >= 1:
            val = min(max_mrr, 16)
            sug.append({"flag": "--max-running-requests", "value": val,
                        "effect": "speculative reservation %d MiB + state %d MiB, KV %d tokens"
                                  % (_mib(per_req * val * ndt), _mib(per_req * val), int((rest0 - per_mrr * val) // cell))})
        if ndt > 2:
            sug.append({"flag": "--speculative-num-draft-tokens", "value": 2,
                        "effect": "with --speculative-num-steps 1 --speculative-eagle-topk 1"})
    if mamba_mem + spec_res > 0 and ssm_b == 4:
        sug.append({"flag": "--mamba-ssm-dtype", "value": "bfloat16", "effect": "halves the GDN temporal state (accuracy trade-off)"})
    max_ctx = int(kv_budget // cell) if kv_budget > 0 else 0
    if max_ctx >= 4096:
        sug.append({"flag": "--context-length", "value": int(max_ctx // 1024 * 1024), "effect": "the largest context this pool holds"})
    # mem_fraction_static needed: available - free*(1-mf) - mamba - spec >= ctx_need
    ratio_mode = bool(per_req) and o.get("max_mamba_cache_size") is None and not (o.get("disable_radix_cache") and mrr is not None)
    if ratio_mode:
        # the mamba pool takes ratio/(1+ratio) of whatever is left: the rest must cover the KV share
        r = float(o["mamba_full_memory_ratio"])
        need_mf = 1.0 - (available - spec_res - ctx_need * (1.0 + r)) / free
    else:
        need_mf = 1.0 - (available - mamba_mem - spec_res - ctx_need) / free
    if need_mf <= 0.95:
        sug.append({"flag": "--mem-fraction-static", "value": round(need_mf + 0.005, 3),
                    "effect": "shrinks the %d MiB reserve left for CUDA graphs/activations to %d MiB"
                              % (_mib(reserve), _mib(free * (1 - need_mf - 0.005)))})
    if spec:
        sug.append({"flag": "--speculative-algorithm", "value": None, "effect": "no speculative reservation (turn MTP off)"})
    result["suggestions"] = sug
    result["remedy"] = _remedy_text(sug) if sug else "Use more GPUs (--tp-size) or a smaller model: short by %d MiB per GPU." % _mib(short)
    return result


def _remedy_text(suggestions):
    parts = []
    for s in suggestions:
        if s["value"] is None:
            parts.append("drop %s (%s)" % (s["flag"], s["effect"]))
        else:
            parts.append("%s %s (%s)" % (s["flag"], s["value"], s["effect"]))
    return "Change one of, in this order: " + "; ".join(parts) + "."
