"""Model facts and SGLang's memory formulas (sglang-0.5.9..0.5.11 wheels: srt/server_args.py,
model_executor/model_runner_kv_cache_mixin.py; each formula cites its lines).

All sizes are per TP rank. GiB values are floats (SGLang prints them as "GB").
"""

import json
import os

GIB = float(1 << 30)
MIB = float(1 << 20)

# What one rank holds on its GPU before the weights load: CUDA context + torch init, and at TP > 1 the NCCL
# communicators / custom all-reduce buffers. The total is the memory-fit plan's value
# (plugins/module_utils/serve/sglang_rules.py PRE_WEIGHTS_MIB; tests/unit/lab/test_sglang_standin.py checks they agree).
PRE_WEIGHTS_MIB = 800
NCCL_INIT_MIB = 98          # the TP > 1 share of it
CUDA_CONTEXT_MIB = PRE_WEIGHTS_MIB - NCCL_INIT_MIB


def context_mib(tp):
    """The CUDA context of one rank: the whole pre-weights amount at TP 1 (no NCCL), the rest of it at TP > 1."""
    return CUDA_CONTEXT_MIB if tp > 1 else PRE_WEIGHTS_MIB


WARMUP_ACTIVATION_MIB = 208  # caching-allocator growth on the first forward

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


class ModelFacts(object):
    def __init__(self, model_path):
        self.model_path = model_path
        with open(os.path.join(model_path, "config.json")) as f:
            self.config = json.load(f)
        cfg = self.config
        text = dict(cfg.get("text_config") or {})
        for k, v in cfg.items():
            if k not in text and k not in ("text_config", "vision_config"):
                text[k] = v
        self.text = text
        self.architectures = cfg.get("architectures") or text.get("architectures") or []
        self.arch = self.architectures[0] if self.architectures else "UnknownForCausalLM"
        self.model_type = cfg.get("model_type", text.get("model_type", ""))
        self.vision = cfg.get("vision_config")
        self.is_multimodal = bool(self.vision) and self.arch.endswith("ForConditionalGeneration")
        self.num_layers = int(text.get("num_hidden_layers", 0))
        self.hidden = int(text.get("hidden_size", 4096))
        self.intermediate = int(text.get("intermediate_size", 4 * self.hidden))
        self.vocab = int(text.get("vocab_size", 32000))
        self.heads = int(text.get("num_attention_heads", 32))
        self.kv_heads = int(text.get("num_key_value_heads", self.heads))
        self.head_dim = int(text.get("head_dim") or self.hidden // self.heads)
        self.v_head_dim = int(text.get("v_head_dim") or self.head_dim)
        self.max_position_embeddings = int(text.get("max_position_embeddings", 4096))
        self.torch_dtype = text.get("torch_dtype") or text.get("dtype") or "bfloat16"
        self.hybrid = "linear_num_value_heads" in text or "linear_attention" in (text.get("layer_types") or [])
        layer_types = text.get("layer_types")
        if layer_types:
            self.full_layers = [i for i, t in enumerate(layer_types) if t == "full_attention"]
        elif self.hybrid:
            interval = int(text.get("full_attention_interval", 4))
            self.full_layers = [i for i in range(self.num_layers) if (i + 1) % interval == 0]
        else:
            self.full_layers = list(range(self.num_layers))
        self.linear_layers = self.num_layers - len(self.full_layers) if self.hybrid else 0
        self.lin_k_heads = int(text.get("linear_num_key_heads", 0))
        self.lin_v_heads = int(text.get("linear_num_value_heads", 0))
        self.lin_k_dim = int(text.get("linear_key_head_dim", 128))
        self.lin_v_dim = int(text.get("linear_value_head_dim", 128))
        self.conv_kernel = int(text.get("linear_conv_kernel_dim", 4))
        self.mamba_ssm_dtype = text.get("mamba_ssm_dtype") or "float32"
        self.layer_types = list(text.get("layer_types") or [])
        self.mtp_layers = int(text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0)) or 0)
        index = os.path.join(model_path, "model.safetensors.index.json")
        self.total_size = None
        self.shards = []
        # whether the checkpoint holds an LM head of its own (its tensor names; else not tie_word_embeddings)
        self.head_in_ckpt = not cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
        if os.path.isfile(index):
            with open(index) as f:
                idx = json.load(f)
            self.total_size = int((idx.get("metadata") or {}).get("total_size", 0)) or None
            self.shards = sorted(set((idx.get("weight_map") or {}).values()))
            self.has_mtp = any("mtp" in name for name in (idx.get("weight_map") or {})) or not idx.get("weight_map")
            if idx.get("weight_map"):
                self.head_in_ckpt = any(name.endswith("lm_head.weight") for name in idx["weight_map"])
        else:
            self.has_mtp = True
        if self.total_size is None:
            self.total_size = sum(os.path.getsize(os.path.join(model_path, n)) for n in os.listdir(model_path) if n.endswith(".safetensors"))
            self.shards = sorted(n for n in os.listdir(model_path) if n.endswith(".safetensors"))
        if not self.shards:
            self.shards = ["model.safetensors"]

    def vit_dims(self):
        v = self.vision or {}
        layers = v.get("num_hidden_layers") or 24
        return int(layers), int(v.get("hidden_size") or 1152)


def dtype_bytes(name, default=2):
    return _DTYPE_BYTES.get(str(name).replace("torch.", ""), default)


# The architectures whose loader skips every tensor named *mtp* for the target model (0.5.11 models/qwen3_5.py:1171,
# 1314, 1517, 1764; models/qwen3_next.py:1076); the draft worker loads them (models/qwen3_5_mtp.py:253).
MTP_SKIPPING_ARCHS = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM",
                      "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM")


def mtp_tensors(facts):
    """(name, elements, split over TP) of a Qwen3.5-style checkpoint's mtp.* tensors (dense MLP), as the draft builds
    them (0.5.11 models/qwen3_5_mtp.py:69-83): fc is a plain nn.Linear (every rank), norms replicated, the layer split."""
    if facts.mtp_layers <= 0 or not facts.has_mtp or facts.arch not in MTP_SKIPPING_ARCHS:
        return []
    h, hd, heads, kv = facts.hidden, facts.head_dim, facts.heads, facts.kv_heads
    gate = 2 if facts.text.get("attn_output_gate", True) else 1
    out = [("mtp.fc.weight", 2 * h * h, False), ("mtp.pre_fc_norm_embedding.weight", h, False),
           ("mtp.pre_fc_norm_hidden.weight", h, False), ("mtp.norm.weight", h, False)]
    for i in range(facts.mtp_layers):
        p = "mtp.layers.%d." % i
        out += [(p + "input_layernorm.weight", h, False), (p + "post_attention_layernorm.weight", h, False),
                (p + "self_attn.q_proj.weight", heads * hd * gate * h, True), (p + "self_attn.k_proj.weight", kv * hd * h, True),
                (p + "self_attn.v_proj.weight", kv * hd * h, True), (p + "self_attn.o_proj.weight", h * heads * hd, True),
                (p + "self_attn.q_norm.weight", hd, False), (p + "self_attn.k_norm.weight", hd, False),
                (p + "mlp.gate_proj.weight", facts.intermediate * h, True), (p + "mlp.up_proj.weight", facts.intermediate * h, True),
                (p + "mlp.down_proj.weight", h * facts.intermediate, True)]
    return out


def mtp_bytes(facts):
    """Bytes of the mtp.* tensors in the checkpoint."""
    return sum(n for _name, n, _split in mtp_tensors(facts)) * dtype_bytes(facts.torch_dtype, 2)


def pp_stages(num_layers, pp):
    """[(start, end)] of each pipeline stage's decoder layers: 0.5.11 get_pp_indices (distributed/utils.py:99-135), the
    last num_layers % pp stages one layer more."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for rank in range(pp):
        n = base + (1 if rank >= pp - extra else 0)
        out.append((start, start + n))
        start += n
    return out


def vision_params(facts):
    """About the ViT tower's parameters (attention 4h^2 + MLP 2h x intermediate per block, the patch merger), as the
    memory plan counts them (plugins/module_utils/serve/sglang_plan.py _vision_params)."""
    v = facts.vision or {}
    h, inter = int(v.get("hidden_size") or 0), int(v.get("intermediate_size") or 0)
    depth = int(v.get("depth") or v.get("num_hidden_layers") or 0)
    merged = h * int(v.get("spatial_merge_size") or 2) ** 2
    return depth * (4 * h * h + 2 * h * inter) + merged * merged + merged * int(v.get("out_hidden_size") or h)


def weights_per_rank_bytes(facts, tp, dtype_scale=1.0, pp=1, stage=0):
    """The target model's weights on one rank: the checkpoint less the mtp.* tensors its loader skips. With pp > 1, its
    pipeline stage's: the stage's decoder layers (make_layers, models/qwen3_5.py:1046-1052), the ViT tower on every
    stage (models/qwen3_vl.py:1099), the embedding on the first (qwen3_5.py:1019-1027) and an LM head of its own on the
    last (qwen3_vl.py:1129-1145, also when tied)."""
    total = facts.total_size - mtp_bytes(facts)
    if pp > 1:
        elem = dtype_bytes(facts.torch_dtype, 2)
        emb, vit = facts.vocab * facts.hidden * elem, vision_params(facts) * elem
        body = max(0.0, total - emb - vit - (emb if facts.head_in_ckpt else 0))
        start, end = pp_stages(facts.num_layers, pp)[stage]
        total = body * (end - start) / float(facts.num_layers) + vit + (emb if stage == 0 else 0) + (emb if stage == pp - 1 else 0)
    return total * dtype_scale / tp


def stage_kv_layers(facts, pp):
    """The full-attention layers of each pipeline stage (the KV pool's layers, pool_configurator.py:83-91)."""
    return [len([i for i in facts.full_layers if start <= i < end]) for start, end in pp_stages(facts.num_layers, pp)]


def draft_weights_per_rank_bytes(facts, tp):
    """The MTP draft's own weights on one rank; embed_tokens / lm_head are the target's (qwen3_5_mtp.py:110-117)."""
    elem = dtype_bytes(facts.torch_dtype, 2)
    return sum((n / float(tp) if split else n) * elem for _name, n, split in mtp_tensors(facts))


def kv_heads_per_rank(facts, tp):
    return max(1, facts.kv_heads // tp)


def cell_size(facts, tp, kv_bytes, num_layers=None):
    """Bytes per token of the MHA KV pool: heads * (head_dim + v_head_dim) * layers * elem."""
    layers = len(facts.full_layers) if num_layers is None else num_layers
    return kv_heads_per_rank(facts, tp) * (facts.head_dim + facts.v_head_dim) * layers * kv_bytes


def mamba_shapes(facts, tp, ssm_dtype):
    conv_dim = facts.lin_v_dim * facts.lin_v_heads + 2 * facts.lin_k_heads * facts.lin_k_dim
    conv_per_layer = (conv_dim // tp) * (facts.conv_kernel - 1) * 2
    ssm_per_layer = (facts.lin_v_heads // tp) * facts.lin_v_dim * facts.lin_k_dim * dtype_bytes(ssm_dtype, 4)
    return conv_per_layer, ssm_per_layer


def mamba_cache_per_req(facts, tp, ssm_dtype):
    conv, ssm = mamba_shapes(facts, tp, ssm_dtype)
    return (conv + ssm) * facts.linear_layers


def default_mem_fraction(gpu_mem_mib, tp, chunked, cuda_graph_max_bs, spec_algo, facts, pp=1, version=(0, 5, 11, 0),
                         max_total_tokens=None):
    """``_handle_gpu_memory_settings`` (0.5.11 server_args.py:1434-1484) plus the VLM adjustment (7137-7173, not rounded).

    0.5.10+: piecewise CUDA graphs are on unless disabled (off for multimodal models and pp > 1, 1194-1230) and add
    8 MiB per captured size (sizes up to chunked_prefill_size, or max_total_tokens when smaller: 1407-1420); EAGLE-family
    drafts reserve 4096 MiB. 0.5.9: piecewise graphs opt-in, drafts 2048 MiB
    (0.5.9 server_args.py:1043-1057).
    """
    reserved = 512.0
    if chunked > 0:
        reserved += max(chunked, 2048) * 1.5
    reserved += cuda_graph_max_bs * 2
    reserved += tp * pp / 8.0 * 1024
    if version >= (0, 5, 10, 0) and not facts.is_multimodal and pp == 1:
        reserved += len(piecewise_graph_tokens(min(chunked, max_total_tokens or chunked))) * 8
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if spec_algo is not None:
        if spec_algo == "STANDALONE":
            reserved += 6 * 1024
        elif spec_algo != "NGRAM":
            reserved += (4 if version >= (0, 5, 10, 0) else 2) * 1024
    mf = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    if facts.is_multimodal:
        layers, hidden = facts.vit_dims()
        factor = 1 - 0.1 * (layers * hidden * hidden / (24.0 * 1024 * 1024) - 1)
        mf = mf * 0.95 * min(max(factor, 0.8), 1.05)
    return mf


def piecewise_graph_tokens(max_tokens):
    """``_generate_piecewise_cuda_graph_tokens`` (0.5.11 server_args.py:1550-1568)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [x for x in sizes if x <= max_tokens]


def gpu_tier_defaults(gpu_mem_mib, tp):
    """(chunked_prefill_size, cuda_graph_max_bs) by GPU memory tier (4096/32 for 35-60 GB, tp<4)."""
    g = gpu_mem_mib / 1024.0
    if g < 20:
        return 2048, 8          # 0.5.11 server_args.py:1319-1325
    if g < 35:
        return 2048, (24 if tp < 4 else 80)
    if g < 60:
        return 4096, (32 if tp < 4 else 160)
    if g < 90:
        return 8192, (256 if tp < 4 else 512)
    return 8192, (256 if tp < 4 else 512)


def mamba_ratio(args, version):
    """``_calculate_mamba_ratio`` (0.5.11 model_runner_kv_cache_mixin.py:180-192): 1 without the radix cache, else 3, plus the
    extra_buffer ping-pong (2 with the overlap scheduler, 1 without; 0.5.9: 1 with speculative decoding, else 2)."""
    if args.disable_radix_cache:
        return 1
    extra = 0
    if args.mamba_scheduler_strategy == "extra_buffer":
        if version >= (0, 5, 10, 0):
            extra = 1 if args.disable_overlap_schedule else 2
        else:
            extra = 1 if args.speculative_algorithm is not None else 2
    return 3 + extra


class PoolPlan(object):
    """``profile_max_num_token`` + ``handle_max_mamba_cache`` + ``init_memory_pool``."""

    def __init__(self, facts, args, total_gpu_gib, available_gib, version=(0, 5, 11, 0), stage=0):
        tp = args.tp_size
        kv_bytes = dtype_bytes(args.kv_cache_dtype if args.kv_cache_dtype not in (None, "auto") else args.model_dtype, 2)
        kv_layers = stage_kv_layers(facts, getattr(args, "pp_size", 1) or 1)
        # every stage profiles the same (min-reduced) memory; its token count is min-reduced over the stages
        # (0.5.11 model_runner_kv_cache_mixin.py:684-689): the cells of the stage with the most KV layers decide
        self.cell = cell_size(facts, tp, kv_bytes, max(kv_layers))
        self.kv_bytes = kv_bytes
        self.rest_before_mamba = available_gib - total_gpu_gib * (1 - args.mem_fraction_static)
        rest = self.rest_before_mamba
        self.per_req = 0
        self.intermediate_reserved_gib = 0.0
        self.max_mamba_cache_size = None
        draft = args.speculative_num_draft_tokens or 0
        if facts.hybrid:
            self.per_req = mamba_cache_per_req(facts, tp, args.mamba_ssm_dtype or facts.mamba_ssm_dtype)
            if args.speculative_algorithm is not None:
                self.intermediate_reserved_gib = self.per_req * (args.max_running_requests or 0) * draft / GIB
                rest -= self.intermediate_reserved_gib
            if args.max_mamba_cache_size is not None:
                size = args.max_mamba_cache_size
            elif args.disable_radix_cache and args.max_running_requests is not None:
                size = args.max_running_requests
            else:
                raw = rest * args.mamba_full_memory_ratio / (1 + args.mamba_full_memory_ratio)
                size = int(raw * GIB // self.per_req)
            self.max_mamba_cache_size = size
            rest -= size * self.per_req / GIB
        self.rest_gib = rest
        tokens = int(rest * GIB) // self.cell if self.cell else 0
        page = args.page_size or 1
        tokens = tokens // page * page
        self.max_total_num_tokens = tokens
        if args.max_total_tokens is not None and 0 < args.max_total_tokens < tokens:
            self.max_total_num_tokens = args.max_total_tokens // page * page
        ctx = args.context_length
        mrr_cli = args.max_running_requests
        estimated = max(min(int(self.max_total_num_tokens / float(ctx) * 512), 4096), 2048)
        if version >= (0, 5, 10, 0):
            # 0.5.11 model_runner_kv_cache_mixin.py:698-716 (_resolve_max_num_reqs); tp_worker.py:296 takes it as is
            max_num_reqs = min(mrr_cli, estimated) if mrr_cli is not None else min(estimated, self.max_total_num_tokens // 2)
        else:
            # 0.5.9 model_runner_kv_cache_mixin.py:340-368
            max_num_reqs = estimated if mrr_cli is None else mrr_cli
        if facts.hybrid and self.max_mamba_cache_size is not None:
            max_num_reqs = min(max_num_reqs, max(self.max_mamba_cache_size // mamba_ratio(args, version), 0))
        self.req_pool_size = max_num_reqs
        self.fits = self.max_total_num_tokens > 0
        if version >= (0, 5, 10, 0):
            self.max_running_requests = max_num_reqs
        else:
            self.max_running_requests = min(mrr_cli if mrr_cli else self.max_total_num_tokens // 2, self.req_pool_size)
        self.max_req_len = min(ctx - 1, self.max_total_num_tokens - 1)
        # allocations (bytes)
        L = facts.linear_layers
        conv, ssm = mamba_shapes(facts, tp, args.mamba_ssm_dtype or facts.mamba_ssm_dtype) if facts.hybrid else (0, 0)
        size = (self.max_mamba_cache_size or 0) + 1
        self.conv_bytes = L * size * conv
        self.ssm_bytes = L * size * ssm
        if facts.hybrid and args.speculative_algorithm is not None:
            spec_size = (args.max_running_requests or 0) + 1
            self.inter_ssm_bytes = L * spec_size * draft * ssm
            self.inter_conv_bytes = L * spec_size * draft * conv
        else:
            self.inter_ssm_bytes = self.inter_conv_bytes = 0
        self.mamba_bytes = self.conv_bytes + self.ssm_bytes + self.inter_ssm_bytes + self.inter_conv_bytes if facts.hybrid else 0
        n = max(self.max_total_num_tokens, 0) + page
        layers = kv_layers[stage]
        heads = kv_heads_per_rank(facts, tp)
        self.k_bytes = n * heads * facts.head_dim * layers * kv_bytes
        self.v_bytes = n * heads * facts.v_head_dim * layers * kv_bytes
        self.req_to_token_bytes = (max_num_reqs + 1) * (ctx + 4) * 4
        self.draft_k_bytes = n * heads * facts.head_dim * 1 * kv_bytes
        self.draft_v_bytes = n * heads * facts.v_head_dim * 1 * kv_bytes

    def as_dict(self):
        keys = ("cell", "rest_before_mamba", "per_req", "intermediate_reserved_gib", "max_mamba_cache_size", "rest_gib",
                "max_total_num_tokens", "req_pool_size", "max_running_requests", "max_req_len", "mamba_bytes",
                "k_bytes", "v_bytes")
        return dict((k, getattr(self, k)) for k in keys)


def cuda_graph_mib(max_bs):
    return 256 + 12 * max_bs


def draft_graph_mib(max_bs):
    return 96 + 4 * max_bs
