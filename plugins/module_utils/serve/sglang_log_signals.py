# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a server log says without a Python traceback: a fatal signal, the Hub refusing the model, serving had begun.

Pure functions over the log's lines (standard library only); sglang_log names the phase from what they find.
"""

from __future__ import annotations

import re

# A process that died of a signal, in the words of whoever reported it, with the signal's name.
# - CPython's faulthandler, which each SGLang scheduler enables (sglang-0.5.11 managers/scheduler.py:3861): "Fatal Python
#   error: Segmentation fault" (a tqdm bar may be glued in front of it);
# - UCX's handler (ucs_handle_error): "[host:pid:0:tid] Caught signal 11 (Segmentation fault: ...)";
# - absl's / Ray's logging.cc: "*** SIGSEGV received at time=..."; torch elastic: "Signal 11 (SIGSEGV) received by PID";
# - the shell: "Segmentation fault (core dumped)"; libstdc++ before abort(): "terminate called after throwing an instance of";
# - an exit code or status naming the signal: "exit code: -11", "exitcode: -6", "interrupted by signal 11: SIGSEGV".
_NAMES = {"segmentation fault": "SIGSEGV", "aborted": "SIGABRT", "bus error": "SIGBUS", "floating point exception": "SIGFPE",
          "illegal instruction": "SIGILL"}
_NUMBERS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}
_WORDS = r"(Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction)"
_SIGNAL_RES = (
    (re.compile(r"Fatal Python error: " + _WORDS), "name"),
    (re.compile(r"Caught signal (\d+) \("), "number"),
    (re.compile(r"\*\*\* (SIG[A-Z]+) received at time="), "sig"),
    (re.compile(r"Signal (\d+) \(SIG[A-Z]+\) received by PID"), "number"),
    (re.compile(_WORDS + r"(?::\s*\d+)? \(core dumped\)"), "name"),
    (re.compile(r"terminate called (?:after throwing an instance of|without an active exception)"), "abort"),
    (re.compile(r"(?:exit ?code|exitcode)\s*[:=]?\s*-(4|6|7|8|11)\b"), "number"),
    (re.compile(r"(?:interrupted|terminated|killed) by signal (4|6|7|8|11)\b"), "number"),
)
# faulthandler's frame: 'File "x.py", line 12 in func' (a Python traceback has "line 12, in func"), and its thread headers
_FH_FRAME_RE = re.compile(r'^\s*File "[^"]*", line \d+ in (\S+)\s*$')
_FH_THREAD_RE = re.compile(r"^\s*(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
# Frames of a scheduler that had finished its set-up and was running batches: its event loop (sglang-0.5.11
# managers/scheduler.py event_loop_normal / event_loop_overlap, dispatched by run_event_loop) and its watchdog thread,
# which only counts time while a batch runs (utils/watchdog.py:121-160; 0.4.x: Scheduler.watchdog_thread).
LOOP_FRAME_RE = re.compile(r"\b(?:event_loop_normal|event_loop_overlap|run_event_loop|dispatch_event_loop|process_batch_result"
                           r"|_?watchdog_thread|_watchdog_once)\b")
# A GPU kernel that faulted: only a process running kernels (graph capture, warmup, requests) can print these.
GPU_FAULT_RE = re.compile(r"HSA_STATUS_ERROR_\w+|an illegal memory access was encountered|cudaErrorIllegalAddress"
                          r"|device-side assert triggered|unspecified launch failure")

# The Hub refusing the model: huggingface_hub 2.4.0 utils/_http.py:888-960 (hf_raise_for_status: "Cannot access gated repo
# for url", "Repository Not Found for url", "Make sure your token has the correct permissions"), hf_api.py:2269 ("Invalid
# user token."), the server's own messages it appends ("Access to model X is restricted ...", "Invalid credentials in
# Authorization header", "Invalid username or password."), and transformers' OSError ("You are trying to access a gated repo.",
# "... is not a valid model identifier listed on 'https://huggingface.co/models'").
_HUB_RES = (
    ("hub_gated_repo", re.compile(r"Cannot access gated repo for url|GatedRepoError|You are trying to access a gated repo"
                                  r"|Access to model \S+ is restricted|Repo model \S+ is gated")),
    ("hub_unauthorized", re.compile(r"Invalid user token|Invalid credentials in Authorization header|Invalid username or password"
                                    r"|\b40[13] Client Error\b.*(?:huggingface\.co|Request ID: Root=)|Make sure your token has the"
                                    r" correct permissions")),
    ("hub_repo_not_found", re.compile(r"Repository Not Found for url|RepositoryNotFoundError"
                                      r"|is not a valid model identifier listed on 'https://huggingface\.co/models'")),
)


def fatal_signal(lines):
    """(line index, signal name) of the first line that reports a fatal signal, or None. Lines that begin with "#" (the
    unit's launch header, comments) are not the server's output."""
    for i, line in enumerate(lines):
        if line.startswith("#"):
            continue
        for rx, how in _SIGNAL_RES:
            m = rx.search(line)
            if m:
                return i, _signal_name(m, how)
    return None


def _signal_name(m, how):
    if how == "name":
        return _NAMES[m.group(1).lower()]
    if how == "number":
        return _NUMBERS.get(int(m.group(1)), "signal %s" % m.group(1))
    if how == "sig":
        return m.group(1)
    return "SIGABRT"


def faulthandler_threads(lines, start=0):
    """faulthandler's stacks from line ``start`` on: [(current, [(line index, frame), innermost first])]; frames before any
    thread header (an excerpt that lost it) form a block with ``current`` None."""
    threads = []
    for i in range(start, len(lines)):
        h = _FH_THREAD_RE.match(lines[i])
        if h:
            threads.append((h.group(1) == "Current thread", []))
        elif _FH_FRAME_RE.match(lines[i]):
            if not threads:
                threads.append((None, []))
            threads[-1][1].append((i, lines[i].strip()))
    return threads


def stack_stage(threads, frame_stages):
    """The start-up stage the crashing thread's frames name (``frame_stages``: sglang_log's (stage, regex) list), "loop"
    when a scheduler's event loop or watchdog thread is on any stack, or None."""
    for current, frames in sorted(threads, key=lambda t: {True: 0, None: 1, False: 2}[t[0]]):
        if any(LOOP_FRAME_RE.search(f) for _i, f in frames):
            return "loop"
        if current is False:
            continue
        for _i, frame in frames:
            for stage, rx in frame_stages:
                if rx.search(frame):
                    return stage
    return None


def hub_refusal(lines):
    """(line index, kind) of the first line where the Hub refused the model, or None."""
    for i, line in enumerate(lines):
        if line.startswith("#"):
            continue
        for kind, rx in _HUB_RES:
            if rx.search(line):
                return i, kind
    return None


_BATCH_NUMS_RE = re.compile(r"#(new-token|running-req|queue-req): (\d+)")
# uvicorn's access line of a client's completed request: the warmup posts to /generate (/v1/chat/completions only for a
# vision model, before the ready line)
CLIENT_REQUEST_RE = re.compile(r'"POST /v1/(?:chat/)?completions HTTP/[\d.]+" 200\b')


def serving_batch(msg):
    """True for a batch line only serving can print. The warmup (sglang-0.5.11 entrypoints/http_server.py:1886-1937) sends
    one short prompt ("The capital city of France is", dp_size copies) for 8 new tokens, and a "Decode batch" line comes
    every 40 decode steps (decode_log_interval): a decode line, or a prefill with others running, queued, or a long
    prompt, is a request's."""
    if re.search(r"\bDecode batch[.,] ", msg):
        return True
    if not re.search(r"\bPrefill batch[.,] ", msg):
        return False
    nums = dict((k, int(v)) for k, v in _BATCH_NUMS_RE.findall(msg))
    return nums.get("new-token", 0) > 64 or nums.get("running-req", 0) > 0 or nums.get("queue-req", 0) > 0


# Secrets a server prints, kept out of the diagnosis (its evidence and facts quote log lines). The unit's launcher masks
# them in the log it writes (sglang_unit.LAUNCHER_SCRIPT); a log from elsewhere may hold them. Every release prints the
# API keys on its server_args line: 0.5.11 "api_key='k'" (the dataclass repr, entrypoints/engine.py:188), from 0.5.19
# "'api_key': 'k'" (resolved_dict(), engine.py:1098; 0.5.22 redacts only the watermark keys, engine.py:171). A value cut
# off with its line is masked to the line's end.
_SECRET_RES = (
    (re.compile(r"(api_key(?:=|': ))'(?:[^'\\\n]|\\.)*'?"), r"\1'<redacted>'"),
    (re.compile(r"(api_key(?:=|': ))\"(?:[^\"\\\n]|\\.)*\"?"), r'\1"<redacted>"'),
    (re.compile(r"(Bearer )[^\s\"',]+"), r"\1<redacted>"),
    (re.compile(r"(--(?:admin-)?api-key[ =])\S+"), r"\1<redacted>"),
)


def redact(text):
    """``text`` with the API keys and Bearer tokens in it replaced by <redacted>."""
    for rx, to in _SECRET_RES:
        text = rx.sub(to, text)
    return text
