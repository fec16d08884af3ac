from __future__ import annotations

import glob
import os
import re

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import compat
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log as sl

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "sglang_logs")


def read(name):
    with open(os.path.join(FIX, name), encoding="utf-8") as f:
        return f.read()


def header(text, key):
    m = re.search(r"^# %s: (.*)$" % key, text, re.M)
    return m.group(1).strip() if m else None


FIXTURES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIX, "*.log")))
REAL = [f for f in FIXTURES if not f.startswith("synthetic_")]
FAILURES = [f for f in REAL if header(read(f), "expected_phase").split()[0] not in ("ready", "loading", "timeout")]


def body(text):
    """The log under a fixture's header (the leading '# key: value' lines)."""
    lines = text.splitlines()
    n = 0
    while n < len(lines) and lines[n].startswith("# "):
        n += 1
    return lines[n:]


def expected_of(name):
    return header(read(name), "expected_phase").split()[0]


def evidence_of(name):
    return re.findall(r"^# evidence: (.*)$", read(name), re.M)


def test_there_are_enough_real_logs_for_each_phase_found():
    assert len(REAL) >= 30
    phases = set(expected_of(f) for f in REAL)
    assert {"not_started", "init_failed_before_gpu", "weights_oom", "kv_cache_oom", "nccl_error", "cuda_graph_failed",
            "port_in_use", "warmup_failed", "loading", "ready", "timeout", "host_oom_killed", "weights_load_failed",
            "kv_pool_init_failed", "scheduler_init_failed"} <= phases


@pytest.mark.parametrize("name", REAL)
def test_real_logs_name_their_source_and_evidence(name):
    text = read(name)
    assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues/\d+|pull/\d+|blob/[0-9a-f]{40}/\S+) \(", header(text, "source"))
    assert header(text, "note")
    for ev in evidence_of(name):
        assert any(ev in line for line in body(text)), ev


@pytest.mark.parametrize("name", [f for f in FIXTURES if f != "synthetic_two_launches.log"])
def test_fixture_gets_its_expected_phase(name):
    text = read(name)
    expected = expected_of(name)
    if expected in ("ready", "loading"):
        res = sl.diagnose(text, process_alive=True)
    elif expected == "timeout":
        res = sl.diagnose(text, process_alive=True, elapsed_s=1200, timeout_s=900, stalled_s=600)
    else:
        # a failed SGLang startup ends with the main process SIGKILLed by its own tree kill
        res = sl.diagnose(text, exit_status=137, process_alive=False, gpu_used_mib=[0, 0], gpu_baseline_mib=[0, 0])
    assert res["phase"] == expected, (res["phase"], res["evidence"], res["remedy"])
    assert res["phase"] in sl.PHASES
    assert res["evidence"]
    if expected != "ready":
        assert res["remedy"]
    # the evidence is lines of this log (or numbers), never made up
    lines = set(text.splitlines())
    for ev in res["evidence"]:
        assert ev in lines or ev.startswith(("GPU memory", "exit status", "...")) or "... (" in ev


@pytest.mark.parametrize("name", REAL)
def test_the_log_alone_names_the_phase(name):
    # sglang_diagnose given only a log file: no process state, no GPU numbers
    expected = expected_of(name)
    res = sl.diagnose(read(name))
    assert res["phase"] == ("loading" if expected == "timeout" else expected), (res["phase"], res["remedy"])


def _cuts(lines):
    for n in (1, 2, 3, 5, 8, 13, 21, 34, 55):
        if n < len(lines):
            yield "head", n, lines[n:]
            yield "tail", n, lines[:-n]


@pytest.mark.parametrize("name", REAL)
def test_excerpts_cut_at_either_end_keep_their_phase(name):
    # published logs are excerpts: while the lines that decide the phase are there, a missing head
    # or tail changes nothing; a failure stays a failure while any error line is left
    expected = expected_of(name)
    keys = evidence_of(name)
    for end, n, lines in _cuts(body(read(name))):
        text = "\n".join(lines) + "\n"
        res = sl.diagnose(text)
        if all(any(k in line for line in lines) for k in keys):
            assert res["phase"] == ("loading" if expected == "timeout" else expected), (end, n, res["phase"])
        elif expected in FAILURE_PHASES and re.search(r"Traceback|^\S*(Error|Exception)\b|error: |scheduler (is dead|died)", text, re.M):
            assert res["phase"] != "loading", (end, n, res["evidence"])


FAILURE_PHASES = set(p for p in sl.PHASES if p not in ("ready", "loading", "timeout"))


def test_signatures_do_not_need_the_exit_status():
    for name in ("synthetic_kv_cache_oom_seed_nextn.log", "nccl_error_sglang_4289.log", "cuda_graph_failed_sglang_4205.log",
                 "warmup_failed_sglang_2468.log", "kv_cache_oom_sglang_12496.log", "weights_oom_lsglang_7.log"):
        expected = header(read(name), "expected_phase").split()[0]
        assert sl.diagnose(read(name))["phase"] == expected, name


# --- parsing -------------------------------------------------------------------------------

def test_parse_line_formats():
    ev = sl.parse_line("[2026-03-01 10:00:05 TP1] Init torch distributed begin.")
    assert (ev["ts"], ev["rank"], ev["source"], ev["msg"]) == ("2026-03-01 10:00:05", 1, "sglang", "Init torch distributed begin.")
    ev = sl.parse_line("[2025-07-02 07:41:58 DP3 TP3] Load weight end. type=X")
    assert ev["tags"] == {"DP": 3, "TP": 3} and ev["rank"] == 3
    ev = sl.parse_line("[2026-03-01 10:01:51] INFO:     Started server process [4242]")
    assert ev["source"] == "uvicorn" and ev["msg"] == "Started server process [4242]" and ev["rank"] is None
    ev = sl.parse_line("[2026-03-01 10:00:05.123 TP0] x")
    assert ev["time"] == pytest.approx(sl.parse_line("[2026-03-01 10:00:05 TP0] x")["time"] + 0.123)
    # collector prefixes
    ev = sl.parse_line("sglang-1  | [2025-11-01 16:50:36 TP0] sglang is using nccl==2.27.3")
    assert ev["rank"] == 0 and ev["msg"] == "sglang is using nccl==2.27.3"
    ev = sl.parse_line("Mar 01 10:00:05 ct129 python3[4242]: [2026-03-01 10:00:05 TP0] Init torch distributed begin.")
    assert ev["rank"] == 0 and ev["msg"] == "Init torch distributed begin."
    ev = sl.parse_line("INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)")
    assert ev["source"] == "uvicorn"


def test_parse_ready_log_milestones_in_order():
    parsed = sl.parse_log(read("synthetic_ready_tp2_nextn.log"))
    order = []
    for e in parsed["events"]:
        if e["kind"] not in order:
            order.append(e["kind"])
    assert order[:13] == ["server_args", "dist_begin", "dist_end", "weights_begin", "shards", "weights_end", "mamba_alloc",
                          "kv_alloc", "mem_pool_end", "graph_begin", "graph_progress", "graph_end", "max_total_tokens"]
    assert order[-5:] == ["app_startup", "uvicorn_running", "prefill", "ready"] or "ready" == order[-1]
    assert not parsed["tracebacks"]
    draft = [e for e in parsed["milestones"]["graph_begin"] if e["data"]["draft"]]
    assert len(draft) == 4  # draft + draft extend, two ranks


def test_facts_from_the_ready_log():
    res = sl.diagnose(read("synthetic_ready_tp2_nextn.log"), process_alive=True, gpu_used_mib=[45000, 45100],
                      planned_weights_mib=26512)
    f = res["facts"]
    assert res["phase"] == "ready" and res["remedy"] == ""
    assert f["kv_tokens"] == 398784 and f["max_total_num_tokens"] == 398784
    assert f["weights_gib"] == 26.5 and f["avail_before_weights_gib"] == 47.2 and f["avail_after_weights_gib"] == 20.7
    assert f["draft_weights_gib"] == 0.85
    assert f["max_mamba_cache_size"] == 8 and f["context_len"] == 65536 and f["max_running_requests"] == 8
    assert f["ranks_seen"] == [0, 1] and f["speculative"] is True and f["stage"] == "serving"
    assert f["time_to_ready_s"] == 114.0 and f["load_weights_s"] == 70.85
    assert f["server_args"]["tp_size"] == 2 and f["server_args"]["speculative_algorithm"] == "EAGLE"
    assert f["model_type"] == "Qwen3_5ForConditionalGeneration"
    assert "The server is fired up and ready to roll!" in res["evidence"][-1]


def test_parse_server_args_values():
    sa = sl.parse_server_args("server_args=ServerArgs(model_path='/m', port=30000, mem_fraction_static=0.85, "
                              "max_running_requests=None, disable_radix_cache=True, speculative_algorithm='EAGLE', tp_size=2)")
    assert sa == {"model_path": "/m", "port": 30000, "mem_fraction_static": 0.85, "max_running_requests": None,
                  "disable_radix_cache": True, "speculative_algorithm": "EAGLE", "tp_size": 2}


def test_traceback_exception_line_and_chained():
    parsed = sl.parse_log(read("cuda_graph_failed_sglang_4205.log"))
    tb = parsed["tracebacks"][0]
    assert tb["exception_type"] == "Exception"
    assert tb["exception"].startswith("Exception: Capture cuda graph failed:")
    assert any("cuda_graph_runner.py" in fr for fr in tb["frames"])
    # frames without indentation (as pasted in an issue) still form a traceback
    tb = sl.parse_log(read("nccl_error_sglang_8974.log"))["tracebacks"][0]
    assert tb["exception"] == "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
    assert len(tb["frames"]) == 8


def test_capture_failed_message_with_solutions_is_kept():
    text = ("[2026-03-01 10:01:18 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=1.10 GB\n"
            "[2026-03-01 10:01:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/x/sglang/srt/model_executor/cuda_graph_runner.py", line 370, in __init__\n'
            "    raise Exception(\n"
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 20.00 MiB.\n"
            "Possible solutions:\n"
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
            "[2026-03-01 10:01:20] Received sigquit from a child process. It usually means the child failed.\n")
    res = sl.diagnose(text)
    assert res["phase"] == "cuda_graph_failed"  # not weights/kv: the OOM is inside graph capture
    assert "Possible solutions" in res["facts"]["exception"]
    assert "--mem-fraction-static" in res["remedy"] and "--cuda-graph-max-bs" in res["remedy"] and "--disable-cuda-graph" in res["remedy"]


# --- per-launch selection -----------------------------------------------------------------

def test_select_launch_reads_only_the_current_launch():
    text = read("synthetic_two_launches.log")
    assert [part[0] for part in sl.split_launches(text)] == [None, "20260301T094000-seed", "20260301T100500-e5f6"]
    old = sl.select_launch(text, "20260301T094000-seed")
    new = sl.select_launch(text, "20260301T100500-e5f6")
    assert "Not enough memory" in old and "Not enough memory" not in new
    assert sl.select_launch(text) == new  # no id: the last launch
    assert sl.select_launch(text, "nope") is None
    assert sl.diagnose(text, launch_id="20260301T100500-e5f6", process_alive=True)["phase"] == "loading"
    assert sl.diagnose(text, launch_id="20260301T094000-seed", exit_status=137)["phase"] == "kv_cache_oom"
    # the stale-log trap of the seed: the current launch's log has no lines yet, the old error is never read
    assert sl.diagnose(text, launch_id="20260301T110000-new", process_alive=False)["phase"] == "not_started"


def test_select_launch_without_header():
    assert sl.select_launch("a\nb\n") == "a\nb\n"
    assert sl.select_launch("a\nb\n", "x") is None
    assert sl.select_launch(None) is None
    assert sl.launch_header("abc") == "# kpro-launch-id: abc\n"
    assert sl.select_launch(sl.launch_header("abc"), "abc") == ""


def test_not_started_and_just_started():
    assert sl.diagnose(None)["phase"] == "not_started"
    assert sl.diagnose("")["phase"] == "not_started"
    assert sl.diagnose(sl.launch_header("x"), launch_id="x", process_alive=True)["phase"] == "loading"


# --- readiness ----------------------------------------------------------------------------

def _ready_cut(before):
    lines = read("synthetic_ready_tp2_nextn.log").splitlines()
    idx = [i for i, line in enumerate(lines) if before in line][0]
    return "\n".join(lines[:idx]) + "\n"


def test_application_startup_complete_is_not_ready():
    text = _ready_cut("The server is fired up")
    assert "Application startup complete." in text
    assert sl.diagnose(text, process_alive=True)["phase"] == "loading"
    assert sl.diagnose(text, process_alive=True, http={"health": 503})["phase"] == "loading"
    # /health 200 is readiness even without the log line (multimodal log propagation caveat)
    res = sl.diagnose(text, process_alive=True, http={"health": 200, "models": ["qwen3.6-27b"], "expected_model": "qwen3.6-27b"})
    assert res["phase"] == "ready"
    res = sl.diagnose(text, process_alive=True, http={"health": 200, "models": ["other"], "expected_model": "qwen3.6-27b"})
    assert res["phase"] == "loading"


def test_ready_needs_the_weights_on_every_gpu():
    res = sl.diagnose(read("synthetic_ready_tp2_nextn.log"), process_alive=True, gpu_used_mib=[45000, 300], planned_weights_mib=26512)
    assert res["phase"] != "ready" and res["facts"]["gpus_below_planned_weights"] == [1]


def test_degenerate_smoke_output_names_speculative_decoding():
    res = sl.diagnose(read("synthetic_ready_tp2_nextn.log"), process_alive=True, probe={"text": "\n\n"})
    assert res["phase"] == "degenerate_output"
    assert "--speculative-algorithm" in res["remedy"] and "#19070" in res["remedy"]
    assert sl.diagnose(read("synthetic_ready_tp2_nextn.log"), process_alive=True, probe={"text": " Paris."})["phase"] == "ready"
    assert sl.diagnose(read("synthetic_ready_tp2_nextn.log"), process_alive=True,
                       probe={"degenerate": True, "reason": "repeating_loop"})["phase"] == "degenerate_output"


def test_exit_after_ready():
    res = sl.diagnose(read("synthetic_ready_tp2_nextn.log"), exit_status=137)
    assert res["phase"] == "crashed_after_ready" and "exit status 137 (SIGKILL)" in res["remedy"]
    assert res["facts"]["former_phase"] == "warmup_failed" and res["facts"]["failed_stage"] == "serving"
    # a runtime error after ready, then SGLang's own tree kill: the log alone says the server is gone
    after = read("synthetic_ready_tp2_nextn.log") + _scheduler_tb(["managers/scheduler.py:event_loop_normal"], "ValueError: bad")
    assert sl.diagnose(after)["phase"] == "crashed_after_ready"
    assert sl.diagnose(after, process_alive=True)["phase"] == "ready"     # the gate's own view of a live server wins


# --- failures -----------------------------------------------------------------------------

def test_seed_kv_cache_oom_remedy_has_numbers_and_flags():
    res = sl.diagnose(read("synthetic_kv_cache_oom_seed_nextn.log"), exit_status=137)
    assert res["phase"] == "kv_cache_oom"
    r = res["remedy"]
    for s in ("--max-running-requests", "now 48", "--context-length", "now 65536", "--mem-fraction-static", "now 0.85",
              "26.50 GiB", "20.70 GiB", "--speculative-algorithm"):
        assert s in r, s
    assert any("Not enough memory" in e for e in res["evidence"])
    assert any("Load weight end" in e for e in res["evidence"])


def test_kv_cache_oom_uses_the_plan_remedy_when_given():
    res = sl.diagnose(read("synthetic_kv_cache_oom_seed_nextn.log"), plan={"remedy": "PLAN: --max-running-requests 16."})
    assert res["remedy"].startswith("PLAN: --max-running-requests 16.")


def test_init_failed_before_gpu_gives_this_launchs_exception():
    text = read("synthetic_init_failed_before_gpu.log")
    res = sl.diagnose(text, exit_status=137, process_alive=False, gpu_used_mib=[0, 0], gpu_baseline_mib=[0, 0])
    assert res["phase"] == "init_failed_before_gpu"
    assert res["facts"]["exception"].startswith("OSError: Can't load image processor")
    assert "GPU memory used (MiB): 0, 0 (every GPU at baseline)" in res["evidence"]
    assert "--model-path" in res["remedy"]
    # still alive: not a failure yet
    assert sl.diagnose(text, process_alive=True)["phase"] == "loading"


def test_argparse_error_is_not_started():
    # argparse rejects the command line before SGLang starts anything
    text = ("usage: launch_server.py [-h] --model-path MODEL_PATH\n"
            "launch_server.py: error: unrecognized arguments: --tp 2 --speculative-algo NEXTN\n")
    for kw in ({"exit_status": 2, "gpu_used_mib": [0, 0]}, {}):
        res = sl.diagnose(text, **kw)
        assert res["phase"] == "not_started"
        assert res["facts"]["failure"] == "argparse"
        assert "ExecStart" in res["remedy"] and "--speculative-algo NEXTN" in res["remedy"]


def test_weights_oom_names_other_processes():
    text = ("[2026-03-01 10:00:06 TP0] Load weight begin. avail mem=20.10 GB\n"
            "[2026-03-01 10:00:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/x/sglang/srt/model_executor/model_runner.py", line 900, in load_model\n'
            "    self.model = get_model(\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 270.00 MiB. GPU 0 has a total capacity of 47.41 GiB of "
            "which 120.00 MiB is free. Process 912345 has 27.10 GiB memory in use. Including non-PyTorch memory, this process has "
            "20.01 GiB memory in use.\n"
            "[2026-03-01 10:00:20] Received sigquit from a child process. It usually means the child failed.\n")
    res = sl.diagnose(text, exit_status=137)
    assert res["phase"] == "weights_oom"
    assert "PID 912345 27.10 GiB" in res["remedy"] and "--tp-size" in res["remedy"]


def test_port_in_use_after_full_load_in_sglang_format():
    text = _ready_cut("Uvicorn running on") + (
        "[2026-03-01 10:01:51] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use\n"
        "[2026-03-01 10:01:51] INFO:     Waiting for application shutdown.\n"
        "[2026-03-01 10:01:51] INFO:     Application shutdown complete.\n")
    res = sl.diagnose(text, exit_status=3)
    assert res["phase"] == "port_in_use" and "port 30000" in res["remedy"] and "--port" in res["remedy"]


def test_nccl_remedy_and_p2p():
    res = sl.diagnose(read("nccl_error_sglang_4289.log"))
    assert res["phase"] == "nccl_error" and "/dev/shm" in res["remedy"]
    text = ("[2026-03-01 10:00:05 TP0] Init torch distributed begin.\n"
            "[2026-03-01 10:00:06 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/x/sglang/srt/distributed/device_communicators/custom_all_reduce.py", line 200, in __init__\n'
            "    x()\n"
            "RuntimeError: CUDART error: peer access is not supported between these two devices\n")
    res = sl.diagnose(text, exit_status=137)
    assert res["phase"] == "nccl_error" and "--disable-custom-all-reduce" in res["remedy"]


def test_nccl_warnings_while_alive_are_not_fatal():
    text = read("synthetic_loading_tp2.log") + "ct129:4242:4300 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so\n"
    assert sl.diagnose(text, process_alive=True)["phase"] == "loading"
    assert sl.diagnose(text, exit_status=137)["phase"] == "nccl_error"


def test_oom_in_draft_model_is_a_reserve_problem():
    text = _ready_cut("Capture draft cuda graph begin").split("[2026-03-01 10:01:35 TP0] KV Cache", maxsplit=1)[0] + (
        "[2026-03-01 10:01:35 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/mem_cache/memory_pool.py", line 600, in _create_buffers\n'
        "    torch.zeros(\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 380.00 MiB.\n")
    res = sl.diagnose(text, exit_status=137)
    assert res["phase"] == "kv_cache_oom" and res["facts"].get("oom_in_draft_model")
    assert "lower --mem-fraction-static" in res["remedy"]


def test_exit_without_traceback_during_weights():
    # SIGKILLed from outside (no sigquit, no error of SGLang's own): the host's OOM killer, not GPU memory
    res = sl.diagnose(read("synthetic_loading_tp2.log"), exit_status=137)
    assert res["phase"] == "host_oom_killed" and "OOM killer" in res["remedy"] and "not GPU memory" in res["remedy"]
    assert res["facts"]["former_phase"] == "weights_oom" and res["facts"]["failed_stage"] == "weights"
    # the shell's "Killed" line says the same without an exit status
    assert sl.diagnose(read("synthetic_loading_tp2.log") + "Killed\n")["phase"] == "host_oom_killed"
    # an exit without a SIGKILL and without an error while loading: the load failed, the log does not say why
    res = sl.diagnose(read("synthetic_loading_tp2.log"), exit_status=1)
    assert res["phase"] == "weights_load_failed" and res["facts"]["former_phase"] == "weights_oom"
    assert "exit status 1" in res["remedy"] and "OOM killer" not in res["remedy"]
    # SGLang's own tree kill after a child reported its failure is not the OOM killer
    text = read("synthetic_loading_tp2.log") + "[2026-03-01 10:00:30] Received sigquit from a child process. It usually means the child failed.\n"
    assert sl.diagnose(text, exit_status=137)["phase"] == "weights_load_failed"


# --- progress and timeout -----------------------------------------------------------------

def test_timeout_slow_load_vs_hang():
    text = read("synthetic_loading_tp2.log")
    assert sl.diagnose(text, process_alive=True, elapsed_s=100, timeout_s=900)["phase"] == "loading"
    slow = sl.diagnose(text, process_alive=True, elapsed_s=901, timeout_s=900, stalled_s=5, gpu_used_mib=[20000, 20000])
    assert slow["phase"] == "timeout" and "still progressing" in slow["remedy"]
    hang = sl.diagnose(text, process_alive=True, elapsed_s=901, timeout_s=900, stalled_s=600)
    assert hang["phase"] == "timeout" and "hangs" in hang["remedy"]
    dist = "\n".join(text.splitlines()[:7]) + "\n"
    assert sl.diagnose(dist, process_alive=True)["facts"]["stage"] == "distributed_init"
    res = sl.diagnose(dist, process_alive=True, elapsed_s=901, timeout_s=900, stalled_s=800)
    assert res["phase"] == "timeout" and "--disable-custom-all-reduce" in res["remedy"]


# --- before launch ------------------------------------------------------------------------

def test_pre_launch_phases():
    res = sl.diagnose(None, foreign_processes=[{"pid": 4711, "name": "python3", "used_mib": 27000, "gpu": 0, "ours": False},
                                               {"pid": 1, "name": "ours", "used_mib": 10, "ours": True}])
    assert res["phase"] == "gpu_memory_held" and "PID 4711 python3 holds 27000 MiB on GPU 0" in res["evidence"]
    res = sl.diagnose(None, driver={"kernel": "580.126.09", "library": "570.148.08"})
    assert res["phase"] == "version_mismatch" and "580.126.09" in res["remedy"]
    res = sl.diagnose(None, compat=compat.check("0.5.9", "Qwen3_5ForConditionalGeneration", 2))
    assert res["phase"] == "known_bad_version" and "#19070" in " ".join(res["evidence"])
    text = "RuntimeError: Failed to initialize NVML: Driver/library version mismatch\n"
    assert sl.diagnose(text, exit_status=1)["phase"] == "version_mismatch"


def test_every_phase_of_the_vocabulary_is_reachable_in_these_tests():
    # 17, plus runtime_toolchain_missing (issue 27), gpu_p2p_hang / gpu_p2p_wrong_result (the two-GPU check) and
    # host_oom_killed, weights_load_failed, kv_pool_init_failed, scheduler_init_failed (issue 29)
    # and crashed_after_ready (issue 31), unresponsive (issue 30: the gate's, test_sglang_ready_unresponsive.py)
    assert len(sl.PHASES) == 26 and len(set(sl.PHASES)) == 26


# --- failures named from the log alone (structure: where the startup stopped, what was raised) ---

# 0.5.11's wording, from sglang/srt/entrypoints/engine.py (_scheduler_died_error):
#   f"Rank {rank} scheduler died during initialization (exit code: {proc.exitcode}). "
#   f"If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."
def _died(code, rank=0):
    return ("RuntimeError: Rank %d scheduler died during initialization (exit code: %d). If exit code is -9 (SIGKILL), a common "
            "cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.\n" % (rank, code))


def _loading_until(marker):
    lines = read("synthetic_ready_tp2_nextn.log").splitlines()
    return "\n".join(lines[:next(i for i, l in enumerate(lines) if marker in l)]) + "\n"


def test_scheduler_killed_names_the_host_oom_killer():
    text = _loading_until("Load weight end") + _died(-9, rank=1)
    res = sl.diagnose(text)
    assert res["phase"] == "host_oom_killed" and res["facts"]["former_phase"] == "weights_oom"
    assert res["facts"]["scheduler_exit_code"] == -9 and res["facts"]["failure"] == "scheduler_killed"
    assert "OOM killer" in res["remedy"] and "dmesg -T | grep -i oom" in res["remedy"] and "Rank 1" in res["remedy"]
    assert "container's memory limit" in res["remedy"] and "during weights" in res["remedy"]
    # later in the start too: the SIGKILL is the evidence, the stage is said
    res = sl.diagnose(_loading_until("Capture cuda graph begin") + _died(-9))
    assert res["phase"] == "host_oom_killed" and "during kv pool" in res["remedy"]
    assert res["facts"]["former_phase"] == "init_failed_before_gpu"


def test_scheduler_death_reports_other_exit_codes():
    text = _loading_until("Capture cuda graph end") + _died(-6)
    res = sl.diagnose(text)
    assert res["facts"]["scheduler_exit_code"] == -6 and "exit code -6, SIGABRT" in res["remedy"]
    assert res["phase"] == "cuda_graph_failed" and "OOM killer" not in res["remedy"]
    # 0.5.9 wrote it on two lines
    res = sl.diagnose(_loading_until("Load weight end") + "[2026-03-01 10:00:50] Rank 0 scheduler is dead. Please check if "
                      "there are relevant logs.\n[2026-03-01 10:00:51] Exit code: 1\n")
    assert res["facts"]["scheduler_exit_code"] == 1 and "exit code 1" in res["remedy"] and res["phase"] != "loading"


def test_the_cause_wins_over_the_report_of_a_dead_scheduler():
    text = read("kv_pool_init_failed_sglang_25118.log")
    res = sl.diagnose(text)
    assert res["phase"] == "kv_pool_init_failed" and res["facts"]["former_phase"] == "init_failed_before_gpu"
    assert res["facts"]["failure"] == "kv_pool_failed" and res["facts"]["scheduler_exit_code"] == -3
    assert "not out of memory" in res["remedy"]


def test_zmq_address_in_use_after_the_weights_loaded_is_port_in_use():
    text = (_loading_until("KV Cache is allocated")
            + "[2026-03-01 10:01:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/x/sglang/srt/utils/network.py", line 210, in get_zmq_socket_on_host\n'
            "    socket.bind(endpoint)\n"
            "zmq.error.ZMQError: Address already in use (addr='tcp://*:32765')\n" + _died(-3))
    res = sl.diagnose(text)
    assert res["phase"] == "port_in_use" and "ZeroMQ" in res["remedy"] and "ss -ltnp" in res["remedy"]


def _scheduler_tb(frames, exc):
    out = "[2026-03-01 10:01:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    for f in frames:
        out += '  File "/x/sglang/srt/%s", line 10, in %s\n    x()\n' % tuple(f.split(":"))
    return out + exc + "\n[2026-03-01 10:01:00] Received sigquit from a child process. It usually means the child failed.\n"


def test_an_assertion_while_building_the_kv_pool_is_not_an_oom():
    text = _loading_until("Mamba Cache") + _scheduler_tb(
        ["model_executor/model_runner.py:init_memory_pool", "mem_cache/memory_pool.py:_create_buffers"],
        "AssertionError: store_dtype must be uint8")
    res = sl.diagnose(text)
    assert res["phase"] == "kv_pool_init_failed" and res["facts"]["failure"] == "kv_pool_failed" and res["facts"]["failed_stage"] == "kv_pool"


def test_a_traceback_in_model_loading_is_weights_oom_only_with_oom_evidence():
    before = _loading_until("Loading safetensors")
    frames = ["model_executor/model_runner.py:load_model", "model_loader/loader.py:load_weights_and_postprocess"]
    res = sl.diagnose(before + _scheduler_tb(frames, "KeyError: 'model.layers.3.mlp.gate_up_proj.weight_scale'"),
                      exit_status=137, gpu_used_mib=[20480, 20480], gpu_baseline_mib=[0, 0])
    assert res["phase"] == "weights_load_failed" and res["facts"]["failure"] == "weights_load_failed"
    assert "Loading the weights failed, and not for lack of memory" in res["remedy"]
    # the GPUs held 20 GiB when it failed: the phase no longer says it failed before touching them
    assert "GPU memory used (MiB): 20480, 20480" in res["evidence"]
    res = sl.diagnose(before + _scheduler_tb(frames, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."))
    assert res["phase"] == "weights_oom"


@pytest.mark.parametrize("until,phase,former", [
    ("Init torch distributed begin", "init_failed_before_gpu", None),          # nothing touched a GPU yet
    ("Loading safetensors", "weights_load_failed", "init_failed_before_gpu"),   # between Load weight begin and end
    ("Mamba Cache", "kv_pool_init_failed", "init_failed_before_gpu"),           # after Load weight end
    ("Memory pool end", "kv_pool_init_failed", "init_failed_before_gpu"),       # the attention backend, before graphs
    ("Started server process", "scheduler_init_failed", "init_failed_before_gpu"),  # after max_total_num_tokens=
])
def test_a_failure_is_named_by_where_the_start_stopped(until, phase, former):
    text = _loading_until(until) + _scheduler_tb(["managers/scheduler.py:__init__"], "RuntimeError: open: Address family not supported")
    res = sl.diagnose(text, exit_status=137, gpu_used_mib=[20480, 20480], gpu_baseline_mib=[0, 0])
    assert res["phase"] == phase, (until, res["facts"].get("failed_stage"))
    assert res["facts"].get("former_phase") == former
    assert "RuntimeError: open: Address family not supported" in res["remedy"]


def test_any_failure_after_graph_capture_began_is_cuda_graph_failed():
    text = _loading_until("Capture cuda graph end") + _scheduler_tb(
        ["model_executor/model_runner.py:initialize"], "RuntimeError: ninja exited with status 1")
    res = sl.diagnose(text)
    assert res["phase"] == "cuda_graph_failed" and "ninja exited" in res["remedy"]


def test_exceptions_before_the_weights_are_configuration_failures():
    head = _loading_until("Init torch distributed begin")
    cases = {
        "TypeError: __init__() got an unexpected keyword argument 'token_to_kv_pool_allocator'": "invalid_configuration",
        "ImportError: /x/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEa": "import_error",
        "ValueError: Model architectures ['FooForCausalLM'] are not supported for now.": "unsupported_architecture",
    }
    for exc, failure in cases.items():
        res = sl.diagnose(head + "Traceback (most recent call last):\n  File \"/x/sglang/launch_server.py\", line 5, in <module>\n"
                          "    main()\n" + exc + "\n")
        assert res["phase"] == "init_failed_before_gpu" and res["facts"]["failure"] == failure, (exc, res["facts"])


def test_a_live_process_past_its_traceback_is_not_failed():
    # the startup went on after a traceback it printed: not fatal
    lines = read("synthetic_ready_tp2_nextn.log").splitlines()
    i = next(n for n, l in enumerate(lines) if "Load weight end" in l)
    text = "\n".join(lines[:i] + ["Traceback (most recent call last):", '  File "/x/y.py", line 1, in f', "    g()",
                                  "UserWarning: something optional failed to import"] + lines[i:]) + "\n"
    assert sl.diagnose(text, process_alive=True)["phase"] == "ready"
    assert sl.diagnose(text)["phase"] == "ready"
    # an error after ready while the server lives on is a runtime error, not a failed launch
    after = read("synthetic_ready_tp2_nextn.log") + _scheduler_tb(["managers/scheduler.py:event_loop"], "ValueError: bad request")
    assert sl.diagnose(after, process_alive=True)["phase"] == "ready"


def test_a_warning_line_is_not_a_failure():
    text = _loading_until("Load weight end") + "UserWarning: TypedStorage is deprecated. It will be removed in the future.\n"
    assert sl.diagnose(text)["phase"] == "loading"
    assert sl.diagnose(_loading_until("Load weight end") + "ValueError: bad shard\n")["phase"] != "loading"


def test_peer_missing_on_rank0_and_on_a_follower():
    res = sl.diagnose(read("peer_missing_sglang_507.log"), exit_status=137, process_alive=False)
    assert res["phase"] == "peer_missing"
    assert (res["facts"]["nodes_joined"], res["facts"]["nodes_expected"]) == (1, 4)
    assert "never arrived" in res["remedy"] and "node_rank" in res["remedy"]
    res = sl.diagnose(read("synthetic_peer_missing_rank1.log"), exit_status=137, process_alive=False)
    assert res["phase"] == "peer_missing"
    assert "192.0.2.11:20000" in res["remedy"]
    assert any("trying to connect to (192.0.2.11, 20000)" in e for e in res["evidence"])


def test_the_graph_remedy_names_the_flag_of_the_servers_own_version():
    """0.5.14 renamed --cuda-graph-max-bs to --cuda-graph-max-bs-decode (the old name removed in 0.5.20): the remedy
    names the one this server's ServerArgs line shows."""
    old = sl.parse_server_args("server_args=ServerArgs(mem_fraction_static=0.85, cuda_graph_max_bs=32)")
    new = sl.parse_server_args("server_args=ServerArgs(mem_fraction_static=0.85, cuda_graph_max_bs_decode=48)")
    assert "set --cuda-graph-max-bs smaller (now 32" in sl._remedy_graph({"server_args": old})
    assert "set --cuda-graph-max-bs-decode smaller (now 48" in sl._remedy_graph({"server_args": new})


@pytest.mark.parametrize("text,unfinished", [
    ("", False),
    ("[TP0] Load weight begin.\n", False),
    ("[TP0] Scheduler hit an exception: Traceback (most recent call last):\n  File \"s.py\", line 1, in f\n    x()\n", True),
    ("[TP0] Scheduler hit an exception: Traceback (most recent call last):\n", True),
    ("Traceback (most recent call last):\n  File \"s.py\", line 1, in f\n    x()\ntorch.OutOfMemoryError: CUDA out of memory.\n",
     False),
    # an earlier traceback finished, a later one cut: the last decides
    ("Traceback (most recent call last):\n  File \"a\"\nValueError: x\nTraceback (most recent call last):\n  File \"b\"\n", True),
])
def test_a_log_that_ends_inside_a_traceback_is_unfinished(text, unfinished):
    assert sl.unfinished_traceback(text) is unfinished
