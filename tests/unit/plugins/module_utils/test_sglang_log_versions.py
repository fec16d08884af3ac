# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The diagnosis reads the startup lines of every release in the table (0.5.11 to 0.5.23), in the words of each wheel's
source (file:line under sglang/srt/), and never repeats the API key that every release prints on its server_args line."""

from __future__ import annotations

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import sglang_releases
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log as sl
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log_signals as signals

# 0.5.19 entrypoints/engine.py:1098 logger.info(f"server_args={server_args.resolved_dict()}"): the resolved fields in
# declaration order (arg_groups/field_order.py), nested dataclasses as dicts (arg_groups/overrides.py:306-321 _plain),
# some values no Python literal (stat_loggers: Dict[str, type], arg_groups/fields/observability.py)
DICT_LINE = ("server_args={'model_path': '/models/Qwen3.6-27B', 'tokenizer_mode': 'auto', 'context_length': 65536, "
             "'json_model_override_args': '{\"tp_size\": 9}', 'dtype': 'auto', 'kv_cache_dtype': 'auto', "
             "'mem_fraction_static': 0.85, 'max_running_requests': 8, 'chunked_prefill_size': None, "
             "'cuda_graph_config': {'decode': {'backend': 'full', 'max_bs': 24, 'bs': None}, 'prefill': {'backend': 'disabled'}}, "
             "'decoupled_spec_ipc_config': {'host': '10.0.0.9', 'port': 1}, 'tp_size': 2, 'cuda_graph_max_bs_decode': 24, "
             "'stat_loggers': {'x': <class 'sglang.X'>}, 'schedule_conservativeness': inf, 'lora_target_modules': {'q_proj'}, "
             "'speculative_algorithm': 'NEXTN', 'disable_radix_cache': True, 'disable_cuda_graph': False, 'host': '0.0.0.0', "
             "'port': 30000, 'api_key': 'sk-live-1', 'admin_api_key': \"it's-2\", 'served_model_name': 'qwen', "
             "'dist_init_addr': None, 'nnodes': 1}")


def test_the_dict_form_of_0_5_19_gives_the_top_level_fields():
    sa = sl.parse_server_args(DICT_LINE)
    assert sa == {"model_path": "/models/Qwen3.6-27B", "context_length": 65536, "dtype": "auto", "kv_cache_dtype": "auto",
                  "mem_fraction_static": 0.85, "max_running_requests": 8, "chunked_prefill_size": None, "tp_size": 2,
                  "cuda_graph_max_bs_decode": 24, "speculative_algorithm": "NEXTN", "disable_radix_cache": True,
                  "disable_cuda_graph": False, "host": "0.0.0.0", "port": 30000, "served_model_name": "qwen",
                  "dist_init_addr": None, "nnodes": 1}
    # the graph remedy names the flag of the version that printed the line
    assert "set --cuda-graph-max-bs-decode smaller (now 24" in sl._remedy_graph({"server_args": sa})


def test_a_line_cut_short_gives_the_fields_it_holds_whole():
    cut = DICT_LINE[:DICT_LINE.index("'tp_size': 2") + len("'tp_size': 2")]
    sa = sl.parse_server_args(cut)
    assert sa["mem_fraction_static"] == 0.85 and sa["max_running_requests"] == 8
    assert "tp_size" not in sa and "port" not in sa    # the last item may be cut ("2" of "24"), so it is not read
    assert sl.parse_server_args("server_args={'model_path': '/m', 'served_model_name': 'qw") == {"model_path": "/m"}
    assert sl.parse_server_args("server_args=ServerArgs(model_path='/m', tp_size=2, port=300") == {"model_path": "/m", "tp_size": 2}


def test_the_repr_form_keeps_its_values_and_skips_nested_reprs():
    sa = sl.parse_server_args("server_args=ServerArgs(model_path='/m', cuda_graph_config=CudaGraphConfig(decode=PhaseConfig("
                              "max_bs=8), tp_size=4), tp_size=2, mem_fraction_static=0.9, api_key='k', enable_p2p_check=False)")
    assert sa == {"model_path": "/m", "tp_size": 2, "mem_fraction_static": 0.9, "enable_p2p_check": False}


@pytest.mark.parametrize("line,kind,tokens", [
    # 0.5.11 mem_cache/memory_pool.py:735
    ("KV Cache is allocated. #tokens: 52208, K size: 1.59 GB, V size: 1.59 GB", "kv_alloc", 52208),
    # 0.5.13 memory_pool.py:819 (to 0.5.16 :1616): the pool's dtype first
    ("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 52208, K size: 1.59 GB, V size: 1.59 GB", "kv_alloc", 52208),
    # 0.5.17 memory_pool.py:1670: a labelled pool (mem_cache/swa_memory_pool.py:92 "SWA")
    ("SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4096, KV size: 0.50 GB", "kv_alloc", 4096),
    # 0.5.17 model_executor/model_runner_components/kv_pool_runtime.py:122, 0.5.23 :194-200 (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING)
    ("Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 61000, KV size: 3.72 GB, avail mem=2.10 GB",
     "kv_alloc", 61000),
    # 0.5.18 memory_pool.py:1685, 0.5.23 :2088: the pool before that sizing, an upper bound: the stage, not the figure
    ("KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 900000, K size: 27.47 GB, V size: 27.47 GB", "kv_pool_init", None),
])
def test_each_releases_kv_pool_line_is_read(line, kind, tokens):
    log = "[2026-10-30 10:00:00 TP0] Load weight begin. avail mem=46.00 GB\n[2026-10-30 10:00:09 TP0] %s\n" % line
    parsed = sl.parse_log(log)
    assert parsed["milestones"][kind] and sl.stage_reached(parsed) == "kv_pool"
    assert sl.extract_facts(parsed).get("kv_tokens") == tokens
    assert "Post-capture KV sizing: draft KV cache" not in line or "kv_alloc" not in parsed["milestones"]


@pytest.mark.parametrize("begin,end,elapsed,mem", [
    # 0.5.11 model_executor/model_runner.py:1103, :1236-1237; 0.5.16 to 0.5.20 distributed/bootstrap.py (0.5.20 :81, :164-165)
    ("Init torch distributed begin.", "Init torch distributed ends. elapsed=0.84 s, mem usage=0.53 GB", 0.84, 0.53),
    # 0.5.21 distributed/bootstrap.py:118, :174 (0.5.23 :115, :190): init_parallel_runtime, no memory figure
    ("Init parallel begin.", "Init parallel ends. elapsed=1.02 s", 1.02, None),
])
def test_each_releases_distributed_init_lines_are_read(begin, end, elapsed, mem):
    log = "[2026-10-30 10:00:00] %s\n[2026-10-30 10:00:01 TP0] %s\n[2026-10-30 10:00:02 TP0] %s\n" % (DICT_LINE, begin, end)
    parsed = sl.parse_log(log)
    assert parsed["milestones"]["dist_end"][0]["data"] == {"elapsed_s": elapsed, "mem_usage_gb": mem}
    facts = sl.extract_facts(parsed)
    assert facts["stage"] == "distributed_init" and facts["gpu_touched_per_log"] is True
    assert facts["server_args"]["tp_size"] == 2
    # the server exited before the GPUs: a log with the arguments line only
    res = sl.diagnose(log.splitlines()[0] + "\n", exit_status=1, process_alive=False)
    assert res["phase"] == "init_failed_before_gpu" and "'Init parallel begin.'" in res["remedy"]


def test_every_wording_in_the_release_table_is_read_as_its_milestone():
    values = {"fields": DICT_LINE[len("server_args={"):-1], "elapsed": 1.5, "mem": 0.5, "dtype": "torch.bfloat16", "tokens": 77,
              "k": 1.0, "v": 1.0}
    seen = 0
    for r in sglang_releases.RELEASES:
        for name, (wording, where) in r.get("log", {}).items():
            assert ".py:" in where
            if name == "mem_baseline":     # the stand-in writes it; the distributed init lines already name the stage
                continue
            parsed = sl.parse_log("[2026-10-30 10:00:00 TP0] %s\n" % (wording % values))
            assert parsed["milestones"].get(name), (r["version"], name)
            seen += 1
    assert seen >= 7


@pytest.mark.parametrize("line", [
    DICT_LINE,
    "server_args=ServerArgs(model_path='/m', api_key='sk-live-1', admin_api_key=\"it's-2\", port=30000)",
    # a line cut inside the key
    "server_args={'model_path': '/m', 'api_key': 'sk-live-1",
])
def test_the_diagnosis_never_repeats_an_api_key(line):
    """Every release prints the keys on this line (0.5.11 engine.py:188 the dataclass repr; 0.5.19 engine.py:1098 the dict;
    0.5.22 engine.py:171 masks only the watermark keys); the unit's launcher masks them, a log from elsewhere may not."""
    log = "[2026-10-30 10:00:00] %s\n[2026-10-30 10:00:01] curl -H 'Authorization: Bearer sk-live-3' --api-key sk-live-4\n" % line
    res = sl.diagnose(log, exit_status=1, process_alive=False)
    out = repr(res)
    assert "sk-live" not in out and "it's-2" not in out
    # the evidence quotes a line's first 400 characters: the short lines show the key masked
    assert len(line) > 400 or any("api_key': '<redacted>'" in e or "api_key='<redacted>'" in e for e in res["evidence"])
    assert "api_key" not in res["facts"].get("server_args", {})


def test_redact_masks_both_forms_and_leaves_the_rest():
    text = signals.redact("'api_key': 'a', api_key=\"b\", 'admin_api_key': None, Bearer c, --admin-api-key=d port=1")
    assert text == "'api_key': '<redacted>', api_key=\"<redacted>\", 'admin_api_key': None, Bearer <redacted>, " \
                   "--admin-api-key=<redacted> port=1"
    assert signals.redact(text) == text
