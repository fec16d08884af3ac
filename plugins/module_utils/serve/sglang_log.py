# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang 0.5.x server log: parsing into events, per-launch selection, and diagnosis.

Pure functions, standard library only (they run on the target's Python 3.9+).

The log format and the order of the startup lines are those of SGLang 0.5.9
(sglang-0.5.9 wheel: utils/common.py:1216-1234 configure_logger and :2507-2519 set_uvicorn_logging_configs;
the rank tag from managers/scheduler.py:3080-3096; the startup lines in model_executor/model_runner.py):
SGLang's own lines are
``[YYYY-MM-DD HH:MM:SS( TPn)] message`` (scheduler ranks carry a ``TPn`` / ``DPn TPn`` /
``PPn`` tag), uvicorn's lines go through the same timestamp format or its own
``INFO:     message``; exceptions are Python tracebacks, usually wrapped in
``Scheduler hit an exception:``.

The entry points for the gate are :func:`select_launch` (only this launch's part of a log)
and :func:`diagnose` (phase, evidence, remedy, facts).
"""

from __future__ import annotations

import ast
import calendar
import os
import re
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container.compat import RULES as COMPAT_RULES
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.degenerate import detect as detect_degenerate
# The diagnosis vocabulary (DESIGN.md) lives in failure.py, with the host's phases.
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import FORMER_PHASES, PHASES, TERMINAL_PHASES  # noqa: F401 pylint: disable=unused-import
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log_signals as signals

LAUNCH_HEADER = "# kpro-launch-id:"
_LAUNCH_HEADER_RE = re.compile(r"^#\s*kpro-launch-id:\s*(\S+)\s*$")

# Prefixes added by log collectors in front of SGLang's own line, stripped before parsing:
# docker compose ("sglang-1  | "), journald short format ("Mar 01 10:00:00 host python3[123]: ").
_COMPOSE_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]+-\d+\s+\|\s?")
_JOURNAL_PREFIX_RE = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: ")
# Wrappers that re-log SGLang's output through their own formatter, with a timestamp of their own:
# Python logging ("2025-03-07 23:50:27,531 - __main__ - INFO - ") and Rust tracing
# ("2025-11-05T01:56:54.243403Z  INFO model_runner.init_device_graphs: ").
_WRAPPER_PREFIX_RES = (
    re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ - [\w.]+ - [A-Z]+ - "),
    re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d)T(?P<tm>\d\d:\d\d:\d\d)(?:\.\d+)?Z\s+[A-Z]+\s+[\w.<>]+: "),
)

# "[2026-03-01 10:00:05 TP0] msg", "[2026-03-01 10:00:05.123 DP0 TP1] msg", "[23:17:01 TP7] msg" (old),
# "[12-16 14:27:08] msg" (the multimodal runtime's format)
_SGL_LINE_RE = re.compile(
    r"^\[(?P<ts>(?:(?:\d{4}-)?\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?)"
    r"(?P<tags>(?: (?:DP|PP|TP|EP|CP|ATTN_CP|MOE_DP|ATTN_DP)\d+)*)\] ?(?P<msg>.*)$"
)
_RANK_TAG_RE = re.compile(r"(DP|PP|TP|EP|CP|ATTN_CP|MOE_DP|ATTN_DP)(\d+)")
# uvicorn without SGLang's formatter: "INFO:     Started server process [123]"
_UVICORN_BARE_RE = re.compile(r"^(?P<level>INFO|WARNING|ERROR|DEBUG|CRITICAL):\s+(?P<msg>.*)$")

_NUM = r"(-?\d+(?:\.\d+)?)"

# (kind, compiled regex) for the milestones and signatures, searched in the message part.
_MILESTONES = [
    # 0.5.11's dataclass repr "server_args=ServerArgs(...)", from 0.5.19 a dict "server_args={...}" (parse_server_args)
    ("server_args", re.compile(r"^server_args=(?:ServerArgs\(|\{)")),
    # 0.5.21 renamed "Init torch distributed begin." (0.5.20 distributed/bootstrap.py:81) "Init parallel begin." (0.5.21
    # bootstrap.py:118, 0.5.23 :115), still logged before set_device; its end line lost "mem usage=" (0.5.23 :190)
    ("dist_begin", re.compile(r"Init torch distributed begin\.|Init parallel begin\.")),
    # "elapsed=" is missing in some 0.5.x builds
    ("dist_end", re.compile(r"Init (?:torch distributed|parallel) ends\.(?: elapsed=" + _NUM + r" s,?)?(?: mem usage=" + _NUM
                            + r" GB)?")),
    ("weights_begin", re.compile(r"Load weight begin\. avail mem=" + _NUM + r" GB")),
    ("shards", re.compile(r"(?:Loading safetensors checkpoint shards|Multi-thread loading shards):\s+(\d+)% Completed \|\s*(\d+)/(\d+)")),
    ("weights_end", re.compile(r"Load weight end\.")),
    ("mamba_alloc", re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)")),
    # 0.5.13 added "dtype: X, " (mem_cache/memory_pool.py:819), 0.5.17 a pool label ("SWA KV Cache is allocated.",
    # memory_pool.py:1670); with SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1 (off by default) the pool's size is set after
    # the graph capture: "Post-capture KV sizing: KV cache allocated. dtype: ..., #tokens: N" (0.5.17
    # model_executor/model_runner_components/kv_pool_runtime.py:122, 0.5.23 :194-200)
    ("kv_alloc", re.compile(r"(?:KV Cache is allocated|^Post-capture KV sizing: KV cache allocated)\. (?:dtype: [\w.]+, )?"
                            r"#tokens: (\d+)")),
    # every KV pool class is a *TokenToKVPool; some announce themselves before allocating; with post-capture sizing the
    # pool's first line gives an upper bound, not its size ("KV Cache VA upper bound.", 0.5.18 memory_pool.py:1685)
    ("kv_pool_init", re.compile(r"^Initiali[sz]e \w*TokenToKVPool\b|KV Cache VA upper bound\.")),
    ("mem_pool_end", re.compile(r"Memory pool end\. avail mem=" + _NUM + r" GB")),
    # "Capture cuda graph begin.", "Capture draft extend cuda graph begin.", later "Capture target decode CUDA graph begin."
    ("graph_begin", re.compile(r"Capture (?:\w+ ){0,3}(?:cuda|npu|cpu|xpu|hpu|musa) ?graph begin\.", re.I)),
    ("graph_end", re.compile(r"Capture (?:\w+ ){0,3}(?:cuda|npu|cpu|xpu|hpu|musa) ?graph end\.", re.I)),
    # the capture's tqdm bar (sglang-0.5.11 model_executor/cuda_graph_runner.py:870)
    ("graph_progress", re.compile(r"Capturing batches \(bs=")),
    ("max_total_tokens", re.compile(r"max_total_num_tokens=(\d+)")),
    ("uvicorn_started", re.compile(r"Started server process \[(\d+)\]")),
    ("app_startup", re.compile(r"Application startup complete\.")),
    ("uvicorn_running", re.compile(r"Uvicorn running on (\S+)")),
    ("ready", re.compile(r"The server is fired up and ready to roll!")),
    ("prefill", re.compile(r"Prefill batch[.,] ")),
    ("decode", re.compile(r"Decode batch[.,] ")),
    ("mem_unbalanced", re.compile(r"The memory capacity is unbalanced")),
    ("profiled_negative", re.compile(r"is larger than the profiled value (-?\d+)")),
    # failure signatures
    ("scheduler_exception", re.compile(r"Scheduler hit an exception")),
    # 0.4.x wrote "proces"
    ("sigquit", re.compile(r"Received sigquit from a child process?\b")),
    ("scheduler_dead", re.compile(r"Rank (\d+) scheduler is dead")),
    # 0.5.10+: "Rank N scheduler died during initialization (exit code: X). If exit code is -9 (SIGKILL), ..."
    ("scheduler_died", re.compile(r"Rank (\d+) scheduler died during initialization \(exit code: (-?\d+)\)")),
    # 0.5.9 prints the exit code of a dead scheduler on a line of its own
    ("exit_code", re.compile(r"^Exit code: (-?\d+)\s*$")),
    ("not_enough_memory", re.compile(r"Not enough memory(?: to allocate KV cache)?\. Please try to increase --mem-fraction-static"
                                     r"|Loaded weights leave no GPU memory for the KV cache")),
    ("pool_too_small", re.compile(r"Memory pool size is too small|max_running_request is zero")),
    ("cuda_oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation")),
    ("graph_failed", re.compile(r"Capture (?:cuda|npu) graph failed")),
    ("nccl", re.compile(r"NCCL error|DistBackendError|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclInvalidUsage"
                        r"|ncclRemoteError|NCCL WARN|Error while creating shared memory segment")),
    ("p2p", re.compile(r"peer access is not supported between these two devices")),
    # a node of a multi-node server never arrived at --dist-init-addr: torch's TCPStore on rank 0 gives up waiting
    # ("Timed out after N seconds waiting for clients. 1/2 clients joined.", older torch: "workers"), a rank >= 1
    # cannot reach rank 0's store ("The client socket has timed out after ... while trying to connect to (host, port)")
    ("peer_missing", re.compile(r"waiting for (?:clients|workers)\. \d+/\d+ (?:clients|workers) joined"
                                r"|client socket has timed out after \S+ while trying to connect to")),
    ("bind_error", re.compile(r"error while attempting to bind on address .*address already in use|\[Errno 98\]"
                              r"|Address already in use|Port is already in use")),
    ("warmup_error", re.compile(r"Initialization failed\. warmup error")),
    ("init_failed", re.compile(r"Initialization failed\. Please see the error messages above")),
    # the scheduler's own watchdog ("Watchdog timeout (self.watchdog_timeout=300)", 0.5.11 "Scheduler watchdog timeout
    # (..., self.soft=False)"), not a soft one, which only logs
    ("watchdog", re.compile(r"\bwatchdog timeout \((?!.*soft=True)", re.I)),
    ("health_failed", re.compile(r"Health check failed")),
    ("driver_mismatch", re.compile(r"Driver/library version mismatch|API mismatch|CUDA driver version is insufficient")),
    ("nvidia_smi_missing", re.compile(r"nvidia-smi not found")),
    ("argparse_error", re.compile(r"error: (?:unrecognized arguments|argument -|the following arguments are required"
                                  r"|ambiguous option)")),
    # argparse prints its usage only when it rejects the command line (or for --help)
    ("argparse_usage", re.compile(r"^usage: (?:\S*launch_server(?:\.py)?|sglang(?: serve)?|python3? -m sglang\S*) ")),
    ("app_startup_failed", re.compile(r"Application startup failed")),
    ("arch_unsupported", re.compile(r"Model architectures \[.*\] are not supported|is not a registered model")),
    ("killed", re.compile(r"^(?:Killed|已杀死)\s*$")),
    ("traceback", re.compile(r"Traceback \(most recent call last\):")),
]

# The last line of a traceback: "RuntimeError: msg", "torch.OutOfMemoryError: msg", "Exception: msg", "KeyboardInterrupt"
_EXC_LINE_RE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Fault)|Exception|[A-Za-z_][\w.]*\.\w+Error)"
                          r"(?::\s?(?P<msg>.*))?$")

_STAGES = ("args", "distributed_init", "weights", "kv_pool", "cuda_graph", "scheduler_ready", "http", "warmup", "serving")
_STAGE_OF_MILESTONE = {
    "server_args": "args",
    "dist_begin": "distributed_init",
    "dist_end": "distributed_init",
    "weights_begin": "weights",
    "shards": "weights",
    "weights_end": "kv_pool",
    "mamba_alloc": "kv_pool",
    "kv_alloc": "kv_pool",
    "mem_pool_end": "kv_pool",
    "kv_pool_init": "kv_pool",
    "graph_begin": "cuda_graph",
    "graph_end": "cuda_graph",
    "graph_progress": "cuda_graph",
    "max_total_tokens": "scheduler_ready",
    "uvicorn_started": "http",
    "app_startup": "http",
    "uvicorn_running": "warmup",
    "ready": "serving",
    "prefill": None,
    "decode": None,
}
# Milestones that only a process that has created a CUDA context can print.
_GPU_MILESTONES = frozenset(["dist_begin", "dist_end", "weights_begin", "shards", "weights_end", "mamba_alloc", "kv_alloc", "kv_pool_init",
                             "mem_pool_end", "graph_begin", "graph_end", "graph_progress", "max_total_tokens"])


# --------------------------------------------------------------------------------------------
# Per-launch selection
# --------------------------------------------------------------------------------------------

def split_launches(text):
    """Split a log into launches delimited by ``# kpro-launch-id: <id>`` header lines.

    Returns a list of ``(launch_id, text)`` in file order. Text before the first header (or a
    whole log without headers) comes back with ``launch_id`` None.
    """
    if not text:
        return []
    parts = []
    current_id = None
    current = []
    for line in text.splitlines(True):
        m = _LAUNCH_HEADER_RE.match(line.strip("\r\n"))
        if m:
            if current or current_id is not None:
                parts.append((current_id, "".join(current)))
            current_id = m.group(1)
            current = []
            continue
        current.append(line)
    if current or current_id is not None:
        parts.append((current_id, "".join(current)))
    return [(lid, body) for lid, body in parts if lid is not None or body.strip()]


def unfinished_traceback(text, tail_lines=80):
    """Whether ``text`` ends inside a Python traceback: after its last "Traceback (most recent call last):" only
    indented lines (frames, code), no exception line yet. A dying process's last write can reach the log in pieces;
    the gate waits for the rest before it names the failure (the exception line decides the phase)."""
    lines = (text or "").splitlines()[-tail_lines:]
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line]
    if not starts:
        return False
    return all(line[:1] in (" ", "\t") for line in lines[starts[-1] + 1:] if line.strip())


def select_launch(text, launch_id=None):
    """Return only the part of ``text`` written by one launch, or None when it is not there.

    - ``launch_id`` given: the section under ``# kpro-launch-id: <launch_id>`` (the last one if
      repeated). A log without that header is *not* this launch's: None, so a stale log can
      never be read as the current one.
    - ``launch_id`` None: the last launch's section, or the whole text when it has no header.
    """
    if text is None:
        return None
    parts = split_launches(text)
    if launch_id is not None:
        found = [body for lid, body in parts if lid == str(launch_id)]
        return found[-1] if found else None
    if not parts:
        return ""
    with_id = [body for lid, body in parts if lid is not None]
    return with_id[-1] if with_id else parts[-1][1]


def launch_header(launch_id):
    """The header line our unit writes at the top of each launch's log."""
    return "%s %s\n" % (LAUNCH_HEADER, launch_id)


def read_launch_header(path, max_bytes=4096):
    """The launch id in the first line of a log file (:data:`LAUNCH_HEADER` ``<id>``), or None."""
    try:
        with open(path, "rb") as f:
            first = f.read(max_bytes).split(b"\n", 1)[0].decode("utf-8", "replace")
    except (IOError, OSError):
        return None
    m = _LAUNCH_HEADER_RE.match(first)
    return m.group(1) if m else None


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

def _strip_collector_prefix(line):
    for rx in (_COMPOSE_PREFIX_RE, _JOURNAL_PREFIX_RE):
        m = rx.match(line)
        if m:
            rest = line[m.end():]
            # only strip when what follows looks like a log line, not e.g. a table row
            if rest.startswith("[") or _UVICORN_BARE_RE.match(rest) or rest.startswith(" ") or rest.startswith("Traceback") \
                    or _EXC_LINE_RE.match(rest):
                return rest
    for rx in _WRAPPER_PREFIX_RES:
        m = rx.match(line)
        if m:
            rest = line[m.end():]
            if rest.startswith("["):
                return rest
            # the wrapper's own timestamp stands in for SGLang's, so the line parses as a log line
            ts = m.group("ts") + (" " + m.group("tm") if "tm" in m.groupdict() else "")
            return "[%s] %s" % (ts, rest)
    return line


def _parse_ts(ts):
    """Seconds (float, epoch of the log's own clock) from SGLang's timestamp, None if time only."""
    if not ts or len(ts) < 19:
        return None
    base = ts[:19]
    frac = 0.0
    if len(ts) > 20 and ts[19] in ".,":
        try:
            frac = float("0." + ts[20:])
        except ValueError:
            frac = 0.0
    try:
        return calendar.timegm(time.strptime(base, "%Y-%m-%d %H:%M:%S")) + frac
    except ValueError:
        return None


def _gb(rx, msg):
    m = re.search(rx, msg)
    return float(m.group(1)) if m else None


def _milestone_data(kind, m, msg):
    """Numbers carried by a milestone line."""
    data = {}
    if kind == "dist_end":
        data = {"elapsed_s": float(m.group(1)) if m.group(1) else None, "mem_usage_gb": float(m.group(2)) if m.group(2) else None}
    elif kind == "weights_begin":
        data = {"avail_mem_gb": float(m.group(1))}
    elif kind == "shards":
        data = {"percent": int(m.group(1)), "done": int(m.group(2)), "total": int(m.group(3))}
    elif kind == "weights_end":
        data = {"elapsed_s": _gb(r"elapsed=" + _NUM + r" s", msg), "avail_mem_gb": _gb(r"avail mem=" + _NUM + r" GB", msg),
                "mem_usage_gb": _gb(r"mem usage=" + _NUM + r" GB", msg)}
        t = re.search(r"type=(\w+)", msg)
        if t:
            data["type"] = t.group(1)
        d = re.search(r"dtype=([\w.]+)", msg)
        if d:
            data["dtype"] = d.group(1)
    elif kind == "mamba_alloc":
        data = {"max_mamba_cache_size": int(m.group(1)), "conv_state_gb": _gb(r"conv_state size: " + _NUM + r"\s?GB", msg),
                "ssm_state_gb": _gb(r"ssm_state size: " + _NUM + r"\s?GB", msg),
                "intermediate_ssm_gb": _gb(r"intermediate_ssm_state_cache size: " + _NUM + r"\s?GB", msg)}
    elif kind == "kv_alloc":
        data = {"tokens": int(m.group(1)), "k_gb": _gb(r"K size: " + _NUM + r" GB", msg), "v_gb": _gb(r"V size: " + _NUM + r" GB", msg),
                "kv_gb": _gb(r"KV size: " + _NUM + r" GB", msg)}
    elif kind == "mem_pool_end":
        data = {"avail_mem_gb": float(m.group(1))}
    elif kind in ("graph_begin", "graph_end"):
        data = {"draft": "draft" in msg.split("graph")[0], "avail_mem_gb": _gb(r"avail mem=" + _NUM + r" GB", msg),
                "mem_usage_gb": _gb(r"mem usage=" + _NUM + r" GB", msg), "elapsed_s": _gb(r"Time elapsed: " + _NUM + r" s", msg)}
    elif kind == "max_total_tokens":
        data = {"max_total_num_tokens": int(m.group(1))}
        for key in ("chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "context_len"):
            v = re.search(key + r"=(-?\d+)", msg)
            if v:
                data[key] = int(v.group(1))
        data["available_gpu_mem_gb"] = _gb(r"available_gpu_mem=" + _NUM + r" GB", msg)
    elif kind == "uvicorn_started":
        data = {"pid": int(m.group(1))}
    elif kind == "uvicorn_running":
        data = {"url": m.group(1)}
    elif kind == "scheduler_dead":
        data = {"rank": int(m.group(1))}
    elif kind == "scheduler_died":
        data = {"rank": int(m.group(1)), "exit_code": int(m.group(2))}
    elif kind == "exit_code":
        data = {"exit_code": int(m.group(1))}
    elif kind == "profiled_negative":
        data = {"profiled": int(m.group(1))}
    elif kind == "server_args":
        data = parse_server_args(msg)
    return data


_SA_FIELDS = {
    "model_path": str, "served_model_name": str, "host": str, "port": int, "tp_size": int, "dp_size": int, "pp_size": int,
    "mem_fraction_static": float, "context_length": int, "max_running_requests": int, "max_total_tokens": int,
    "chunked_prefill_size": int, "cuda_graph_max_bs": int, "cuda_graph_max_bs_decode": int, "speculative_algorithm": str, "speculative_num_steps": int,
    "speculative_eagle_topk": int, "speculative_num_draft_tokens": int, "disable_radix_cache": bool, "disable_cuda_graph": bool,
    "enable_torch_compile": bool, "mamba_ssm_dtype": str, "max_mamba_cache_size": int, "kv_cache_dtype": str, "dtype": str,
    "attention_backend": str, "disable_custom_all_reduce": bool, "enable_p2p_check": bool,
    "reasoning_parser": str, "tool_call_parser": str,
    "nnodes": int, "node_rank": int, "dist_init_addr": str,
}


# The line's tokens: a quoted string (its closing quote missing where the line was cut), a bracket, a comma, anything else.
_SA_TOKEN_RE = re.compile(r"'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[\[{(]|[\]})]|,|[^'\"\[\]{}(),]+")
# One top-level item: "name=value" (the dataclass repr) or "'name': value" (the dict)
_SA_ITEM_RE = re.compile(r"^\s*'?(\w+)'?\s*(?:=|:)\s*(.*?)\s*$", re.S)


def parse_server_args(msg):
    """The resolved values from the ``server_args=`` line (the fields of _SA_FIELDS, so never the API key it prints).

    0.5.11 to 0.5.18 print the dataclass repr ``ServerArgs(name=value, ...)`` (sglang-0.5.11 entrypoints/engine.py:188),
    0.5.19 on a dict ``{'name': value, ...}`` (ServerArgs.resolved_dict(): 0.5.19 engine.py:1098, 0.5.23 :1185). Only
    the top level is read (nested dicts and dataclasses hold other fields' names); a value that is no Python literal
    (``<class ...>``, ``inf``, an object's repr) stays its text; a line cut short gives the items it holds whole."""
    items = _sa_items(msg.split("=", 1)[1] if msg.startswith("server_args=") else msg)
    return dict((name, _sa_value(items[name], typ)) for name, typ in _SA_FIELDS.items() if name in items)


def _sa_items(body):
    """{name: value text} of the top level of a repr (inside the outer ``ServerArgs(`` or ``{``)."""
    depth, item, items = 0, [], {}
    for tok in _SA_TOKEN_RE.findall(body):
        opens, closes = tok in ("(", "[", "{"), tok in (")", "]", "}")
        depth += 1 if opens else -1 if closes else 0
        if (depth == 1 and tok == ",") or (depth == 0 and closes):
            m = _SA_ITEM_RE.match("".join(item))
            if m:
                items.setdefault(m.group(1), m.group(2))
            item = []
            if depth == 0:
                break
        elif depth > 1 or (depth == 1 and not opens):
            item.append(tok)
    return items


def _sa_value(raw, typ):
    """The value of the field's type, None, or else the text as printed."""
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw
    if value is None or (isinstance(value, typ) and isinstance(value, bool) == (typ is bool)):
        return value
    return float(value) if typ is float and isinstance(value, int) and not isinstance(value, bool) else raw


def parse_line(raw, index=0):
    """One log line -> dict(index, line, ts, time, rank, tags, source, msg)."""
    line = _strip_collector_prefix(raw.rstrip("\r\n"))
    ev = {"index": index, "line": raw.rstrip("\r\n"), "ts": None, "time": None, "rank": None, "tags": {}, "source": "raw", "msg": line}
    m = _SGL_LINE_RE.match(line)
    if m:
        ev["ts"] = m.group("ts")
        ev["time"] = _parse_ts(m.group("ts"))
        tags = dict((k, int(v)) for k, v in _RANK_TAG_RE.findall(m.group("tags") or ""))
        ev["tags"] = tags
        ev["rank"] = tags.get("TP")
        msg = m.group("msg")
        ev["source"] = "sglang" if tags else "main"
        u = _UVICORN_BARE_RE.match(msg)
        if u:
            ev["source"] = "uvicorn"
            ev["level"] = u.group("level")
            msg = u.group("msg")
        ev["msg"] = msg
        return ev
    u = _UVICORN_BARE_RE.match(line)
    if u:
        ev["source"] = "uvicorn"
        ev["level"] = u.group("level")
        ev["msg"] = u.group("msg")
    return ev


def _classify(ev):
    kinds = []
    msg = ev["msg"]
    for kind, rx in _MILESTONES:
        m = rx.search(msg)
        if m:
            kinds.append((kind, m))
    return kinds


def _new_tb(index, rank):
    return {"start": index, "end": index, "rank": rank, "frames": [], "calls": [], "exception": None, "exception_type": None,
            "exception_msg": None, "exceptions": [], "tail": [], "chained": False}


def _tb_feed(tb, ev, i):
    """Feed line ``i`` to the open traceback ``tb``. Returns (tb still open or None, consumed: the line is a frame)."""
    msg = ev["msg"]
    stripped = msg.strip()
    untimed = ev["ts"] is None
    prev_frame = bool(tb["frames"]) and tb.get("last_was_frame")
    tb["last_was_frame"] = False
    if untimed and not tb.get("exception") and (stripped.startswith("File \"") or (prev_frame and not _EXC_LINE_RE.match(stripped))):
        # a frame, or the code line under it; copies pasted into issues often lose the indentation
        if stripped.startswith("File \""):
            tb["frames"].append(stripped)
            tb["last_was_frame"] = True
        tb["calls"].append(stripped)
        tb["end"] = i
        return tb, True
    if untimed and (msg.startswith(" ") or msg.startswith("\t") or stripped.startswith("^") or stripped == ""):
        if stripped.startswith("File "):
            tb["frames"].append(stripped)
        if stripped and not stripped.startswith("^"):
            tb["calls"].append(stripped)
        tb["end"] = i
        return (None if stripped == "" and tb.get("exception") else tb), True
    if untimed and (stripped.startswith("During handling of the above exception")
                    or stripped.startswith("The above exception was the direct cause")):
        tb["chained"] = True
        tb["end"] = i
        return tb, True
    em = _EXC_LINE_RE.match(stripped) if untimed else None
    if em:
        tb["exception"] = stripped
        tb["exception_type"] = em.group("type")
        tb["exception_msg"] = (em.group("msg") or "").strip()
        tb["exceptions"].append(stripped)
        tb["end"] = i
        # the message of an exception may continue on following unindented lines (SGLang's
        # "Possible solutions:" list): keep the traceback open until a timestamped or blank line.
        tb["open_tail"] = True
        return tb, False
    if tb.get("open_tail") and untimed and not stripped.startswith("Traceback"):
        tb["tail"].append(stripped)
        tb["end"] = i
        return tb, False
    return None, False


def _starts_traceback(ev):
    """A line that opens a traceback whose header is not in the text (an excerpt, or a log cut at the
    start): a bare frame, or a bare exception line at column 0 ("ValueError: ...")."""
    if ev["ts"] is not None:
        return False
    if ev["msg"].strip().startswith("File \""):
        return True
    m = _EXC_LINE_RE.match(ev["msg"])
    # a bare "UserWarning: ..." is a warning printed on the way, not an exception
    return bool(m and m.group("msg") and not m.group("type").endswith("Warning"))


def parse_log(text):
    """Parse a log (one launch) into events.

    Returns a dict:
      lines: all lines (list of str), events: list of event dicts (every line that matched a
      milestone or signature: ``kind``, ``data``, plus the fields of :func:`parse_line`),
      tracebacks: list of dict(start, end, rank, frames (last few), exception, exception_type,
      exception_msg, text), milestones: {kind: [events]} in order.
    """
    lines = text.splitlines() if text else []
    events, milestones, tracebacks = [], {}, []
    tb = None
    last_rank = None
    for i, raw in enumerate(lines):
        if raw.startswith("#"):
            # our unit's header ("# kpro-launch-id: ...") and comments: not SGLang output
            tb = None
            continue
        ev = parse_line(raw, i)
        if ev["rank"] is not None:
            last_rank = ev["rank"]
        if tb is None and _starts_traceback(ev):
            tb = _new_tb(i, None)
            tracebacks.append(tb)
        if tb is not None:
            tb, consumed = _tb_feed(tb, ev, i)
            if consumed:
                continue
        for kind, m in _classify(ev):
            if kind == "traceback":
                tb = _new_tb(i, ev["rank"])
                tracebacks.append(tb)
            e = dict(ev, kind=kind, data=_milestone_data(kind, m, ev["msg"]))
            events.append(e)
            milestones.setdefault(kind, []).append(e)
    for t in tracebacks:
        t["text"] = "\n".join(lines[t["start"]:t["end"] + 1])
        t.pop("open_tail", None)
        t.pop("last_was_frame", None)
    return {"lines": lines, "events": events, "tracebacks": tracebacks, "milestones": milestones, "last_rank": last_rank}


# --------------------------------------------------------------------------------------------
# Facts
# --------------------------------------------------------------------------------------------

def _first(ms, kind):
    lst = ms.get(kind) or []
    return lst[0] if lst else None


def _last(ms, kind):
    lst = ms.get(kind) or []
    return lst[-1] if lst else None


def extract_facts(parsed):
    """Numbers from the log: KV tokens, weights per rank, memory after load, timings, the resolved server args."""
    ms = parsed["milestones"]
    facts = {}
    sa = _first(ms, "server_args")
    if sa:
        facts["server_args"] = sa["data"]
    ranks = sorted(set(e["rank"] for e in parsed["events"] if e["rank"] is not None))
    facts["ranks_seen"] = ranks
    # weights: the first "Load weight end" per rank is the target model, a later one the draft
    we_by_rank = {}
    for e in ms.get("weights_end") or []:
        we_by_rank.setdefault(e["rank"], []).append(e)
    usages = [v[0]["data"].get("mem_usage_gb") for v in we_by_rank.values() if v[0]["data"].get("mem_usage_gb") is not None]
    if usages:
        facts["weights_gib"] = max(usages)
    avails = [v[0]["data"].get("avail_mem_gb") for v in we_by_rank.values() if v[0]["data"].get("avail_mem_gb") is not None]
    if avails:
        facts["avail_after_weights_gib"] = min(avails)
    drafts = [v[1]["data"].get("mem_usage_gb") for v in we_by_rank.values() if len(v) > 1 and v[1]["data"].get("mem_usage_gb") is not None]
    if drafts:
        facts["draft_weights_gib"] = max(drafts)
    for e in we_by_rank.values():
        if e[0]["data"].get("type"):
            facts["model_type"] = e[0]["data"]["type"]
            break
    wb_by_rank = {}
    for e in ms.get("weights_begin") or []:
        wb_by_rank.setdefault(e["rank"], e["data"]["avail_mem_gb"])
    if wb_by_rank:
        facts["avail_before_weights_gib"] = min(wb_by_rank.values())
    kv_by_rank = {}
    for e in ms.get("kv_alloc") or []:
        kv_by_rank.setdefault(e["rank"], []).append(e)
    kv = [v[0]["data"]["tokens"] for v in kv_by_rank.values()]
    if kv:
        facts["kv_tokens"] = min(kv)
        first = list(kv_by_rank.values())[0][0]["data"]
        if first.get("k_gb") is not None and first.get("v_gb") is not None:
            facts["kv_cache_gib"] = round(first["k_gb"] + first["v_gb"], 2)
        elif first.get("kv_gb") is not None:
            facts["kv_cache_gib"] = first["kv_gb"]
    mam = _first(ms, "mamba_alloc")
    if mam:
        facts["max_mamba_cache_size"] = mam["data"]["max_mamba_cache_size"]
        facts["mamba_state_gib"] = round(sum(mam["data"].get(k) or 0.0 for k in ("conv_state_gb", "ssm_state_gb", "intermediate_ssm_gb")), 2)
    mt = _first(ms, "max_total_tokens")
    if mt:
        for k in ("max_total_num_tokens", "max_running_requests", "context_len", "chunked_prefill_size"):
            if k in mt["data"]:
                facts[k] = mt["data"][k]
    sh = _last(ms, "shards")
    if sh:
        facts["shards_loaded"] = "%d/%d" % (sh["data"]["done"], sh["data"]["total"])
    times = [e["time"] for e in parsed["events"] if e["time"] is not None]
    all_times = [t for t in (parse_line(line)["time"] for line in parsed["lines"][:50]) if t is not None]
    t0 = all_times[0] if all_times else (times[0] if times else None)
    rd = _first(ms, "ready")
    if rd and rd["time"] is not None and t0 is not None:
        facts["time_to_ready_s"] = round(rd["time"] - t0, 1)
    wbe, wee = _first(ms, "weights_begin"), _first(ms, "weights_end")
    if wee and wee["data"].get("elapsed_s") is not None:
        facts["load_weights_s"] = wee["data"]["elapsed_s"]
    elif wbe and wee and wbe["time"] is not None and wee["time"] is not None:
        facts["load_weights_s"] = round(wee["time"] - wbe["time"], 1)
    if _first(ms, "graph_begin") and any(e["data"].get("draft") for e in ms.get("graph_begin") or []):
        facts["speculative"] = True
    elif sa and sa["data"].get("speculative_algorithm"):
        facts["speculative"] = True
    last = last_milestone(parsed)
    if last:
        facts["last_milestone"] = last["kind"]
        facts["last_milestone_line"] = last["line"] if len(last["line"]) <= 300 else last["line"][:300] + "..."
    facts["stage"] = stage_reached(parsed)
    facts["gpu_touched_per_log"] = any(k in ms for k in _GPU_MILESTONES)
    facts["log_lines"] = len(parsed["lines"])
    if times:
        facts["last_log_time"] = times[-1]
    return facts


def last_milestone(parsed):
    """The last startup milestone (not a runtime batch line, not an error)."""
    best = None
    for e in parsed["events"]:
        if e["kind"] in _STAGE_OF_MILESTONE and _STAGE_OF_MILESTONE[e["kind"]] is not None:
            best = e
    return best


def stage_reached(parsed):
    """Where startup got to: one of args, distributed_init, weights, kv_pool, cuda_graph, scheduler_ready, http, warmup, serving."""
    reached = 0
    for e in parsed["events"]:
        st = _STAGE_OF_MILESTONE.get(e["kind"])
        if st is not None:
            reached = max(reached, _STAGES.index(st))
    if reached == 0 and not parsed["milestones"].get("server_args"):
        return "args"
    # a weights_end of the target means we are past weights; an error right after shows kv_pool
    return _STAGES[reached]


# --------------------------------------------------------------------------------------------
# Diagnosis
# --------------------------------------------------------------------------------------------

def _fmt_gib(v):
    return "%.2f GiB" % v if v is not None else "?"


def _evidence(parsed, extra_events=(), tb=None, max_lines=25):
    """Log lines of this launch that show what happened: the milestones reached, the error lines,
    and the traceback's last frames + exception."""
    idx = set()
    ms = parsed["milestones"]
    for kind in ("server_args", "dist_begin", "weights_begin", "weights_end", "mamba_alloc", "kv_alloc", "graph_begin",
                 "max_total_tokens", "app_startup", "uvicorn_running", "ready"):
        e = _first(ms, kind)
        if e:
            idx.add(e["index"])
    lm = last_milestone(parsed)
    if lm:
        idx.add(lm["index"])
    for e in extra_events:
        idx.add(e["index"])
    lines = parsed["lines"]
    if tb:
        idx.add(tb["start"])
        # last frames and the exception line(s)
        tail_start = max(tb["start"], tb["end"] - 6)
        for i in range(tail_start, tb["end"] + 1):
            idx.add(i)
    out = []
    for i in sorted(idx):
        line = lines[i]
        if len(line) > 400:
            line = line[:400] + "... (%d chars)" % len(lines[i])
        out.append(line)
    if len(out) > max_lines:
        out = out[:5] + ["..."] + out[-(max_lines - 6):]
    return out


def _pick_traceback(parsed, predicate=None):
    for tb in parsed["tracebacks"]:
        if predicate is None or predicate(tb):
            return tb
    return None


def _tb_exception(tb):
    if not tb:
        return None
    if tb.get("exceptions"):
        exc = tb["exceptions"][-1]
        if tb.get("tail"):
            exc = exc + " " + " ".join(tb["tail"][:6])
        return exc
    return None


def _at_baseline(gpu_used_mib, gpu_baseline_mib, tolerance_mib=256):
    """True when every GPU's used memory is at its baseline (within tolerance), None when unknown."""
    if gpu_used_mib is None:
        return None
    used = list(gpu_used_mib)
    if not used:
        return None
    base = list(gpu_baseline_mib) if gpu_baseline_mib is not None else [0] * len(used)
    if len(base) < len(used):
        base = base + [0] * (len(used) - len(base))
    return all(float(u) <= float(b) + tolerance_mib for u, b in zip(used, base))


def _sa(facts, key, default=None):
    return (facts.get("server_args") or {}).get(key, default)


def _remedy_kv(facts, plan):
    mf = _sa(facts, "mem_fraction_static")
    ctx = _sa(facts, "context_length") or facts.get("context_len")
    mrr = _sa(facts, "max_running_requests")
    spec = _sa(facts, "speculative_algorithm")
    parts = []
    if plan and plan.get("remedy"):
        parts.append(plan["remedy"])
    nums = []
    if facts.get("weights_gib") is not None:
        nums.append("weights %s per GPU" % _fmt_gib(facts["weights_gib"]))
    if facts.get("avail_after_weights_gib") is not None:
        nums.append("%s free after loading" % _fmt_gib(facts["avail_after_weights_gib"]))
    if facts.get("avail_before_weights_gib") is not None and mf is not None:
        nums.append("reserve (1 - mem_fraction_static) x %s = %s" % (
            _fmt_gib(facts["avail_before_weights_gib"]), _fmt_gib(facts["avail_before_weights_gib"] * (1 - mf))))
    lever = []
    if spec:
        lever.append("lower --max-running-requests (now %s; with speculative decoding SGLang 0.5.9 defaults it to 48 and reserves "
                     "mamba state x requests x draft tokens out of the KV budget), e.g. 8" % (mrr if mrr is not None else "48"))
        lever.append("or lower --speculative-num-draft-tokens / --speculative-num-steps")
    lever.append("lower --context-length (now %s)" % (ctx if ctx is not None else "the model's default"))
    if mf is not None:
        lever.append("raise --mem-fraction-static (now %s, e.g. %s; it must stay below what CUDA graphs and activations need)" % (
            mf, round(min(0.95, mf + 0.03), 2)))
    else:
        lever.append("raise --mem-fraction-static (e.g. 0.88)")
    lever.append("use --mamba-ssm-dtype bfloat16 for hybrid models (halves the GDN state)")
    if spec:
        lever.append("or disable speculative decoding (drop --speculative-algorithm %s)" % spec)
    text = "The KV-cache pool does not fit"
    if nums:
        text += " (%s)" % ", ".join(nums)
    text += ": " + "; ".join(lever) + "."
    parts.append(text)
    return " ".join(parts)


def _remedy_weights(facts, exc, plan):
    tp = _sa(facts, "tp_size")
    others = re.findall(r"Process (\d+) has ([\d.]+ [GM]iB) memory in use", exc or "")
    if facts.get("oom_stage") in ("distributed_init", "args") and facts.get("avail_before_weights_gib") is None:
        # nothing of ours was on the GPU yet: the memory was taken before this launch
        text = ("CUDA ran out of memory before the weights were loaded (%s): the GPU's memory is already held, most likely by "
                "a leftover server of an earlier launch. Find the holders (nvidia-smi, or the gate's gpu_memory_held check) and "
                "stop them" % facts["oom_stage"].replace("_", " "))
    else:
        text = ("CUDA ran out of memory while loading the weights"
                + (" (%s free before loading)" % _fmt_gib(facts["avail_before_weights_gib"]) if facts.get("avail_before_weights_gib") is not None else "")
                + ": the weights per GPU do not fit. Make sure nothing else holds GPU memory")
    if others:
        text += " (the error names other processes: %s; inside LXC these are host PIDs)" % ", ".join("PID %s %s" % o for o in others)
    text += ", raise --tp-size (now %s) or use a quantized checkpoint (--quantization fp8)." % (tp if tp is not None else "1")
    if plan and plan.get("per_gpu", {}).get("weights_mib"):
        text += " Planned weights per GPU: %d MiB." % plan["per_gpu"]["weights_mib"]
    return text


def _remedy_graph(facts):
    mf = _sa(facts, "mem_fraction_static")
    # 0.5.14 renamed the flag (the old one an alias until 0.5.20): the log's own ServerArgs say which this server has
    key = "cuda_graph_max_bs_decode" if _sa(facts, "cuda_graph_max_bs_decode") is not None else "cuda_graph_max_bs"
    bs = _sa(facts, key)
    suggested = round(max(0.5, (mf or 0.85) - 0.05), 2)
    return ("CUDA graph capture failed: set --mem-fraction-static to a smaller value (now %s, e.g. %s) so more memory is left for "
            "graphs and activations, set --%s smaller (now %s, e.g. 16), drop --enable-torch-compile, or as a last "
            "resort --disable-cuda-graph." % (mf if mf is not None else "?", suggested, key.replace("_", "-"), bs if bs is not None else "default"))


def _remedy_nccl(exc, p2p):
    if p2p:
        return ("GPU peer-to-peer access is not available (IOMMU/ACS under Proxmox, or PCIe topology): pass "
                "--disable-custom-all-reduce (or --enable-p2p-check) and, if NCCL still fails, NCCL_P2P_DISABLE=1.")
    return ("NCCL failed during distributed init (%s). In a container this is usually a small /dev/shm: give the container a "
            "tmpfs /dev/shm of several GB; also try --disable-custom-all-reduce, NCCL_P2P_DISABLE=1, and rerun with "
            "NCCL_DEBUG=INFO for the detail." % (exc or "NCCL error"))


# --------------------------------------------------------------------------------------------
# What an exception says, whatever stage raised it
# --------------------------------------------------------------------------------------------

_ARCH_RE = re.compile(r"[Aa]rchitectures? .*(?:are|is) not supported|Unsupported architectures?|is not a registered model"
                      r"|does not recognize this architecture|failed to be inspected")
_IMPORT_RE = re.compile(r"^(?:[\w.]*\.)?(?:ImportError|ModuleNotFoundError)\b|undefined symbol|cannot import name|No module named")
_FILES_RE = re.compile(r"^(?:[\w.]*\.)?(?:OSError|FileNotFoundError|HTTPError|LocalEntryNotFoundError|RepositoryNotFoundError"
                       r"|HFValidationError|GatedRepoError|EntryNotFoundError)\b|SafetensorError|HeaderTooLarge")
_SPEC_FLAGS_RE = re.compile(r"[Ss]peculative decoding .* not compatible|is incompatible with|not compatible with")
_CONFIG_EXC_RE = re.compile(r"^(?:[\w.]*\.)?(?:TypeError|ValueError|AssertionError|NotImplementedError)\b")
# The main process's report of a child's failure: a consequence, never the cause.
_CONSEQUENCE_RE = re.compile(r"scheduler died during initialization|scheduler is dead|Initialization failed\. Please see"
                             r"|^EOFError\b")
_CONSEQUENCE_FRAME_RE = re.compile(r"_wait_for_scheduler_ready|wait_for_ready\b")
# Lines that say this launch is over, even when nothing reports the process state.
_FATAL_MARKERS = ("sigquit", "scheduler_exception", "scheduler_dead", "scheduler_died", "killed", "init_failed",
                  "app_startup_failed", "warmup_error", "watchdog")

_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


def _exception_kind(exc):
    """What kind of configuration problem an exception names, or None."""
    if not exc:
        return None
    if _ARCH_RE.search(exc):
        return "unsupported_architecture"
    if _IMPORT_RE.search(exc):
        return "import_error"
    if "nvidia-smi not found" in exc:
        return "nvidia_smi_missing"
    if _FILES_RE.search(exc):
        return "model_files"
    if _SPEC_FLAGS_RE.search(exc) or _CONFIG_EXC_RE.search(exc):
        return "invalid_configuration"
    return None


def _is_consequence(tb):
    text = " ".join(tb["exceptions"] + tb["tail"])
    if text:
        return bool(_CONSEQUENCE_RE.search(text) or re.search(r"Rank \d+ scheduler", text))
    return any(_CONSEQUENCE_FRAME_RE.search(f) for f in tb["frames"][-3:])


def _root_traceback(parsed, death_index=None):
    """The traceback that names the cause: a scheduler's own error rather than the main process's report of it
    (or its exit after reporting a dead scheduler at ``death_index``); a complete one rather than one cut
    before its exception line."""
    causes = [t for t in parsed["tracebacks"] if not _is_consequence(t) and (death_index is None or t["start"] < death_index)]
    complete = [t for t in causes if t["exceptions"]]
    return (complete or causes or [None])[0]


_FRAME_STAGES = [
    ("cuda_graph", re.compile(r"cuda_graph_runner|init_cuda_graphs|capture_one_batch_size|init_device_graphs")),
    ("kv_pool", re.compile(r"init_memory_pool|memory_pool\.py|TokenToKVPool|MambaPool|profile_max_num_token|handle_max_mamba_cache"
                           r"|model_runner_kv_cache_mixin|pool_configurator")),
    ("weights", re.compile(r"load_model|load_weights|model_loader|weight_utils|create_weights")),
    ("distributed_init", re.compile(r"init_torch_distributed|initialize_model_parallel|init_distributed_environment|pynccl"
                                    r"|custom_all_reduce")),
    ("warmup", re.compile(r"_wait_and_warmup|_execute_server_warmup|warmup")),
    ("args", re.compile(r"prepare_server_args|server_args\.py|from_cli_args")),
]


def _raised_while_importing(tb):
    """True when the innermost complete frame is a module's top level (an import chain)."""
    complete = [f for f in tb["frames"] if re.search(r", line \d+, in (?:<module>|[A-Za-z_]\w*)$", f)]
    return bool(complete) and complete[-1].endswith("in <module>")


def _stage_from_frames(tb):
    """The startup stage named by a traceback's frames (innermost known one wins), or None."""
    if not tb or not tb.get("frames"):
        return None
    if _raised_while_importing(tb):
        return "args"   # before any process was spawned
    # frames and the code lines under them, innermost first: an excerpt cut inside a frame still
    # shows the call the last complete frame was making ("self.load_model()")
    for line in reversed(tb.get("calls") or tb["frames"]):
        for stage, rx in _FRAME_STAGES:
            if rx.search(line):
                return stage
    return None


def _stage_at(parsed, index):
    """The startup stage the log was in at line ``index`` (the last milestone before it)."""
    stage = "args"
    for e in parsed["events"]:
        if e["index"] >= index:
            break
        st = _STAGE_OF_MILESTONE.get(e["kind"])
        # the latest milestone, not the furthest: the speculative draft worker starts over at
        # "Load weight begin" after the target's graphs are captured.
        if st is not None and e["kind"] not in ("prefill", "decode"):
            stage = st
    return stage


def _in_draft(parsed, index):
    """True when line ``index`` comes after the target model's CUDA graphs (the draft worker's turn)."""
    for e in parsed["events"]:
        if e["index"] >= index:
            return False
        if e["kind"] == "graph_end" and not e["data"].get("draft"):
            return True
        if e["kind"] == "max_total_tokens":
            return False
    return False


# --------------------------------------------------------------------------------------------
# Diagnosis
# --------------------------------------------------------------------------------------------

class _Launch(object):
    """One launch's log and what is known of its process, shared by the checks below."""

    def __init__(self, text, gpu_used_mib, gpu_baseline_mib, exit_status, process_alive, plan):
        self.parsed = parse_log(text)
        self.ms = self.parsed["milestones"]
        self.facts = extract_facts(self.parsed)
        self.facts["exit_status"] = exit_status
        if gpu_used_mib is not None:
            self.facts["gpu_used_mib"] = list(gpu_used_mib)
        if gpu_baseline_mib is not None:
            self.facts["gpu_baseline_mib"] = list(gpu_baseline_mib)
        self.gpu_used, self.gpu_baseline, self.exit_status, self.plan = gpu_used_mib, gpu_baseline_mib, exit_status, plan
        self.exited = (process_alive is False) or (exit_status is not None)
        self.alive = process_alive
        self.ready_line = _first(self.ms, "ready")
        self.death = self._death()
        if self.death:
            self.facts["scheduler_rank"], self.facts["scheduler_exit_code"] = self.death[0], self.death[1]

    def _death(self):
        """(rank, exit code or None, event) of a scheduler the main process reported dead."""
        e = _first(self.ms, "scheduler_died") or _first(self.ms, "scheduler_dead")
        if e is None:
            return None
        code = e["data"].get("exit_code")
        if code is None:
            later = [x for x in self.ms.get("exit_code") or [] if x["index"] > e["index"]]
            code = later[0]["data"]["exit_code"] if later else None
        return e["data"]["rank"], code, e

    def marked_fatal(self):
        return self.exited or any(k in self.ms for k in _FATAL_MARKERS)

    def result(self, phase, extra=(), tb=None, remedy="", gpu=False):
        ev = _evidence(self.parsed, [e for e in extra if e], tb)
        if gpu:
            ev += _gpu_evidence(self.gpu_used, self.gpu_baseline, self.exit_status)
        return _result(phase, ev, remedy, self.facts)


def _driver_failure(L):
    e = _first(L.ms, "driver_mismatch")
    if e is None:
        return None
    return L.result("version_mismatch", [e], remedy="The NVIDIA userspace in the container does not match the host's kernel "
                    "module: install the same version with --no-kernel-modules (kpro.gpu_serving.nvidia_driver mode=userspace).")


def _argparse_failure(L):
    e = _first(L.ms, "argparse_error") or _first(L.ms, "argparse_usage")
    if e is None:
        return None
    L.facts.update({"failure": "argparse", "failed_stage": "args", "exception": e["msg"]})
    shown = e["msg"] if e["kind"] == "argparse_error" else "argparse printed its usage (the error line is not in the log)"
    return L.result("not_started", [e], gpu=True, remedy=(
        "SGLang rejected its command line before starting anything (%s). Fix the flag in the server options the unit's "
        "ExecStart is built from: use the spelling `python -m sglang.launch_server --help` lists for this version "
        "(dashes, not underscores)." % shown))


def _nccl_failure(L):
    if "nccl" not in L.ms and "p2p" not in L.ms:
        return None
    e = (L.ms.get("nccl") or L.ms.get("p2p"))[0]
    tb = _pick_traceback(L.parsed, lambda t: any(re.search(r"NCCL|nccl|peer access|DistBackend", x) for x in t["exceptions"]))
    # NCCL warnings alone (NCCL_DEBUG=INFO/WARN output) are not fatal while the server goes on
    hard = [x for x in (L.ms.get("nccl") or []) + (L.ms.get("p2p") or []) if "NCCL WARN" not in x["msg"] and " NCCL INFO " not in x["msg"]]
    if not (L.exited or tb or (hard and not L.ready_line)):
        return None
    exc = _tb_exception(tb) or (hard[0]["msg"] if hard else e["msg"])
    L.facts["exception"] = exc
    return L.result("nccl_error", [hard[0] if hard else e], tb, _remedy_nccl(exc, "p2p" in L.ms))


def _peer_failure(L):
    e = _first(L.ms, "peer_missing")
    if e is None:
        return None
    tb = _pick_traceback(L.parsed, lambda t: any(re.search(r"clients joined|workers joined|trying to connect to", x) for x in t["exceptions"]))
    L.facts["exception"] = _tb_exception(tb) or e["msg"]
    L.facts["failure"] = "peer_missing"
    m = re.search(r"(\d+)/(\d+) (?:clients|workers) joined", e["msg"])
    if m:
        L.facts["nodes_joined"], L.facts["nodes_expected"] = int(m.group(1)), int(m.group(2))
    addr = _sa(L.facts, "dist_init_addr")
    return L.result("peer_missing", [e], tb, remedy=(
        "A node of this multi-node server never arrived at the distributed init address%s (%s). Start every node's server "
        "(node_rank 0 .. nnodes-1, the same --nnodes, --tp-size and --dist-init-addr on each; ranks >= 1 must reach rank 0's "
        "address and port: check the firewall and the address the containers see), and look at the missing node's own "
        "log and gate: it names why it did not start." % ((" " + str(addr)) if addr else "", e["msg"][:160].strip())))


# --------------------------------------------------------------------------------------------
# The runtime compile toolchain: SGLang 0.5.11 compiles at its first forward (CUDA graph capture, the warmup request or
# a first request): Triton 3.6.0 its C launcher, FlashInfer 0.6.8.post1 its JIT kernels (nvcc driven by ninja).
# --------------------------------------------------------------------------------------------

_NVCC = ("the nvidia-cuda-nvcc wheel of torch's CUDA release (in the venv's lock) with CUDA_HOME=<venv>/cuda in the server's "
         "environment")
# (regex searched in every line, the missing piece, what provides it). The first line of the log that matches names the
# piece; "{pydev}" becomes python3.X-dev for the Python the log's paths show. Header rules match any locale's message.
_TOOLCHAIN_RULES = tuple((re.compile(rx), piece, remedy) for rx, piece, remedy in (
    # triton 3.6.0 runtime/build.py:26-33: no $CC, no gcc, no clang on PATH
    (r"Failed to find C compiler", "a C compiler (gcc)", "the Debian package gcc"),
    # triton 3.6.0 runtime/build.py:34-41: gcc compiles cuda_utils.c / the launcher against sysconfig's Python include
    (r"fatal error: Python\.h:", "the Python headers (Python.h)", "the Debian package {pydev} (the headers of the venv's Python)"),
    # flashinfer 0.6.8.post1 jit/cpp_ext.py get_system_includes / build_common_cflags: -isystem $cuda_home/include
    (r"fatal error: (?:cuda|curand|cublas|cusparse|cufft|nvrtc|crt/)\w*\.h:", "the CUDA headers", _NVCC),
    # flashinfer 0.6.8.post1 jit/cpp_ext.py:48-64 (get_cuda_path; older releases: "Could not find nvcc"), its
    # get_cuda_version running $cuda_home/bin/nvcc; torch cpp_extension's CUDA_HOME check; a shell without nvcc
    (r"Could not find nvcc|No such file or directory: '[^']*nvcc'|nvcc: not found|CUDA_HOME environment variable is not set",
     "the CUDA compiler (nvcc)", _NVCC),
    # flashinfer 0.6.8.post1 jit/cpp_ext.py:315-323 (run_ninja: "ninja" from PATH); torch cpp_extension verify_ninja_availability
    (r"No such file or directory: '[^']*ninja'|Ninja is required to load C\+\+ extensions", "ninja",
     "the ninja wheel in the venv with <venv>/bin on the server's PATH"),
    # flashinfer jit/cpp_ext.py generate_ninja_build_for_op ldflags: -L$cuda_home/lib64 -lcudart (the wheel has lib/ only)
    (r"cannot find -lcudart\b", "the CUDA runtime's link library (libcudart.so under $CUDA_HOME/lib64)", _NVCC + " (its lib64 link)"),
    # the same ldflags: -L$cuda_home/lib64/stubs -lcuda; triton links -lcuda too
    (r"cannot find -lcuda\b", "the driver's link library (libcuda.so)",
     "the NVIDIA userspace of the container (stage 4, nvidia_driver mode=userspace, which installs the libcuda.so link)"),
    # nvcc's host compiler: host_config.h refuses the gcc, or nvcc/torch find no C++ compiler
    (r"unsupported GNU version", "a host compiler this nvcc supports", "the Debian package g++ of the release's default gcc"),
    (r"nvcc fatal\s*:\s*Failed to preprocess host compiler|InvalidCxxCompiler|Command '\['which', 'c\+\+'\]'"
     r"|(?:c\+\+|g\+\+|cc1plus): not found", "a C++ compiler (g++)", "the Debian package g++"),
))
# Triton's launcher build failing with its error line not in the excerpt (triton 3.6.0 runtime/build.py:48, check_call):
# only an exception line counts, not SGLang's "Ignore import error when loading ..." warning.
_TOOLCHAIN_CC_FAILED = re.compile(r"(?:CalledProcessError: |Capture cuda graph failed: )Command '\['[^']*(?:gcc|/cc|clang)[^']*', "
                                  r"'[^']*\.c'")


def _toolchain_hit(lines):
    """(line index, piece, remedy) of the first line that names a missing piece of the toolchain, or None."""
    weak = None
    for i, line in enumerate(lines):
        for rx, piece, remedy in _TOOLCHAIN_RULES:
            if rx.search(line):
                return i, piece, remedy
        if weak is None and _TOOLCHAIN_CC_FAILED.search(line):
            weak = (i, "a piece of the C toolchain Triton's launcher needs (the compiler's own error is above the traceback, "
                       "not in this excerpt: most often Python.h)", "the Debian packages gcc and {pydev}")
    return weak


def _toolchain_failure(L):
    """runtime_toolchain_missing: the first forward died because a compiler, header, nvcc or ninja is missing."""
    hit = _toolchain_hit(L.parsed["lines"])
    if hit is None:
        return None
    index, piece, remedy = hit
    # a toolchain line that did not end the launch (the process lives on, no failure in the log, or it came before ready)
    if not L.marked_fatal() and (L.alive or (L.ready_line is not None and index < L.ready_line["index"])):
        return None
    tb = _pick_traceback(L.parsed, lambda t: t["end"] >= index) or _root_traceback(L.parsed)
    stage = _stage_from_frames(tb) or _stage_at(L.parsed, index)
    py = re.search(r"python(3\.\d+)", "\n".join(L.parsed["lines"]))
    remedy = remedy.format(pydev="python%s-dev" % py.group(1) if py else "python3-dev (python3.X-dev of the venv's Python)")
    L.facts.update({"failure": "runtime_toolchain_missing", "missing": piece, "failed_stage": stage,
                    "exception": _tb_exception(tb) or L.parsed["lines"][index].strip()[:300]})
    where = {"cuda_graph": "while capturing CUDA graphs", "warmup": "on its warmup request", "http": "on its warmup request",
             "serving": "on a first request"}.get(stage, "at its first forward")
    return L.result("runtime_toolchain_missing", [{"index": index}], tb, (
        "The server died %s because the container lacks %s, which SGLang's runtime compilation needs (Triton's C launcher, "
        "FlashInfer's JIT kernels); --disable-cuda-graph or a lower --mem-fraction-static do not help. Install %s. The "
        "container stage provides it (stage 5, sglang_install, checks the toolchain before the model download): re-run it "
        "(--tags container) to put back what was removed since." % (where, piece, remedy)))


# --------------------------------------------------------------------------------------------
# A bug of the SGLang version, seen in the log: a compile error in SGLang's own JIT source that a rule of the
# compatibility table names (compat.py RULES: the diagnosis gives that rule's reason and remedy).
# --------------------------------------------------------------------------------------------

# (regex searched in every line, the compat rule's id); the first line that matches names the rule.
_KNOWN_BAD_LOG = tuple((re.compile(rx), rule_id) for rx, rule_id in (
    # sglang 0.5.11 .. 0.5.12.post1 jit_kernel/csrc/elementwise/activation.cuh:94-96, select_kernel's trailing
    # `-> decltype(activation_kernel<ActivationKind::kSiLU, kFilterExpert>)`, built by tvm-ffi (ninja + nvcc) at the first
    # forward (jit_kernel/activation.py:31-45; srt/layers/activation.py:54-59 on CUDA). The host compiler's error as
    # tvm-ffi's "RuntimeError: ninja exited with status 1" carries it (sgl-project/sglang#25487, #25682, PR #24136;
    # reproduced with nvcc 13.0.88 + g++ 12.2): "activation.cuh:95:52: error: type/value mismatch at argument 1 in
    # template parameter list for ..." and its note "expected a type, got '...ActivationKind::kSiLU'". Fixed by PR #26444.
    (r"(?:^|/)activation\.cuh[:(][\d:)]+\s*error: type/value mismatch at argument 1 in template parameter list",
     "sglang-jit-activation-nvcc"),
    (r"note:\s+expected a type, got [\u2018'`][^\u2019'`]*ActivationKind::kSiLU", "sglang-jit-activation-nvcc"),
))


def _known_bad_hit(lines):
    """(the compat rule, indexes of its lines in the log, at most 4) for the first line that shows a rule's bug, or None."""
    rule_id, found = None, []
    for i, line in enumerate(lines):
        for rx, rid in _KNOWN_BAD_LOG:
            if rx.search(line) and rid == (rule_id or rid):
                rule_id = rid
                found.append(i)
                break
    rule = next((r for r in COMPAT_RULES if r["id"] == rule_id), None)
    return (rule, found[:4]) if rule else None


def _known_bad_failure(L):
    """known_bad_version: the first forward died on a compile error of SGLang's own JIT source that a rule of the table
    names. Ahead of runtime_toolchain_missing (the compiler ran: nothing is missing) and cuda_graph_failed (its memory
    and graph-size remedies do not help)."""
    hit = _known_bad_hit(L.parsed["lines"])
    if hit is None:
        return None
    rule, indexes = hit
    # as for the toolchain: a line that did not end the launch (the process lives on, or it came before ready)
    if not L.marked_fatal() and (L.alive or (L.ready_line is not None and indexes[0] < L.ready_line["index"])):
        return None
    tb = _pick_traceback(L.parsed, lambda t: t["end"] >= indexes[0]) or _root_traceback(L.parsed)
    stage = _stage_from_frames(tb) or _stage_at(L.parsed, indexes[0])
    L.facts.update({"failure": "known_bad_version", "compat_rule": rule["id"], "prs": [rule.get("pr")], "failed_stage": stage,
                    "exception": _tb_exception(tb) or L.parsed["lines"][indexes[0]].strip()[:300]})
    where = {"cuda_graph": "while capturing CUDA graphs", "warmup": "on its warmup request", "http": "on its warmup request",
             "serving": "on a first request"}.get(stage, "at its first forward")
    return L.result("known_bad_version", [{"index": i} for i in indexes], tb, (
        "The server died %s on a known bug of this SGLang version (compatibility table rule %s, fixed by sgl-project/sglang "
        "PR %s): %s %s --disable-cuda-graph or a lower --mem-fraction-static do not help."
        % (where, rule["id"], rule.get("pr", "?"), rule.get("reason", ""), rule.get("remedy", ""))))


def _graph_failure(L):
    e = _first(L.ms, "graph_failed")
    if e is None:
        return None
    tb = _pick_traceback(L.parsed, lambda t: any("graph failed" in x for x in t["exceptions"]))
    L.facts["exception"] = _tb_exception(tb) or e["msg"]
    return L.result("cuda_graph_failed", [e], tb, _remedy_graph(L.facts))


def _kv_failure(L):
    negative = [e for e in L.ms.get("profiled_negative") or [] if e["data"].get("profiled", 1) <= 0]
    found = L.ms.get("not_enough_memory") or L.ms.get("pool_too_small") or negative
    if not found:
        return None
    e = found[0]
    tb = _pick_traceback(L.parsed, lambda t: any(re.search(r"Not enough memory|pool size is too small|max_running_request is zero|"
                                                           r"no GPU memory for the KV cache", x) for x in t["exceptions"]))
    mfm = re.search(r"mem_fraction_static=([\d.]+)", e["msg"] + " " + (_tb_exception(tb) or ""))
    if mfm and "server_args" not in L.facts:
        L.facts["server_args"] = {"mem_fraction_static": float(mfm.group(1))}
    L.facts["exception"] = _tb_exception(tb) or e["msg"]
    return L.result("kv_cache_oom", [e] + (L.ms.get("profiled_negative") or [])[:1], tb, _remedy_kv(L.facts, L.plan))


def _oom_failure(L):
    tb = _pick_traceback(L.parsed, lambda t: any(re.search(r"out of memory|OutOfMemoryError", x) for x in t["exceptions"] + t["tail"]))
    e = _first(L.ms, "cuda_oom")
    if tb is None and e is None:
        return None
    exc = _tb_exception(tb) or (e["msg"] if e else "CUDA out of memory")
    L.facts["exception"] = exc
    index = tb["start"] if tb else e["index"]
    where = _tb_stage(L, tb) if tb else _crash_stage(L, index)
    L.facts["oom_stage"] = where
    extra = [e] if e else []
    mf = _sa(L.facts, "mem_fraction_static")
    if _in_draft(L.parsed, index) and where in ("weights", "kv_pool", "cuda_graph", "distributed_init"):
        L.facts["oom_in_draft_model"] = True
        return L.result("kv_cache_oom", extra, tb, (
            "CUDA ran out of memory while setting up the speculative draft model, which SGLang allocates from the "
            "(1 - mem_fraction_static) reserve after the target's KV pool: lower --mem-fraction-static (now %s, e.g. %s) so the "
            "reserve grows, or lower --max-running-requests / --context-length, or disable speculative decoding."
            % (mf if mf is not None else "?", round(max(0.5, (mf or 0.88) - 0.03), 2))))
    if where == "cuda_graph":
        return L.result("cuda_graph_failed", extra, tb, _remedy_graph(L.facts))
    if where == "kv_pool":
        return L.result("kv_cache_oom", extra, tb, _remedy_kv(L.facts, L.plan))
    if where in ("weights", "distributed_init", "args"):
        return L.result("weights_oom", extra, tb, _remedy_weights(L.facts, exc, L.plan))
    when = "on its first requests" if where in ("warmup", "http", "scheduler_ready") else "after it became ready, on a request"
    return L.result("crashed_after_ready" if where == "serving" else "warmup_failed", extra, tb, (
        "The server ran out of GPU memory %s: lower --mem-fraction-static (now %s) to leave more for activations, or lower "
        "--chunked-prefill-size / --max-running-requests." % (when, mf if mf is not None else "?")))


def _port_failure(L):
    e = _first(L.ms, "bind_error")
    if e is None:
        return None
    L.facts["exception"] = e["msg"]
    port = _sa(L.facts, "port")
    if _stage_at(L.parsed, e["index"]) == "distributed_init":
        remedy = ("A port of the distributed init is in use (%s): pass a free --nccl-port (or --dist-init-addr), or stop what "
                  "listens there (a leftover server of an earlier launch?)." % e["msg"][:200])
    elif "ZMQ" in e["msg"] or "zmq" in e["msg"]:
        remedy = ("A ZeroMQ socket of SGLang could not bind: %s. Another server (a leftover of an earlier launch, or a second "
                  "instance) holds that port: stop it (find it with ss -ltnp) or give this one other ports (--port, and the "
                  "kv-events / disaggregation / metrics ports in the options)." % e["msg"][:200])
    else:
        remedy = ("The HTTP port%s is already in use; SGLang only finds out after the whole model load. Free the port (find the "
                  "listener with ss -ltnp) or choose another --port, and check the port before launching."
                  % ((" %s" % port) if port else ""))
    return L.result("port_in_use", [e], remedy=remedy)


def _warmup_failure(L):
    e = _first(L.ms, "warmup_error") or _first(L.ms, "app_startup_failed")
    if e is None:
        return None
    tb = _pick_traceback(L.parsed, lambda t: t["start"] >= e["index"] - 1) or _pick_traceback(L.parsed)
    L.facts["exception"] = _tb_exception(tb) or e["msg"]
    return L.result("warmup_failed", [e], tb, (
        "The server failed after its HTTP server started (%s). Look at the exception; for a VLM the warmup sends an image "
        "(--disable-fast-image-processor keeps image preprocessing off GPU 0); a 502/503 from a proxy means NO_PROXY must "
        "include 127.0.0.1." % L.facts["exception"]))


# --------------------------------------------------------------------------------------------
# Where the start stood when a process crashed; crashes without a Python traceback
# --------------------------------------------------------------------------------------------

def _serving_began(L, index):
    """True when, before line ``index``, the server was ready, ran a batch that only a request makes, or (in a log that
    does not show the HTTP server starting without getting ready: an excerpt) completed a client's request."""
    if L.ready_line is not None and L.ready_line["index"] < index:
        return True
    if any(signals.serving_batch(e["msg"]) for e in (L.ms.get("prefill") or []) + (L.ms.get("decode") or []) if e["index"] < index):
        return True
    starting = L.ready_line is None and any(k in L.ms for k in ("uvicorn_running", "app_startup"))
    return not starting and any(signals.CLIENT_REQUEST_RE.search(line) for line in L.parsed["lines"][:index] if not line.startswith("#"))


def _crash_stage(L, index, loop=False, stage=None):
    """Where the start stood at line ``index`` (``stage``, else the last milestone up to that line, its own included: a tqdm
    bar and a signal share a line). "serving" once requests ran. A scheduler's event loop (``loop``: its frames, its
    watchdog) or a faulted GPU kernel means batches ran: in a log with no start-up line (an excerpt) the server was
    serving; after the scheduler's set-up but before ready, it was the warmup."""
    if _serving_began(L, index):
        return "serving"
    stage = stage or _stage_at(L.parsed, index + 1)
    fault = any(signals.GPU_FAULT_RE.search(line) for line in L.parsed["lines"] if not line.startswith("#"))
    if stage == "args" and (loop or fault):
        return "serving"
    if loop and stage in ("scheduler_ready", "http"):
        return "warmup"
    return stage


def _tb_stage(L, tb):
    """Where a traceback was raised: serving or the warmup when a scheduler's event loop raised it (its frames below any
    start-up frame), else the start-up stage its frames name, else the last milestone."""
    loop = any(signals.LOOP_FRAME_RE.search(c) for c in (tb.get("calls") or tb["frames"]))
    stage = _crash_stage(L, tb["start"], loop)
    if stage == "serving" or (loop and stage == "warmup"):
        return stage
    return _stage_from_frames(tb) or stage


_AFTER_READY = ("The start had completed and requests had run, so no start-up setting caused this: restart the unit (systemctl "
                "restart sglang) to serve again, then find the cause in the crash's own lines (the scheduler's stack, a CUDA or "
                "NCCL error) and in the host's kernel log (dmesg: Xid errors, the OOM killer). A crash that comes back under load "
                "points at the SGLang version (the compatibility table), --disable-custom-all-reduce, or --disable-cuda-graph.")


def _crashed_after_ready(L, extra, said, tb=None):
    L.facts["failed_stage"] = "serving"
    L.facts.setdefault("failure", "crashed_after_ready")
    return L.result("crashed_after_ready", [L.ready_line] + list(extra), tb, "%s. %s" % (said, _AFTER_READY), gpu=True)


def _signal_failure(L):
    """A process of the server died of a fatal signal (faulthandler's dump, UCX's or the shell's report), without a
    Python exception: named by where the start stood, the crashing thread's frames first."""
    lines = L.parsed["lines"]
    hit = signals.fatal_signal(lines)
    if hit is None and not L.alive:
        # faulthandler's frames whose first line is not in this excerpt: SGLang prints them only for a fatal signal
        hit = next(((t[1][0][0], "a fatal signal") for t in signals.faulthandler_threads(lines) if t[1]), None)
    if hit is None or L.death:
        return None     # a scheduler reported dead: its exit code says the signal (_death_failure)
    index, name = hit
    threads = signals.faulthandler_threads(lines, index)
    where = signals.stack_stage(threads, _FRAME_STAGES)
    stage = _crash_stage(L, index, loop=where == "loop")
    if where not in (None, "loop") and stage != "serving":
        stage = where
    frames = [{"index": i} for t in threads if t[0] is not False for i, _f in t[1][:4]]
    L.facts.update({"signal": name, "exception": lines[index].strip()[-300:]})
    said = "A process of the server died of %s %s, without a Python exception" % (name, _stage_words(stage))
    if stage == "serving":
        res = _crashed_after_ready(L, [{"index": index}] + frames, said)
    else:
        res = _failure_by_stage(L, stage, None, [{"index": index}] + frames)
        res["remedy"] = "%s. %s" % (said, res["remedy"])
    L.facts.update({"failure": "fatal_signal", "failed_stage": stage})
    return res


_HUB_WHAT = {"hub_gated_repo": "the repository is gated and this account has not been granted access",
             "hub_unauthorized": "it rejected the token (none, an invalid one, or one without read access)",
             "hub_repo_not_found": "it does not show the repository to this token (a wrong id, or a private or gated repository)"}


def _hub_failure(L):
    """The Hugging Face Hub refused the model (gated repository, token, repository not found), with or without a
    traceback: before the weights (config, tokenizer) the start had not touched a GPU; from the loader on it was loading."""
    hit = signals.hub_refusal(L.parsed["lines"])
    if hit is None:
        return None
    index, kind = hit
    later = [e for e in L.parsed["events"] if e["index"] > index and _STAGE_OF_MILESTONE.get(e["kind"])]
    if (L.alive or later) and not L.marked_fatal():
        return None     # a warning the start went on past, or a process still trying
    stage = _crash_stage(L, index)
    line = L.parsed["lines"][index].strip()
    tb = _pick_traceback(L.parsed, lambda t: t["start"] <= index <= t["end"] + 8)
    L.facts.update({"failure": kind, "failed_stage": stage, "exception": _tb_exception(tb) or line[:300]})
    remedy = ("The Hugging Face Hub refused the model: %s (%s). This collection serves a local snapshot: download it with the "
              "model stage (kpro.gpu_serving.hf_model; for a gated model its hf_token must belong to an account granted access "
              "on the model's page), point --model-path at that snapshot and set HF_HUB_OFFLINE=1, so the server does not ask "
              "the Hub at start." % (_HUB_WHAT[kind], line[:200]))
    if stage in ("args", "distributed_init", "weights"):
        return L.result("init_failed_before_gpu" if stage == "args" else "weights_load_failed", [{"index": index}], tb, remedy,
                        gpu=True)
    res = _failure_by_stage(L, stage, L.facts["exception"], [{"index": index}], tb)
    res["remedy"] = remedy + " " + res["remedy"]
    return res


def _fatal_traceback(L):
    """The traceback that ended this launch, or None: one the startup went on past, a runtime error after
    ready, or one just printed by a process that is still alive and has not reported a failure."""
    tb = _root_traceback(L.parsed, L.death[2]["index"] if L.death else None)
    if tb is None:
        return None
    marked = L.marked_fatal()
    if L.ready_line is not None and L.ready_line["index"] < tb["start"] and (L.alive or not marked):
        return None
    later = [e for e in L.parsed["events"] if e["index"] > tb["end"] and _STAGE_OF_MILESTONE.get(e["kind"])]
    if later and not marked:
        return None
    if L.alive and not marked:
        return None
    return tb


def _traceback_failure(L):
    tb = _fatal_traceback(L)
    if tb is None:
        return None
    exc = _tb_exception(tb)
    stage = _tb_stage(L, tb)
    L.facts.update({"exception": exc, "failed_stage": stage})
    extra = (L.ms.get("scheduler_exception") or [])[:1] + (L.ms.get("sigquit") or [])[:1]
    if L.death:
        extra.append(L.death[2])
    return _failure_by_stage(L, stage, exc, extra, tb)


_NO_EXCEPTION = "its exception line is not in this log"


def _failure_by_stage(L, stage, exc, extra, tb=None):
    """A failure without a memory, NCCL, graph, port or warmup signature, named by where the startup stopped."""
    shown = exc or _NO_EXCEPTION
    if stage == "serving":
        return _crashed_after_ready(L, extra, "The server had been serving when it failed: %s" % shown, tb)
    if stage == "cuda_graph":
        L.facts["failure"] = "graph_capture_failed"
        return L.result("cuda_graph_failed", extra, tb, _remedy_graph(L.facts) + " The error during capture: %s." % shown)
    if stage in ("http", "warmup"):
        L.facts["failure"] = "failed_after_http_start"
        return L.result("warmup_failed", extra, tb, "The server failed after its HTTP server started: %s." % shown)
    if stage == "distributed_init":
        L.facts["failure"] = "distributed_init_failed"
        return L.result("nccl_error", extra, tb, _remedy_nccl(exc, False))
    kind = _exception_kind(exc)
    if kind == "invalid_configuration" and stage != "args":
        kind = None     # a TypeError / ValueError / AssertionError past the arguments: the stage says more
    if kind is None and stage == "args" and tb is not None and _raised_while_importing(tb):
        kind = "import_error"   # whatever was raised while importing SGLang's modules, the import failed
    L.facts["failure"] = kind or {"weights": "weights_load_failed", "kv_pool": "kv_pool_failed",
                                  "scheduler_ready": "scheduler_init_failed"}.get(stage, "init_failed")
    remedy = _remedy_init(L, kind, stage, shown)
    if not L.facts["gpu_touched_per_log"] and stage == "args":
        remedy = ("The server exited during initialisation before it touched the GPUs (no 'Init torch distributed begin.', from 0.5.21 "
                  "'Init parallel begin.', in this launch's log). " + remedy)
    return L.result(_STAGE_PHASES.get(stage, "init_failed_before_gpu"), extra, tb, remedy, gpu=True)


# Where a start that failed without a memory, NCCL, graph, port or warmup signature stopped, by the last line 0.5.11 wrote
# before it: model_runner.py:1290 "Load weight begin." .. :1468 "Load weight end."; then init_memory_pool (memory_pool.py:735
# "KV Cache is allocated.", model_runner_kv_cache_mixin.py:769 "Memory pool end.") and the attention backend; the
# scheduler's own set-up follows the model runner (scheduler.py:432-470, its "max_total_num_tokens=" line at :764). Before
# "Init torch distributed begin." (model_runner.py:1103, logged before set_device at :1106; from 0.5.21 "Init parallel
# begin.", distributed/bootstrap.py:118, before set_device at :130) no GPU was touched.
_STAGE_PHASES = {"weights": "weights_load_failed", "kv_pool": "kv_pool_init_failed", "scheduler_ready": "scheduler_init_failed"}


def _remedy_init(L, kind, stage, shown):
    if kind == "unsupported_architecture":
        return ("This SGLang version does not support the model's architecture (%s): use an SGLang version that does (see the "
                "compatibility table) or --model-impl transformers." % shown)
    if kind == "import_error":
        return ("SGLang could not import its own modules (%s): a compiled extension does not match the installed torch / CUDA / "
                "driver. Reinstall the venv from the lock file (sgl-kernel, flashinfer and torch as pinned) instead of "
                "upgrading one package." % shown)
    if kind == "nvidia_smi_missing":
        return ("nvidia-smi is missing in the container (%s): install the driver userspace (nvidia_driver mode=userspace)."
                % shown)
    if kind == "model_files":
        return ("The model or tokenizer files could not be read (%s): point --model-path at the complete local snapshot "
                "(hf_model verifies it) and set HF_HUB_OFFLINE=1 so nothing is fetched at start." % shown)
    if kind == "invalid_configuration" and stage in ("args", None):
        return ("SGLang refused its configuration before loading the weights (%s): change the option the message names in the "
                "server options." % shown)
    if stage == "weights" and shown == _NO_EXCEPTION:
        return ("Loading the weights failed, and this log does not show why (%s): look for the exception above the excerpt "
                "(CUDA out of memory there would be weights_oom); else check that the checkpoint is complete and is the revision "
                "the options expect (sizes verified by hf_model), and that --quantization / --dtype match it." % shown)
    if stage == "weights":
        return ("Loading the weights failed, and not for lack of memory (%s): check that the checkpoint is complete and is the "
                "revision the options expect (sizes verified by hf_model), and that --quantization / --dtype match it."
                % shown)
    if stage == "kv_pool":
        return ("Building the KV cache pool failed with an error that is not out of memory (%s): an unsupported combination of "
                "--kv-cache-dtype, --attention-backend and this model on this GPU; change one of them or the SGLang version."
                % shown)
    where = {"args": "before loading the weights", "scheduler_ready": "after the model was loaded, while the scheduler "
             "finished its set-up"}.get(stage, "during initialisation")
    return "The server failed %s: %s. Fix what the exception names (model files, architecture support, flags)." % (where, shown)


def _death_failure(L):
    """A scheduler reported dead with no error of its own in the log: its exit code is the evidence."""
    if not L.death:
        return None
    rank, code, e = L.death
    stage = _stage_at(L.parsed, e["index"])
    tb = _pick_traceback(L.parsed, lambda t: t["start"] >= e["index"] - 1)
    L.facts.update({"failed_stage": stage, "exception": _tb_exception(tb) or e["msg"]})
    signal = _SIGNALS.get(-code) if code is not None and code < 0 else None
    said = "Rank %s's scheduler died during initialisation (exit code %s%s)" % (
        rank, code if code is not None else "not in the log", ", %s" % signal if signal else "")
    if code == -9:
        L.facts["failure"] = "scheduler_killed"
        return _host_oom_killed(L, stage, [e], tb, "%s, %s" % (said, _stage_words(stage)))
    res = _failure_by_stage(L, stage, None, [e], tb)
    res["remedy"] = "%s. Its own error is not in this log: look at the rank's lines above it. %s" % (said, res["remedy"])
    L.facts["failure"] = "scheduler_exited"
    return res


def _stage_words(stage):
    if stage == "args":
        return "before any start-up milestone in this log"
    return "during " + stage.replace("_", " ")


def _host_oom_killed(L, stage, extra, tb, said):
    """A process of the server SIGKILLed with no error of its own: what the kernel's OOM killer does when the host's RAM or
    the container's memory limit runs out (0.5.11 engine.py:1220-1223 says so for exit code -9)."""
    # 0.1.0's name for the same launch, kept for one release (failure.FORMER_PHASES)
    L.facts["former_phase"] = "weights_oom" if stage in ("args", "distributed_init", "weights") else {
        "cuda_graph": "cuda_graph_failed", "http": "warmup_failed", "warmup": "warmup_failed", "serving": "warmup_failed"}.get(
            stage, "init_failed_before_gpu")
    return L.result("host_oom_killed", extra, tb, (
        "%s. A SIGKILL without an error of its own is the kernel's OOM killer: host RAM or the container's memory limit ran "
        "out, not GPU memory (loading reads the checkpoint through RAM, each rank its share). Check `dmesg -T | grep -i oom` "
        "(or journalctl -k) on the Proxmox host, then give the container more memory (pct set <vmid> --memory N on the host), "
        "stop what else uses the host's RAM, or load with fewer threads (--model-loader-extra-config "
        "'{\"enable_multithread_load\": false}')." % said), gpu=True)


# What ends a launch without an error line of its own; the first four are SGLang's own report of a child's failure, after
# which it SIGKILLs its own tree (exit 137, the shell's "Killed": sglang-0.5.11 entrypoints/engine.py:1180-1190).
_OWN_REPORT = ("sigquit", "init_failed", "scheduler_exception", "watchdog")
_ENDED = _OWN_REPORT + ("killed",)


def _exit_words(status):
    """ "exit status 139 (SIGSEGV)": a shell's 128+N or a negative code names the signal."""
    code = status if status is None or status < 0 else (status - 128 if 128 < status < 160 else None)
    signal = _SIGNALS.get(-code) if code is not None and code < 0 else _SIGNALS.get(code) if code else None
    return "exit status %s%s" % (status, " (%s)" % signal if signal else "")


def _exit_failure(L):
    """The launch ended (process state, or a Killed / sigquit / watchdog line) without an error line of its own."""
    ms = L.ms
    marks = sorted((e for k in _ENDED for e in ms.get(k) or []), key=lambda e: e["index"])
    ready = L.ready_line["index"] if L.ready_line else None
    if not (L.exited or marks) or (ready is not None and (L.alive or not L.exited and not [e for e in marks if e["index"] > ready])):
        return None     # a server that was ready and lives on (its runtime errors are not the launch's)
    stage = _crash_stage(L, marks[0]["index"] if marks else len(L.parsed["lines"]), loop="watchdog" in ms, stage=L.facts["stage"])
    L.facts["failed_stage"] = stage
    extra = [(ms.get(k) or [None])[0] for k in ("watchdog", "killed", "sigquit", "init_failed")]
    if stage == "serving":
        return _crashed_after_ready(L, extra, "The server had been serving and then exited (%s) without an exception in the "
                                    "log" % _exit_words(L.exit_status))
    if not L.facts["gpu_touched_per_log"]:
        L.facts["failure"] = "init_failed"
        return L.result("init_failed_before_gpu", extra, gpu=True, remedy=(
            "The server exited during initialisation before it touched the GPUs (no 'Init torch distributed begin.', from 0.5.21 'Init "
            "parallel begin.', in this launch's log) and without an exception in the log; see the unit's journal. Exit status: %s." % L.exit_status))
    # a SIGKILL without SGLang's own report of a failed child came from outside
    if not any(k in ms for k in _OWN_REPORT) and ("killed" in ms or L.exit_status in (137, -9)):
        L.facts["failure"] = "killed"
        how = "exit status %s" % L.exit_status if L.exit_status is not None else "the log's 'Killed' line"
        return _host_oom_killed(L, stage, extra, None, "The server was SIGKILLed (%s) %s, without an error in the log"
                                % (how, _stage_words(stage)))
    res = _failure_by_stage(L, stage, None, extra)
    if stage == "weights":
        res["facts"]["former_phase"] = "weights_oom"
    said = "The server exited %s without an exception in the log (%s)" % (_stage_words(stage), _exit_words(L.exit_status))
    res["remedy"] = "%s. %s" % (said, res["remedy"])
    return res


_FAILURE_CHECKS = (_driver_failure, _argparse_failure, _peer_failure, _nccl_failure, _known_bad_failure, _toolchain_failure,
                   _graph_failure, _kv_failure, _oom_failure, _port_failure, _warmup_failure, _hub_failure, _signal_failure,
                   _traceback_failure, _death_failure, _exit_failure)


def _pre_launch(compat, driver, foreign_processes):
    """The phases the gate checks before a launch: compatibility table, driver versions, foreign GPU memory."""
    if compat and compat.get("action") == "refuse":
        return _result("known_bad_version", [compat.get("message", "")] + [r.get("reason", "") for r in compat.get("rules", [])],
                       compat.get("remedy") or compat.get("message", ""), {"compat": compat})
    if driver and driver.get("kernel") and driver.get("library") and str(driver["kernel"]) != str(driver["library"]):
        return _result("version_mismatch", ["kernel module %s, userspace library %s" % (driver["kernel"], driver["library"])],
                       "Install the NVIDIA userspace of exactly version %s (the host's kernel module) in the container with "
                       "--no-kernel-modules (kpro.gpu_serving.nvidia_driver mode=userspace)." % driver["kernel"],
                       {"driver": driver})
    foreign = [p for p in (foreign_processes or []) if not p.get("ours")]
    if foreign:
        ev = ["PID %s %s holds %s MiB on GPU %s" % (p.get("pid"), p.get("name") or "?", p.get("used_mib", "?"), p.get("gpu", "?"))
              for p in foreign]
        return _result("gpu_memory_held", ev,
                       "GPU memory is held by processes that are not this unit's: stop them (or wait until NVML shows the memory "
                       "released); only processes of our own unit are ended automatically, never by name.",
                       {"foreign_processes": foreign})
    return None


def _no_log(text, launch_id, exit_status, process_alive):
    facts = {"log_lines": 0, "launch_id": launch_id, "exit_status": exit_status}
    if process_alive:
        return _result("loading", ["no log lines yet for this launch"], "Wait: the process is alive and has not logged yet.", facts)
    return _result("not_started", ["no log for this launch" if text is None else "the log of this launch is empty"],
                   "The server did not start: check the unit (systemctl status, journalctl -u) and its ExecStart; "
                   "the log of this launch has no lines.", facts)


def _probe_result(L, probe):
    """degenerate_output for a smoke completion that is garbage, else None."""
    deg, reason = probe.get("degenerate"), probe.get("reason")
    if deg is None and "text" in probe:
        res = detect_degenerate(probe.get("text"))
        deg, reason = res["degenerate"], res["reason"]
    if not deg:
        return None
    L.facts["probe_reason"] = reason
    spec = probe.get("speculative") if probe.get("speculative") is not None else bool(_sa(L.facts, "speculative_algorithm"))
    remedy = "The server answers, but the text is degenerate (%s)." % reason
    if spec:
        remedy += (" Speculative decoding is the first suspect: relaunch without --speculative-algorithm / --speculative-num-steps "
                   "/ --speculative-eagle-topk / --speculative-num-draft-tokens and probe again.")
    remedy += (" Check the SGLang version against the compatibility table (0.5.9 at TP>1 gives wrong output for dense Qwen3.5 "
               "models, fixed by PR #19070; 0.5.10.x by PR #22312).")
    res = L.result("degenerate_output", [L.ready_line], remedy=remedy)
    res["evidence"].insert(0, "smoke completion is degenerate (%s): %r" % (reason, (probe.get("text") or "")[:200]))
    return res


def _is_ready(L, http, planned_weights_mib):
    health = (http or {}).get("health")
    models = (http or {}).get("models")
    expected = (http or {}).get("expected_model")
    http_ready = health == 200 and (expected is None or models is None or expected in models)
    if http is not None and health == 200 and expected is not None and models is not None and expected not in models:
        L.facts["models"] = models
    ready = bool(L.ready_line) or http_ready
    if http is not None and health is not None and health != 200:
        ready = False
    if ready and planned_weights_mib and L.gpu_used:
        low = [i for i, u in enumerate(L.gpu_used) if float(u) < 0.9 * float(planned_weights_mib)]
        if low:
            L.facts["gpus_below_planned_weights"] = low
            ready = False
    return ready, http_ready, expected


def _timeout_remedy(L, timeout_s, stalled_s):
    stuck = L.facts.get("stage")
    remedy = "No readiness within %ss (stage %s, last line: %s)." % (int(round(timeout_s)), stuck, L.facts.get("last_milestone_line", "?"))
    if stalled_s is not None and stalled_s < 60:
        return remedy + " It is still progressing (slow load): raise the gate's timeout."
    if stuck == "distributed_init":
        return remedy + (" It hangs in distributed init: P2P over PCIe under an IOMMU can hang custom all-reduce/NCCL; pass "
                         "--disable-custom-all-reduce and set NCCL_P2P_DISABLE=1.")
    if stuck == "cuda_graph":
        return remedy + (" It hangs in CUDA graph capture: drop --enable-torch-compile if set, try --disable-custom-all-reduce "
                         "(an error inside capture with custom all-reduce can hang instead of failing), or --disable-cuda-graph.")
    if stuck in ("http", "warmup"):
        return remedy + (" The HTTP server is up but warmup did not finish: check that 127.0.0.1 bypasses any proxy (NO_PROXY) "
                         "and that the first generation does not hang.")
    return remedy + " Neither the log nor GPU memory advanced: the server hangs; stop the unit and look at the last lines."


def _running(L, planned_weights_mib, http, probe, elapsed_s, timeout_s, stalled_s):
    """No failure in the log: ready (maybe with degenerate output), still loading, or out of time."""
    ready, http_ready, expected = _is_ready(L, http, planned_weights_mib)
    if ready:
        if probe is not None:
            res = _probe_result(L, probe)
            if res is not None:
                return res
        res = L.result("ready", [L.ready_line])
        if http_ready:
            res["evidence"].append("GET /health 200" + ((", /v1/models lists %s" % expected) if expected else ""))
        return res
    L.facts["progress"] = {"stage": L.facts.get("stage"), "last_milestone": L.facts.get("last_milestone"), "stalled_s": stalled_s,
                           "gpu_above_baseline": (not _at_baseline(L.gpu_used, L.gpu_baseline)) if L.gpu_used is not None else None}
    res = L.result("loading")
    if L.gpu_used is not None:
        res["evidence"].append("GPU memory used (MiB): %s" % ", ".join(str(int(u)) for u in L.gpu_used))
    if timeout_s is not None and elapsed_s is not None and elapsed_s >= timeout_s:
        res.update(phase="timeout", remedy=_timeout_remedy(L, timeout_s, stalled_s))
        return res
    res["remedy"] = "Wait: the server is still starting (stage %s)." % L.facts.get("stage")
    return res


def diagnose(log_text, gpu_used_mib=None, gpu_baseline_mib=None, exit_status=None, process_alive=None, planned_weights_mib=None,
             http=None, probe=None, launch_id=None, elapsed_s=None, timeout_s=None, stalled_s=None, foreign_processes=None,
             driver=None, compat=None, plan=None):
    """Name the phase of one launch of the SGLang server, with evidence and remedy.

    Arguments (all optional except ``log_text``):
      log_text: the log of *this* launch (None: no log at all). With ``launch_id`` the text is first
        narrowed with :func:`select_launch`; a log without that launch's header counts as no log.
      gpu_used_mib / gpu_baseline_mib: per-GPU NVML memory.used now and before the launch.
      exit_status: the main process's exit code (137 / -9 = SIGKILL, what a failed startup ends with);
        None while running or unknown.
      process_alive: whether the main process (or the unit) is alive; None when unknown, in which
        case the log alone decides (a traceback, an argparse error or a dead scheduler ends a launch).
      planned_weights_mib: the plan's weights per GPU; readiness requires every GPU to hold at least 90 %.
      http: dict(health=<status or None when refused>, models=[ids], expected_model=<id>).
      probe: dict(text=<smoke completion>, speculative=<bool>) or dict(degenerate=<bool>, reason=...).
      elapsed_s / timeout_s / stalled_s: time since launch, the budget, seconds since log or memory last advanced.
      foreign_processes: list of dict(pid, name, used_mib, ours) holding GPU memory before the launch.
      driver: dict(kernel=<version>, library=<version>) from /proc/driver/nvidia/version and NVML.
      compat: the result of compat.check() (action refuse -> known_bad_version).
      plan: the result of sglang_plan.plan(), used for numbers in remedies.

    Returns dict(phase, evidence: [str], remedy: str, facts: dict). Failures also set
    ``facts["failed_stage"]`` (where the startup stopped) and, when the phase alone does not say
    it, ``facts["failure"]`` (argparse, unsupported_architecture, import_error, invalid_configuration,
    weights_load_failed, kv_pool_failed, scheduler_killed, scheduler_exited, ...).
    """
    pre = _pre_launch(compat, driver, foreign_processes)
    if pre is not None:
        return pre
    text = select_launch(log_text, launch_id) if log_text is not None else None
    if text is None or not text.strip():
        return _no_log(text, launch_id, exit_status, process_alive)
    L = _Launch(signals.redact(text), gpu_used_mib, gpu_baseline_mib, exit_status, process_alive, plan)
    for check in _FAILURE_CHECKS:
        res = check(L)
        if res is not None:
            return res
    return _running(L, planned_weights_mib, http, probe, elapsed_s, timeout_s, stalled_s)


def _gpu_evidence(gpu_used_mib, gpu_baseline_mib, exit_status):
    out = []
    if gpu_used_mib is not None:
        base = _at_baseline(gpu_used_mib, gpu_baseline_mib)
        used = ", ".join(str(int(u)) for u in gpu_used_mib)
        out.append("GPU memory used (MiB): %s%s" % (used, " (every GPU at baseline)" if base else ""))
    if exit_status is not None:
        out.append("exit status: %s" % exit_status)
    return out


def _result(phase, evidence, remedy, facts):
    if phase not in PHASES:
        raise ValueError("unknown phase %r" % phase)
    if phase in FORMER_PHASES:
        facts.setdefault("former_phase", FORMER_PHASES[phase])
    return {"phase": phase, "evidence": [e for e in evidence if e], "remedy": remedy, "facts": facts}


# --------------------------------------------------------------------------------------------
# One log file (sglang_diagnose)
# --------------------------------------------------------------------------------------------

def mib_list(value):
    """A list of per-GPU MiB from a list, a number, or a string "[0,0]" / "0, 0" / "0 0"."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, str):
        value = [v for v in value.strip().strip("[]").replace(",", " ").split() if v]
    if not isinstance(value, (list, tuple)):
        raise ValueError("not a list: %r" % (value,))
    return [float(v) for v in value]


def diagnose_file(log_path, launch_id=None, gpu_used_mib=None, gpu_baseline_mib=None, **kw):
    """sglang_diagnose's result: :func:`diagnose` of one launch of the log file ``log_path`` (missing: not_started), with
    ``log_found`` and, for a renamed failure, ``former_phase``. A GPU list that is not one, or a log that cannot be read,
    is a ``bad_input`` Failure (the module fails with it in main)."""
    gpus = {}
    for key, value in (("gpu_used_mib", gpu_used_mib), ("gpu_baseline_mib", gpu_baseline_mib)):
        try:
            gpus[key] = mib_list(value)
        except ValueError as e:
            raise Failure("bad_input", "%s: %s" % (key, e), remedy="Give a list of MiB per GPU, for example [0, 0].")
    text = None
    if os.path.exists(log_path):
        try:
            with open(log_path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except (IOError, OSError) as e:
            raise Failure("bad_input", "log_path: cannot read the server log %s: %s" % (log_path, e))
    part = select_launch(text, launch_id) if text is not None else None
    res = diagnose(text, launch_id=launch_id, **dict(kw, **gpus))
    res["log_found"] = bool(part and part.strip())
    if "former_phase" in res["facts"]:
        res["former_phase"] = res["facts"]["former_phase"]
    return res
