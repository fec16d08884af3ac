# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One model over two hosts' containers: each node's flags, GPUs, plan, refusals and readiness."""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_multinode as mn
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan, sglang_serve
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
BASE = {"model_path": "/srv/models/Qwen3.6-27B", "served_model_name": "qwen3.6-27b", "tp_size": 4, "context_length": 32768,
        "mem_fraction_static": 0.85, "nnodes": 2, "dist_init_addr": "192.0.2.11:20000", "host": "0.0.0.0", "port": 30000}


def node(rank):
    return dict(BASE, node_rank=rank)


def test_each_node_gets_its_rank_on_its_exec_start():
    for rank in (0, 1):
        argv = su.render_flags(node(rank))
        i = argv.index("--nnodes")
        assert argv[i:i + 6] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "192.0.2.11:20000"]
        assert argv.index("--tp-size") < i < argv.index("--host")
    text0 = str(su.render_service("sglang.service", "/opt/sglang/.venv", node(0)))
    text1 = str(su.render_service("sglang.service", "/opt/sglang/.venv", node(1)))
    assert "--node-rank 0" in text0 and "--node-rank 1" in text1
    # a single node's unit is what it was: no multi-node flag
    single = dict((k, v) for k, v in BASE.items() if k not in ("nnodes", "dist_init_addr"))
    assert "--nnodes" not in " ".join(su.render_flags(single))


def test_gpus_per_node_is_tp_over_the_nodes():
    assert su.gpus_needed(node(1)) == 2
    assert su.gpus_needed(dict(node(0), pp_size=2)) == 4
    assert su.gpus_needed({"tp_size": 2}) == 2
    assert mn.layout(node(1)) == {"nnodes": 2, "node_rank": 1, "dist_init_addr": "192.0.2.11:20000", "gpus_per_node": 2, "leader": False}


def test_refusals_before_the_running_server_is_touched():
    assert mn.problems(node(0)) == [] and mn.problems({"tp_size": 2}) == []
    keys = dict(mn.problems(dict(BASE, tp_size=3, node_rank=2, dist_init_addr=None)))
    assert keys["tp_size"].startswith("tp_size must be divisible by number of nodes")   # the real assert's text
    assert "out of range" in keys["node_rank"] and "needs dist_init_addr" in keys["dist_init_addr"]
    assert "host:port" in dict(mn.problems(dict(node(1), dist_init_addr="192.0.2.11")))["dist_init_addr"]
    assert "dp attention" in dict(mn.problems(dict(node(1), dp_size=2)))["dp_size"]
    assert [k for k, _m in su.range_problems(dict(node(1), dist_init_addr=None))] == ["dist_init_addr"]
    assert mn.problems({"nnodes": "two"})[0][0] == "nnodes"


def test_group_checks_ranks_and_shared_settings():
    assert mn.group_problems({"ct129": node(0), "ct229": node(1)}) == []
    out = mn.group_problems({"ct129": node(0), "ct229": dict(node(0), dist_init_addr="192.0.2.12:20000")})
    assert any("node ranks [0, 0]" in m for m in out) and any(m.startswith("dist_init_addr differs") for m in out)


def test_the_plan_runs_per_node_over_its_own_gpus():
    cfg = os.path.join(FIX, "qwen3.6-27b", "config.json")
    idx = os.path.join(FIX, "qwen3.6-27b", "model.safetensors.index.json")
    one = sglang_plan.plan(cfg, idx, su.plan_options(dict(BASE, tp_size=2, nnodes=None)), gpu_total_mib=[49140, 49140])
    per_node = sglang_plan.plan(cfg, idx, su.plan_options(node(1)), gpu_total_mib=[49140, 49140])
    # four ranks over two nodes: each GPU holds a quarter of the weights, not a half
    assert per_node["per_gpu"]["weights_mib"] < 0.6 * one["per_gpu"]["weights_mib"]
    assert per_node["node"] == {"nnodes": 2, "node_rank": 1, "gpus": 2} and "node" not in one


def test_plan_launch_selects_this_nodes_gpus(tmp_path, monkeypatch):
    seen = {}

    def fake_plan(config, index, options, gpu_total_mib=None, gpu_baseline_mib=None, environment=None, sglang_version=None):
        seen.update(options=options, gpus=gpu_total_mib)
        return {"fits": True}

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"0" * 16)
    monkeypatch.setattr(sglang_serve, "memory_plan", fake_plan)
    sglang_serve.plan_launch(node(1), str(tmp_path), [49140, 49140, 49140, 49140])
    assert seen["gpus"] == [49140, 49140] and seen["options"]["tp_size"] == 4 and seen["options"]["node_rank"] == 1


def test_a_follower_is_ready_on_nvml_and_its_health_server():
    ms = {"kv_alloc": [{}]}
    assert mn.follower_ready(ms, {"health": 200}, [13500, 13400], 13000)[0]
    assert not mn.follower_ready(ms, {"health": 200}, [13500, 300], 13000)[0]     # one GPU without its weights
    assert not mn.follower_ready(ms, {"health": None}, [13500, 13400], 13000)[0]
    assert not mn.follower_ready({}, {"health": 200}, [13500, 13400], 13000)[0]
