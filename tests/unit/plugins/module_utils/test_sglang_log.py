from __future__ import annotations

import glob
import os
import re

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils import compat
from ansible_collections.kpro.gpu_serving.plugins.module_utils import sglang_log as sl

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "sglang_logs")


def read(name):
    with open(os.path.join(FIX, name), encoding="utf-8") as f:
        return f.read()


def header(text, key):
    m = re.search(r"^# %s: (.*)$" % key, text, re.M)
    return m.group(1).strip() if m else None


FIXTURES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIX, "*.log")))
REAL = [f for f in FIXTURES if not f.startswith("synthetic_")]


def test_there_are_real_logs_for_each_failure_signature():
    phases = set(header(read(f), "expected_phase").split()[0] for f in REAL)
    assert {"nccl_error", "cuda_graph_failed", "kv_cache_oom", "weights_oom", "warmup_failed", "port_in_use"} <= phases


@pytest.mark.parametrize("name", REAL)
def test_real_logs_name_their_source(name):
    text = read(name)
    assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/issues/\d+", header(text, "source"))


@pytest.mark.parametrize("name", [f for f in FIXTURES if f != "synthetic_two_launches.log"])
def test_fixture_gets_its_expected_phase(name):
    text = read(name)
    expected = header(text, "expected_phase").split()[0]
    if expected in ("ready", "loading"):
        res = sl.diagnose(text, process_alive=True)
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
    assert order[:12] == ["server_args", "dist_begin", "dist_end", "weights_begin", "shards", "weights_end", "mamba_alloc",
                          "kv_alloc", "mem_pool_end", "graph_begin", "graph_end", "max_total_tokens"]
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
    assert res["phase"] == "warmup_failed" and "137" in res["remedy"]


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
    res = sl.diagnose(read("synthetic_loading_tp2.log"), exit_status=137)
    assert res["phase"] == "weights_oom" and "OOM killer" in res["remedy"]


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
    assert len(sl.PHASES) == 15 and len(set(sl.PHASES)) == 15
