"""The real flags (a plain argparse.ArgumentParser, so errors exit 2 like the real one)
and ServerArgs.__post_init__'s resolution and warnings."""

import argparse
import json
import os
import shutil
import sys

from sglang.srt._kpro_lab import memory, reasoning, releases, util
from sglang.srt._kpro_lab.flags_0_5_11 import FLAGS as REAL_FLAGS
from sglang.version import __version__

SPEC_CHOICES = ["DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]  # 0.5.11 server_args.py:5364-5372
# 0.5.11 server_args.py:5077-5097: choices=list(ReasoningParser.DetectorMap.keys()) (parser/reasoning_parser.py:542-561)
# and list(FunctionCallParser.ToolCallParserEnum.keys()) (function_call/function_call_parser.py:54-80)
REASONING_PARSER_CHOICES = list(reasoning.PARSERS)
TOOL_CALL_PARSER_CHOICES = ["deepseekv3", "deepseekv31", "deepseekv32", "glm", "glm45", "glm47", "gpt-oss", "kimi_k2", "lfm2", "llama3",
                            "mimo", "mistral", "pythonic", "qwen", "qwen25", "qwen3_coder", "step3", "step3p5", "minimax-m2", "trinity",
                            "interns1", "hermes", "hunyuan", "gigachat3", "gemma4"]

# 0.5.11 server_args.py:89-162 (the lists the parser's choices= name)
SAMPLING_BACKEND_CHOICES = {"flashinfer", "pytorch", "ascend"}
LOAD_FORMAT_CHOICES = ["auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes", "mistral", "layered",
                       "flash_rl", "remote", "remote_instance", "fastsafetensors", "private", "runai_streamer"]
QUANTIZATION_CHOICES = ["awq", "fp8", "mxfp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
                        "modelopt_fp8", "modelopt_fp4", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq",
                        "w4afp8", "mxfp4", "auto-round", "compressed-tensors", "modelslim", "quark_int4fp8_moe", "unquant"]
ATTENTION_BACKEND_CHOICES = ["triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla",
                             "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave", "intel_amx", "ascend", "intel_xpu"]
GRAMMAR_BACKEND_CHOICES = ["xgrammar", "outlines", "llguidance", "none"]                   # server_args.py:170


def human_readable_int(value):
    """0.5.11 sglang/srt/utils/common.py:2328-2363, the type of --context-length, --max-total-tokens and
    --max-prefill-tokens (server_args.py:4268, 4504, 4530): 64k, 1Mi or a plain integer; else the same refusal."""
    import re
    from decimal import Decimal
    value = value.strip()
    si, iec = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}, {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    "Decimals are not allowed with IEC suffixes like '%s'. Use an integer IEC value such as '%s%s', "
                    "or an SI value such as '%s%s'." % (suffix, int(Decimal(number)), suffix, number, suffix[0]))
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Invalid integer value: '%s'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive." % value)


# (flags, kwargs); dest order is the order of the server_args=ServerArgs(...) repr. Types and choices are the real
# parser's (0.5.11 server_args.py:4187-6600, the line beside a row that differs from a plain type).
_STR, _INT, _FLOAT, _HINT = str, int, float, human_readable_int
OPTIONS = [
    (("--model-path", "--model"), dict(type=_STR, required=True)),
    (("--tokenizer-path",), dict(type=_STR)),
    (("--tokenizer-mode",), dict(type=_STR, default="auto", choices=["auto", "slow"])),
    (("--tokenizer-worker-num",), dict(type=_INT, default=1)),
    (("--skip-tokenizer-init",), dict(action="store_true")),
    (("--load-format",), dict(type=_STR, default="auto", choices=LOAD_FORMAT_CHOICES)),  # 4232
    (("--model-loader-extra-config",), dict(type=_STR, default="{}")),
    (("--trust-remote-code",), dict(action="store_true")),
    (("--context-length",), dict(type=_HINT)),  # 4266
    (("--is-embedding",), dict(action="store_true")),
    (("--enable-multimodal",), dict(action="store_true", default=None)),
    (("--revision",), dict(type=_STR)),
    (("--model-impl",), dict(type=_STR, default="auto")),
    (("--host",), dict(type=_STR, default="127.0.0.1")),
    (("--port",), dict(type=_INT, default=30000)),
    (("--skip-server-warmup",), dict(action="store_true")),
    (("--warmups",), dict(type=_STR)),
    (("--nccl-port",), dict(type=_INT)),
    (("--dtype",), dict(type=_STR, default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])),
    (("--quantization",), dict(type=_STR, choices=QUANTIZATION_CHOICES)),  # 4411
    (("--kv-cache-dtype",), dict(type=_STR, default="auto", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"])),  # 4427
    (("--mem-fraction-static",), dict(type=_FLOAT)),
    (("--max-running-requests",), dict(type=_INT)),
    (("--max-queued-requests",), dict(type=_INT)),
    (("--max-total-tokens",), dict(type=_HINT)),  # 4504
    (("--chunked-prefill-size",), dict(type=_INT)),
    (("--max-prefill-tokens",), dict(type=_HINT, default=16384)),  # 4530
    (("--schedule-policy",), dict(type=_STR, default="fcfs",
                                  choices=["lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key"])),  # 4537
    (("--schedule-conservativeness",), dict(type=_FLOAT, default=1.0)),
    (("--page-size",), dict(type=_INT, default=1)),
    (("--tensor-parallel-size", "--tp-size"), dict(type=_INT, default=1, dest="tp_size")),
    (("--pipeline-parallel-size", "--pp-size"), dict(type=_INT, default=1, dest="pp_size")),
    (("--data-parallel-size", "--dp-size"), dict(type=_INT, default=1, dest="dp_size")),
    (("--stream-interval",), dict(type=_INT, default=1)),
    (("--random-seed",), dict(type=_INT)),
    (("--watchdog-timeout",), dict(type=_FLOAT, default=300)),
    (("--dist-timeout",), dict(type=_INT)),
    (("--download-dir",), dict(type=_STR)),
    (("--base-gpu-id",), dict(type=_INT, default=0)),
    (("--gpu-id-step",), dict(type=_INT, default=1)),
    (("--device",), dict(type=_STR)),
    (("--log-level",), dict(type=_STR, default="info")),
    (("--log-level-http",), dict(type=_STR)),
    (("--log-requests",), dict(action="store_true")),
    (("--log-requests-level",), dict(type=_INT, default=2, choices=[0, 1, 2, 3])),  # 4834
    (("--show-time-cost",), dict(action="store_true")),
    (("--decode-log-interval",), dict(type=_INT, default=40)),
    (("--enable-metrics",), dict(action="store_true")),
    (("--enable-metrics-for-all-schedulers",), dict(action="store_true")),
    (("--api-key",), dict(type=_STR)),
    (("--admin-api-key",), dict(type=_STR)),
    (("--served-model-name",), dict(type=_STR)),
    (("--chat-template",), dict(type=_STR)),
    (("--completion-template",), dict(type=_STR)),
    (("--file-storage-path",), dict(type=_STR, default="sglang_storage")),
    (("--enable-cache-report",), dict(action="store_true")),
    (("--reasoning-parser",), dict(type=_STR, choices=REASONING_PARSER_CHOICES)),
    (("--tool-call-parser",), dict(type=_STR, choices=TOOL_CALL_PARSER_CHOICES)),
    (("--tool-server",), dict(type=_STR)),
    (("--load-balance-method",), dict(type=_STR, default="round_robin",
                                      choices=["auto", "round_robin", "follow_bootstrap_room", "total_requests",
                                               "total_tokens"])),  # 5123
    (("--dist-init-addr", "--nccl-init-addr"), dict(type=_STR, dest="dist_init_addr")),
    (("--nnodes",), dict(type=_INT, default=1)),
    (("--node-rank",), dict(type=_INT, default=0)),
    (("--json-model-override-args",), dict(type=_STR, default="{}")),
    (("--speculative-algorithm",), dict(type=_STR, choices=SPEC_CHOICES)),
    (("--speculative-draft-model-path", "--speculative-draft-model"), dict(type=_STR, dest="speculative_draft_model_path")),
    (("--speculative-draft-model-revision",), dict(type=_STR)),
    (("--speculative-num-steps",), dict(type=_INT)),
    (("--speculative-eagle-topk",), dict(type=_INT)),
    (("--speculative-num-draft-tokens",), dict(type=_INT)),
    (("--speculative-accept-threshold-single",), dict(type=_FLOAT, default=1.0)),
    (("--speculative-accept-threshold-acc",), dict(type=_FLOAT, default=1.0)),
    (("--speculative-token-map",), dict(type=_STR)),
    (("--speculative-attention-mode",), dict(type=_STR, default="prefill", choices=["prefill", "decode"])),  # 5444
    (("--attention-backend",), dict(type=_STR, choices=ATTENTION_BACKEND_CHOICES)),  # 5263
    (("--prefill-attention-backend",), dict(type=_STR, choices=ATTENTION_BACKEND_CHOICES)),  # 5270
    (("--decode-attention-backend",), dict(type=_STR, choices=ATTENTION_BACKEND_CHOICES)),  # 5277
    (("--sampling-backend",), dict(type=_STR, choices=SAMPLING_BACKEND_CHOICES)),  # 5284
    (("--grammar-backend",), dict(type=_STR, choices=GRAMMAR_BACKEND_CHOICES)),  # 5291
    (("--mm-attention-backend",), dict(type=_STR, choices=["sdpa", "fa3", "fa4", "triton_attn", "ascend_attn", "aiter_attn",
                                                           "flashinfer_cudnn"])),  # 5298
    (("--mamba-ssm-dtype",), dict(type=_STR, choices=["float32", "bfloat16", "float16"])),
    (("--mamba-full-memory-ratio",), dict(type=_FLOAT, default=0.9)),
    (("--max-mamba-cache-size",), dict(type=_INT)),
    (("--mamba-scheduler-strategy",), dict(type=_STR, default="auto", choices=["auto", "no_buffer", "extra_buffer"])),
    (("--mamba-track-interval",), dict(type=_INT, default=256)),
    (("--mamba-backend",), dict(type=_STR, default="triton", choices=["triton", "flashinfer"])),
    (("--disable-radix-cache",), dict(action="store_true")),
    (("--cuda-graph-max-bs",), dict(type=_INT)),
    (("--cuda-graph-bs",), dict(type=_INT, nargs="+")),
    (("--disable-cuda-graph",), dict(action="store_true")),
    (("--disable-cuda-graph-padding",), dict(action="store_true")),
    (("--enable-torch-compile",), dict(action="store_true")),
    (("--torch-compile-max-bs",), dict(type=_INT, default=32)),
    (("--disable-custom-all-reduce",), dict(action="store_true")),
    (("--enable-p2p-check",), dict(action="store_true")),
    (("--disable-overlap-schedule",), dict(action="store_true")),
    (("--enable-mixed-chunk",), dict(action="store_true")),
    (("--enable-dp-attention",), dict(action="store_true")),
    (("--disable-chunked-prefix-cache",), dict(action="store_true")),
    (("--disable-fast-image-processor",), dict(action="store_true")),
    (("--keep-mm-feature-on-device",), dict(action="store_true")),
    (("--enable-hierarchical-cache",), dict(action="store_true")),
    (("--hicache-ratio",), dict(type=_FLOAT, default=2.0)),
    (("--allow-auto-truncate",), dict(action="store_true")),
    (("--enable-custom-logit-processor",), dict(action="store_true")),
    (("--enable-deterministic-inference",), dict(action="store_true")),
    (("--triton-attention-num-kv-splits",), dict(type=_INT, default=8)),
    (("--num-continuous-decode-steps",), dict(type=_INT, default=1)),
    (("--crash-dump-folder",), dict(type=_STR)),
]


class _Deprecated(argparse.Action):
    """Real 0.5.11 DeprecatedAction (server_args.py:7433): no value, a warning."""

    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super(_Deprecated, self).__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stderr.write("The command line argument '%s' is deprecated and will be removed in future versions.\n" % option_string)


def add_cli_args(parser, version=__version__):
    """The modelled OPTIONS, then every other flag of the real 0.5.11 (flags_0_5_11.py) as the real parser declares
    it (value, bare flag, --x/--no-x), so the option names accepted are exactly the real ones; then what the release
    table says ``version`` changed (releases.py): a removed flag is not declared (argparse: "unrecognized arguments"),
    a deprecated one warns and stores where its replacement does, and the replacements are declared."""
    seen = set()
    for flags, kw in OPTIONS:
        seen.update(flags)
        kw = releases.old_argument(flags[0], kw, version)
        if kw is not None:
            parser.add_argument(*flags, **kw)
    for flags, kw in releases.new_arguments(version):
        parser.add_argument(*flags, **kw)
    for flags, kind, nargs, dest in REAL_FLAGS:
        if seen.intersection(flags):
            continue
        if kind == "store_true" and flags[0] in releases.changes(version)[1]:
            continue
        if kind == "store_true" and flags[0] in releases.changes(version)[0]:
            parser.add_argument(*flags, **releases.old_argument(flags[0], {"action": "store_true", "dest": dest}, version))
            continue
        kw = {"dest": dest} if dest else {}
        if kind == "store_true":
            kw["action"] = "store_true"
        elif kind == "bool_optional":
            kw.update(action=argparse.BooleanOptionalAction if hasattr(argparse, "BooleanOptionalAction") else "store_true")
        elif kind == "deprecated":
            kw["action"] = _Deprecated
        elif nargs is not None:
            kw["nargs"] = nargs
        parser.add_argument(*flags, **kw)
    return parser


def build_parser():
    return add_cli_args(argparse.ArgumentParser(prog="sglang serve"))


def merge_config(argv):
    """Real 0.5.11 prepare_server_args (server_args.py:7280) + ConfigArgumentMerger (server_args_config_parser.py):
    ``--config <file.yaml>``: the file's keys become ``--key value`` arguments placed before the command line's
    (CLI > config > defaults), in this process only (the process's argv is unchanged)."""
    if "--config" not in argv:
        return argv
    idx = [i for i, x in enumerate(argv) if x == "--config"]
    if len(idx) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    i = idx[0]
    if i == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = argv[i + 1]
    if os.path.splitext(path)[1].lower() not in (".yaml", ".yml"):
        raise ValueError("Config file must be YAML format, got: %s" % os.path.splitext(path)[1])
    if not os.path.exists(path):
        raise ValueError("Config file not found: %s" % path)
    with open(path) as f:
        data = _load_yaml(f.read()) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    out = []
    for key, value in data.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
        elif isinstance(value, list):
            out += [flag] + [str(v) for v in value]
        else:
            out += [flag, str(value)]
    return out + argv[:i] + argv[i + 2:]


def _load_yaml(text):
    """yaml.safe_load when PyYAML is there (real SGLang depends on it); else the flat ``key: scalar`` subset with
    JSON-quoted strings that kpro.gpu_serving writes."""
    try:
        import yaml
        return yaml.safe_load(text)
    except ImportError:
        pass
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _sep, val = line.partition(":")
        val = val.strip()
        try:
            out[key.strip()] = json.loads(val)
        except ValueError:
            out[key.strip()] = val
    return out


def field_order():
    out = []
    for flags, kw in OPTIONS:
        out.append(kw.get("dest") or flags[0][2:].replace("-", "_"))
    return out


class ServerArgs(object):
    """The resolved arguments; repr like the real dataclass."""

    def __init__(self, ns):
        self.__dict__.update(vars(ns))
        self._order = field_order()

    def asdict(self):
        return dict((k, getattr(self, k)) for k in self._order)

    def __repr__(self):
        return "ServerArgs(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self._order)

    def log_text(self, version=__version__):
        """The startup line. Up to 0.5.18 ``logger.info(f"{server_args=}")``, the dataclass repr (0.5.11
        entrypoints/engine.py:679, 0.5.18 :1095); from 0.5.19 the resolved fields as a dict
        (``f"server_args={server_args.resolved_dict()}"``, 0.5.19 engine.py:1098; 0.5.23 :1185 through
        _server_args_for_logging, 173-174). The fields a release renamed carry its name (releases.field_name)."""
        pairs = [(releases.field_name(k, version), getattr(self, k)) for k in self._order]
        if releases.vt(version) >= releases.vt("0.5.19"):
            return "server_args=%r" % (dict(pairs),)
        return "server_args=ServerArgs(%s)" % ", ".join("%s=%r" % kv for kv in pairs)


def version_tuple(v=__version__):
    parts = []
    for p in v.replace(".post", ".").split("."):
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    while len(parts) < 4:
        parts.append(0)
    return tuple(parts)


def prepare(argv):
    """argparse + __post_init__. Returns (ServerArgs, ModelFacts); raises like the real one."""
    ns = build_parser().parse_args(merge_config(list(argv)))
    a = ServerArgs(ns)
    util.set_levels(a.log_level, a.log_level_http)
    if a.tokenizer_path is None:
        a.tokenizer_path = a.model_path
    if a.served_model_name is None:
        a.served_model_name = a.model_path
    if not os.path.isfile(os.path.join(a.model_path, "config.json")):
        raise OSError("%s does not appear to have a file named config.json. Checkout 'https://huggingface.co/%s/tree/None' for available files."
                      % (a.model_path, a.model_path))
    facts = memory.ModelFacts(a.model_path)
    if shutil.which("nvidia-smi") is None:
        raise RuntimeError("nvidia-smi not found. Ensure NVIDIA drivers are installed and accessible.")
    a.model_dtype = "float32" if a.dtype in ("float", "float32") else "bfloat16" if a.dtype == "auto" else a.dtype
    derived = facts.max_position_embeddings
    if a.context_length is None:
        a.context_length = derived
    elif a.context_length > derived and os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() not in ("1", "true"):
        raise ValueError(
            "User-specified context_length (%d) is greater than the derived context_length (%d). This may lead to incorrect model outputs "
            "or CUDA errors. Note that the derived context_length may differ from max_position_embeddings in the model's config. "
            "To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" % (a.context_length, derived))
    if a.enable_multimodal is None:
        a.enable_multimodal = facts.is_multimodal
    # GPU memory tier defaults (gpu_mem = min memory.total over the visible GPUs, like nvidia-smi)
    from sglang.srt._kpro_lab import gpustate
    gpus = visible_gpus(gpustate.load_or_empty().get("gpus", []))
    gpu_mem = min(g["mem_total_mib"] for _idx, g in gpus) if gpus else None
    chunk_d, bs_d = memory.gpu_tier_defaults(gpu_mem or 49140, a.tp_size)
    if a.chunked_prefill_size is None:
        a.chunked_prefill_size = chunk_d
    if a.cuda_graph_max_bs is None:
        a.cuda_graph_max_bs = max(a.cuda_graph_bs) if a.cuda_graph_bs else bs_d
    if a.attention_backend is None:
        # 0.5.11 _get_default_attn_backend (server_args.py:2510-2514): FlashInfer when it imports (it is a dependency),
        # on the lab's sm_86 GPUs hybrid models too; the triton default for Qwen3-Next/3.5 is sm100's only (2213-2240,
        # 2373-2378), and their linear-attention layers are Triton kernels whatever this says (linear_attn_backend)
        a.attention_backend = "flashinfer"
    if a.mamba_scheduler_strategy == "auto":
        a.mamba_scheduler_strategy = "no_buffer"
    # 0.5.11 _handle_model_specific_adjustments (server_args.py:845) runs before _handle_speculative_decoding (882):
    # the radix/speculative refusal sees the algorithm as given (NEXTN too), then NEXTN becomes EAGLE (3310-3311)
    _mamba_radix_cache(a, facts)
    if a.speculative_algorithm == "NEXTN":
        a.speculative_algorithm = "EAGLE"
    if a.speculative_algorithm is not None and a.speculative_algorithm != "NGRAM":
        if a.speculative_num_steps is None and a.speculative_eagle_topk is None and a.speculative_num_draft_tokens is None:
            a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens = 3, 1, 4
        if a.speculative_num_steps is None:
            a.speculative_num_steps = 3
        if a.speculative_eagle_topk is None:
            a.speculative_eagle_topk = 1
        if a.speculative_num_draft_tokens is None:
            a.speculative_num_draft_tokens = a.speculative_num_steps + 1
    if a.speculative_algorithm is not None:
        # 0.5.11: every algorithm resets it (server_args.py:3430-3434, 3454-3458, 3563-3567)
        if a.max_running_requests is None:
            a.max_running_requests = 48
            util.bare("Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting "
                      "--max-running-requests.")
        _overlap_for_speculative(a)
        if a.speculative_eagle_topk == 1 and a.speculative_num_draft_tokens != a.speculative_num_steps + 1:
            util.bare("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")
            a.speculative_num_draft_tokens = a.speculative_num_steps + 1
    if a.pp_size > 1:
        # 0.5.11 _handle_pipeline_parallelism (server_args.py:3175-3180)
        a.disable_overlap_schedule = True
        util.bare("Pipeline parallelism is incompatible with overlap schedule.")
    if a.mem_fraction_static is None:
        if gpu_mem is None:
            a.mem_fraction_static = 0.88
        else:
            a.mem_fraction_static = memory.default_mem_fraction(gpu_mem, a.tp_size, a.chunked_prefill_size, a.cuda_graph_max_bs,
                                                                a.speculative_algorithm, facts, a.pp_size, version_tuple(),
                                                                a.max_total_tokens)
    return a, facts


# 0.5.11 server_args.py:2138-2296: the hybrid architectures whose mamba radix-cache rules run
# (kept equal to plugins/module_utils/serve/sglang_rules.py MAMBA_RADIX_ARCHS by tests/unit/lab/test_sglang_standin.py)
MAMBA_RADIX_ARCHS = frozenset([
    "NemotronHForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "FalconH1ForCausalLM", "JetNemotronForCausalLM", "JetVLMForConditionalGeneration", "Lfm2ForCausalLM",
])
# the frames of 0.5.11's traceback for a refusal in _handle_mamba_radix_cache (the dataclass's generated
# __init__, File "<string>", is left out)
_REFUSAL_FRAMES = [
    ("sglang/launch_server.py", 66, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
    ("sglang/srt/server_args.py", 7299, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
    ("sglang/srt/server_args.py", 6685, "from_cli_args", "return cls(**{attr: getattr(args, attr) for attr in attrs})"),
    ("sglang/srt/server_args.py", 845, "__post_init__", "self._handle_model_specific_adjustments()"),
    ("sglang/srt/server_args.py", 2236, "_handle_model_specific_adjustments", "self._handle_mamba_radix_cache("),
]


class StartupRefusal(ValueError):
    """A ValueError of ServerArgs.__post_init__ with the frames the real traceback shows (launch() prints them, exit 1)."""

    def __init__(self, msg, line):
        ValueError.__init__(self, msg)
        self.frames = _REFUSAL_FRAMES + [("sglang/srt/server_args.py", line, "_handle_mamba_radix_cache", "raise ValueError(")]


def _mamba_radix_cache(a, facts):
    """0.5.11 _handle_mamba_radix_cache (server_args.py:2366-2456) for a hybrid model, on CUDA."""
    hybrid = facts.arch in MAMBA_RADIX_ARCHS or (facts.arch == "GraniteMoeHybridForCausalLM" and "mamba" in facts.layer_types)
    if not facts.hybrid or (version_tuple() >= (0, 5, 10, 0) and not hybrid):
        return
    if a.mamba_scheduler_strategy == "extra_buffer":
        if a.disable_radix_cache:
            # server_args.py:2397-2401
            raise StartupRefusal("mamba extra_buffer is not compatible with --disable-radix-cache Overlap scheduling is already supported "
                                 "with no_buffer + disable_radix_cache. Please use --mamba-scheduler-strategy no_buffer instead.", 2397)
        return
    if a.disable_radix_cache:
        return
    if a.speculative_algorithm is None:
        # server_args.py:2427-2432
        util.bare("Disabling overlap schedule since mamba no_buffer is not compatible with overlap schedule, try to use "
                  "--disable-radix-cache if overlap schedule is necessary")
        a.disable_overlap_schedule = True
    elif version_tuple() >= (0, 5, 10, 0):
        # server_args.py:2453-2456: two literals joined without a space ("no_buffer.To use")
        raise StartupRefusal("Speculative decoding for %s is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
                             "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set "
                             "SGLANG_ENABLE_SPEC_V2=1." % facts.arch, 2453)
    else:
        # 0.5.9 server_args.py:1762
        util.bare("Disabling radix cache since speculative decoding for %s is not supported with radix cache yet." % facts.arch)
        a.disable_radix_cache = True


def _overlap_for_speculative(a):
    """The overlap scheduler with speculative decoding: 0.5.11 keeps it for EAGLE-family topk 1 (spec v2, on by default,
    server_args.py:3461-3484; environ.py:459); 0.5.9/0.5.10 turn it off unless SGLANG_ENABLE_SPEC_V2 is set."""
    v2_default = version_tuple() >= (0, 5, 11, 0)
    env = os.environ.get("SGLANG_ENABLE_SPEC_V2")
    v2 = v2_default if env is None else env.strip().lower() in ("1", "true", "yes", "on")
    if a.speculative_algorithm == "NGRAM":
        a.disable_overlap_schedule = True
        return
    if not v2_default:
        a.disable_overlap_schedule = True
        util.bare("Overlap scheduler is disabled when spec v2 is off or using unsupported speculative algorithm. You can set env "
                  "SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler. ")
        return
    reason = None
    if a.speculative_eagle_topk is not None and a.speculative_eagle_topk > 1 and not a.disable_overlap_schedule:
        a.disable_overlap_schedule, reason = True, "spec v2 currently only supports topk = 1"
    elif not v2 and not a.disable_overlap_schedule:
        a.disable_overlap_schedule, reason = True, "SGLANG_ENABLE_SPEC_V2=False"
    if a.disable_overlap_schedule:
        util.bare("Spec v1 is used for eagle/eagle3/standalone speculative decoding because %s." % (reason or "overlap schedule is disabled"))
    else:
        util.bare("Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.")


def visible_gpus(state_gpus):
    """[(state index, gpu)] in CUDA order, honouring CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return list(enumerate(state_gpus))
    out = []
    for tok in [t.strip() for t in cvd.split(",") if t.strip()]:
        found = None
        if tok.isdigit():
            i = int(tok)
            if i < len(state_gpus):
                found = i
        else:
            for i, g in enumerate(state_gpus):
                if g.get("uuid") and (g["uuid"] == tok or g["uuid"].startswith(tok)):
                    found = i
        if found is None:
            break  # CUDA stops at the first invalid entry
        out.append((found, state_gpus[found]))
    return out
