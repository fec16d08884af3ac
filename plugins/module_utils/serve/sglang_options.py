# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SGLang server's options, one row each: the one table the unit, the memory plan and the role read.

Each row: SGLang's option name (``tp_size``; the flag is ``--tp-size``), its type, its range or choices, what the
memory plan does with it (``memory``, with ``why``), SGLang 0.5.11's default (the ``ServerArgs`` dataclass,
sglang/srt/server_args.py, the line in ``why`` or beside the row) and an example value (the remedies quote it).

- sglang_unit renders ExecStart in :data:`FLAG_ORDER` and refuses what :func:`problems` finds before the running
  server is touched;
- sglang_plan takes its defaults from the ``sized`` rows (:func:`plan_defaults`) and sglang_unit.plan_options passes
  exactly those rows to it; an option set without a row, or with an ``unmodelled`` one, is named by :func:`unplanned`
  (the serve stage warns);
- the role's argument spec types the options it sets by default as this table does
  (tests/unit/plugins/module_utils/test_sglang_options.py).

``memory``: SIZED the plan computes with it (a different value gives different figures); GPUS which or how many GPUs
the plan sizes; NONE no effect on GPU memory; UNMODELLED changes memory, not in the plan (``why`` says which way);
REFUSED never reaches ExecStart. Adding a memory-relevant flag: docs/DEVELOPING.md "Adding a memory-relevant flag".
Standard library only; runs on the target's Python 3.9+.
"""

from __future__ import annotations

from collections import namedtuple

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container.compat import InvalidVersion, compare

SIZED, GPUS, NONE, UNMODELLED, REFUSED = "sized", "gpus", "none", "unmodelled", "refused"
Option = namedtuple("Option", "name type memory why default example low high strict choices what")

_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")                    # server_args.py:4398-4401
_KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")            # 4428-4431
_SPEC = ("DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")                    # 5367
_MAMBA_DTYPES = ("float32", "bfloat16", "float16")                                       # 5731
_STRATEGIES = ("auto", "no_buffer", "extra_buffer")                                      # 246


def _o(name, type_, memory, why, default=None, example=None, low=None, high=None, strict=False, choices=None, what=None):
    return Option(name, type_, memory, why, default, example, low, high, strict, choices, what)


_POSITIVE = dict(low=1, what="a positive whole number")
# ExecStart's order: these rows first, in this order; every other option follows sorted by name (a row added below
# them never moves a running server's flags, which would restart it).
_ORDERED = (
    _o("model_path", "str", NONE, "which model; the plan reads its config.json and safetensors index from model_dir"),
    _o("tokenizer_path", "str", NONE, "tokenizer files only"),
    _o("served_model_name", "str", NONE, "the name clients use"),
    _o("revision", "str", NONE, "the plan reads the files in model_dir, whatever their revision"),
    _o("trust_remote_code", "bool", NONE, "code loading only", False),
    _o("dtype", "str", SIZED, "weights and activations: the checkpoint's bytes x this dtype's / the checkpoint's; the KV "
       "cache's with kv_cache_dtype auto", "auto", "bfloat16", choices=_DTYPES),
    _o("quantization", "str", UNMODELLED, "the plan sizes the checkpoint as stored: online quantization (fp8 of a bf16 "
       "checkpoint) loads fewer bytes than planned, so the plan errs on the safe side", None, "fp8"),
    _o("kv_cache_dtype", "str", SIZED, "bytes per KV cell (pool_configurator.py:158-165)", "auto", "fp8_e4m3", choices=_KV_DTYPES),
    _o("tp_size", "int", SIZED, "weights, KV heads and GDN state split over the ranks", 1, 2, what="a positive number of GPUs", low=1),
    _o("dp_size", "int", GPUS, "each data-parallel replica holds the whole model on its own GPUs (gpus_needed); the plan "
       "of one replica holds for each", 1, 2, **_POSITIVE),
    _o("pp_size", "int", SIZED, "the decoder layers split over pipeline stages (distributed/utils.py:99-135): the largest "
       "stage's weights and KV layers per GPU", 1, 2, **_POSITIVE),
    _o("context_length", "int", SIZED, "one full-length request must fit the KV pool; request slots (null: the model's "
       "max_position_embeddings)", None, 65536,
       low=1, what="a positive number of tokens"),
    _o("mem_fraction_static", "float", SIZED, "the reserve (1 - it) of the free memory left out of the pools (null: SGLang's "
       "default for the card, sglang_rules.default_mem_fraction_static)", None, 0.85,
       low=0.0, high=1.0, strict=True, what="a fraction of each GPU's memory strictly between 0 and 1"),
    _o("max_running_requests", "int", SIZED, "request slots, the GDN state pool (radix cache off) and the speculative "
       "reservation", None, 16, low=1, what="a positive number"),
    _o("max_total_tokens", "int", SIZED, "caps the KV pool's tokens (model_runner_kv_cache_mixin.py:668-691) and the "
       "piecewise CUDA graph sizes of the default mem_fraction_static (server_args.py:1416-1420)", None, 131072,
       low=1, what="a positive number of tokens"),
    _o("chunked_prefill_size", "int", SIZED, "the default mem_fraction_static's activation reserve (server_args.py:1434-1484)",
       None, 4096, what="a whole number of tokens (-1 turns chunked prefill off)"),
    _o("max_mamba_cache_size", "int", SIZED, "the GDN/mamba state slots", None, 64, **_POSITIVE),
    _o("mamba_ssm_dtype", "str", SIZED, "bytes of the GDN temporal state (null: $SGLANG_MAMBA_SSM_DTYPE, else the config's, "
       "else float32)", None, "bfloat16", choices=_MAMBA_DTYPES),
    _o("disable_radix_cache", "bool", SIZED, "the GDN state pool follows max_running_requests; the mamba ratio", False, True),
    _o("speculative_algorithm", "str", SIZED, "the speculative reservation, the draft's weights and KV, 48 requests by "
       "default", None, "NEXTN", choices=_SPEC),
    _o("speculative_num_steps", "int", SIZED, "draft tokens (topk 1: steps + 1)", None, 3, **_POSITIVE),
    _o("speculative_eagle_topk", "int", SIZED, "draft tokens; topk > 1 turns the overlap scheduler off", None, 2, **_POSITIVE),
    _o("speculative_num_draft_tokens", "int", SIZED, "the speculative reservation per request", None, 4, **_POSITIVE),
    _o("cuda_graph_max_bs", "int", SIZED, "the default mem_fraction_static's CUDA graph reserve", None, 16, **_POSITIVE),
    _o("disable_cuda_graph", "bool", NONE, "CUDA graphs come out of the reserve the plan leaves; the pools are the same", False),
    _o("disable_custom_all_reduce", "bool", NONE, "its buffers are within the pre-weights estimate "
       "(sglang_rules.PRE_WEIGHTS_MIB)", False),
    _o("nnodes", "int", SIZED, "each node plans its own share of the tp_size x pp_size GPUs", 1, 2, **_POSITIVE),
    _o("node_rank", "int", SIZED, "which node this is (the plan's node figures)", 0, 1, low=0, what="0 .. nnodes-1"),
    _o("dist_init_addr", "str", NONE, "the nodes' rendezvous"),
    _o("host", "str", NONE, "the listening address", "127.0.0.1"),
    _o("port", "int", NONE, "the listening port", 30000, 30000, low=1, high=65535, what="a TCP port from 1 to 65535"),
    _o("api_key", "str", REFUSED, "goes through the --config secret file (sglang_unit.secret_config)"),
)
_BY_NAME = (
    _o("base_gpu_id", "int", GPUS, "the first GPU the plan sizes (sglang_serve.plan_launch)", 0, 0, low=0, what="a GPU index from 0"),
    _o("config", "str", REFUSED, "the --config file is the collection's, holding the API key"),
    _o("disable_overlap_schedule", "bool", SIZED, "the mamba ratio with extra_buffer (model_runner_kv_cache_mixin.py:180-192)",
       False, True),
    _o("disable_piecewise_cuda_graph", "bool", SIZED, "the default mem_fraction_static's piecewise graph reserve "
       "(server_args.py:1456-1463)", False, True),
    _o("dist_timeout", "int", NONE, "how long the ranks wait for each other (torch.distributed)", None, 600,
       low=1, what="a positive number of seconds"),
    _o("enable_dp_attention", "bool", GPUS, "the replicas share their tp_size GPUs (gpus_needed)", False),
    _o("enable_metrics", "bool", NONE, "Prometheus metrics at GET /metrics on the server's port, never behind the API key "
       "(server_args.py:424, 4876-4880; utils/auth.py:100; 0.5.23: arg_groups/fields/observability.py:70)", False, True),
    _o("enable_torch_compile", "bool", SIZED, "no piecewise CUDA graphs, so no reserve for them (server_args.py:1207-1208)",
       False, True),
    _o("extra", "list", UNMODELLED, "verbatim arguments: the plan cannot read them"),
    _o("mamba_full_memory_ratio", "float", SIZED, "the GDN state's share of the rest (radix cache on)", 0.9, 0.5,
       low=0.0, strict=True, what="a positive ratio"),
    _o("mamba_scheduler_strategy", "str", SIZED, "extra_buffer's ping-pong slots in the mamba ratio (auto is no_buffer, "
       "server_args.py:1079-1082)", "auto", "extra_buffer", choices=_STRATEGIES),
    _o("page_size", "int", SIZED, "the KV pool's tokens are whole pages", None, 64, **_POSITIVE),
    _o("reasoning_parser", "str", NONE, "parses output only"),
    _o("tool_call_parser", "str", NONE, "parses output only"),
)
OPTIONS = _ORDERED + _BY_NAME
ROWS = dict((o.name, o) for o in OPTIONS)
FLAG_ORDER = tuple(o.name for o in _ORDERED)
NOT_FLAGS = frozenset(["extra"])

_LAZY = _STRATEGIES + ("extra_buffer_lazy",)
# Where a release's flag or choices differ from 0.5.11's: the option keeps its one name here, the flag rendered (and
# checked) is the installed release's. (first release, its flag, its choices (None: the row's), where in its wheel under
# sglang/srt/). A bool option whose new flag takes a value carries it ("--x=value"). 0.5.14 made the old flags
# deprecated aliases (server_args.py:6349-6395); 0.5.20 removed them ("unrecognized arguments").
RENAMED = {
    "mamba_scheduler_strategy": (
        ("0.5.13", "--mamba-scheduler-strategy", _LAZY, "server_args.py:297-302"),
        ("0.5.14", "--mamba-radix-cache-strategy", _LAZY, "server_args.py:1731-1737 (0.5.23: arg_groups/fields/exec_.py:512-519)")),
    "cuda_graph_max_bs": (
        ("0.5.14", "--cuda-graph-max-bs-decode", None, "server_args.py:1939-1942 (0.5.23: arg_groups/fields/exec_.py:629-631)"),),
    "disable_piecewise_cuda_graph": (
        ("0.5.14", "--cuda-graph-backend-prefill=disabled", None, "server_args.py:6388-6395 (0.5.23: arg_groups/fields/exec_.py:621-628)"),),
}


def _since(version, first):
    """Whether ``version`` is ``first`` or later; no version, or one that is not PEP 440, is taken as 0.5.11."""
    try:
        return bool(version) and compare(version, first) >= 0
    except InvalidVersion:
        return False


def spelling(name, version=None):
    """(flag, choices) of an option in this SGLang release (None: 0.5.11, the collection's pin)."""
    out = ("--" + name.replace("_", "-"), ROWS[name].choices if name in ROWS else None)
    for first, spelled, choices, _where in RENAMED.get(name, ()):
        if _since(version, first):
            out = (spelled, choices or out[1])
    return out


def flag(name, version=None):
    """The command-line flag of an option in this SGLang release (``tp_size`` -> ``--tp-size``; None: 0.5.11's)."""
    return spelling(name, version)[0]


def names(*memory):
    """The rows' names whose ``memory`` is one of these."""
    return tuple(o.name for o in OPTIONS if o.memory in memory)


def plan_defaults():
    """SGLang's default of every row the plan computes with."""
    return dict((o.name, o.default) for o in OPTIONS if o.memory == SIZED)


def unplanned(options):
    """(options set without a row, rows set whose memory effect is not modelled): names, sorted."""
    given = sorted(k for k, v in (options or {}).items() if v is not None and v is not False)
    return [k for k in given if k not in ROWS], [k for k in given if k in ROWS and ROWS[k].memory == UNMODELLED]


def _give(o):
    what = o.what or ("one of %s" % ", ".join(o.choices) if o.choices else "a %s" % o.type)
    return "%s, e.g. %s" % (what, o.example) if o.example is not None else what


def _number_problem(o, value):
    try:
        num = float(value)
    except (TypeError, ValueError):
        return "%s=%r is not a number; give %s" % (o.name, value, _give(o))
    low = o.low is not None and (num <= o.low if o.strict else num < o.low)
    high = o.high is not None and (num >= o.high if o.strict else num > o.high)
    if low or high or (o.type == "int" and num != int(num)):
        return "%s=%s is out of range; give %s" % (o.name, value, _give(o))
    return None


def _problem(o, value, version=None):
    spelled, choices = spelling(o.name, version)
    o = o._replace(choices=choices)
    if o.type in ("int", "float"):
        return "%s=%r is not a number; give %s" % (o.name, value, _give(o)) if isinstance(value, bool) else _number_problem(o, value)
    if o.type == "bool":
        return None if isinstance(value, bool) else "%s=%r is not true or false; true gives the flag %s" % (o.name, value, spelled)
    if o.type == "list":
        return None if isinstance(value, (list, tuple)) else "%s=%r is not a list" % (o.name, value)
    if isinstance(value, (bool, list, tuple, dict)):
        return "%s=%r is not a single value; give %s" % (o.name, value, _give(o))
    if o.choices and str(value) not in o.choices:
        renamed = " (its flag %s)" % spelled if spelled != "--" + o.name.replace("_", "-") else ""
        return "%s=%r is not one of SGLang %s's choices%s: %s" % (o.name, value, version or "0.5.11", renamed, ", ".join(o.choices))
    return None


def problems(options, version=None):
    """[(key, message)] for each option with a row whose value SGLang ``version`` (None: 0.5.11) would refuse or
    misread: its type, range or choices (checked before the running server is touched). null and false leave an option
    out: never a problem."""
    out = []
    for key in sorted(options or {}):
        value = options[key]
        if key in ROWS and value is not None and value is not False and ROWS[key].memory != REFUSED:
            msg = _problem(ROWS[key], value, version)
            if msg:
                out.append((key, msg))
    return out
