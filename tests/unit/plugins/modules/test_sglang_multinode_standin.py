# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One model over two nodes, on loopback: two stand-in processes (node ranks 0 and 1, one GPU each of the serve lab's
two), the gate on each (rank 0: endpoint and probe; rank 1: NVML and its health server), a missing peer diagnosed as
peer_missing on either side, and stopping rank 0 ends rank 1."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_gate
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.serve_lab import (  # noqa: F401  pylint: disable=unused-import
    BASELINE, MODEL_NAME, alive, fakenvml, free_port, serve_lab)
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module


def start(lab, rank, launch_id, init_port, **kw):
    opts = dict(nnodes=2, node_rank=rank, dist_init_addr="127.0.0.1:%d" % init_port, base_gpu_id=rank, dist_timeout=20)
    opts.update(kw)
    port = lab.port if rank == 0 else free_port()
    proc = lab.launch(launch_id, port=port, **opts)
    # the two nodes share one log directory here (two containers in real life): let the launcher swap the
    # sglang.log link before the other one starts
    log = lab.log_dir / ("sglang-%s.log" % launch_id)
    deadline = time.time() + 10
    while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 2):
        time.sleep(0.05)
    return proc, port


def gate(lab, proc, port, launch_id, expect_ok, **kw):
    args = {"pid": proc.pid, "log_dir": str(lab.log_dir), "launch_id": launch_id, "base_url": "http://127.0.0.1:%d" % port,
            "served_model_name": MODEL_NAME, "timeout": 60, "stall_timeout": 30, "poll_interval": 0.5, "planned_weights_mib": 26417,
            "gpu_baseline_mib": [BASELINE, BASELINE]}
    args.update(kw)
    with pytest.raises(AnsibleExitJson if expect_ok else AnsibleFailJson) as e:
        run_module(sglang_gate, args)
    lab.record()
    return e.value.result


def test_two_nodes_start_and_are_gated_each_on_its_part(serve_lab):
    init = free_port()
    p0, port0 = start(serve_lab, 0, "node0001", init, dist_timeout=600)     # 30 s at the stand-in's speed
    p1, port1 = start(serve_lab, 1, "node1001", init, dist_timeout=600)
    r1 = gate(serve_lab, p1, port1, "node1001", True, node_rank=1)
    r0 = gate(serve_lab, p0, port0, "node0001", True)
    assert r0["phase"] == "ready" and "Paris" in r0["probe"]["text"]
    assert r1["phase"] == "ready" and r1["probe"]["skipped"] and any("GET /health 200" in e for e in r1["evidence"])
    assert all(u > 26417 for u in r1["gpu_used_mib"])
    log1 = (serve_lab.log_dir / "sglang-node1001.log").read_text()
    assert "TP1] Init torch distributed begin." in log1 and "TP0]" not in log1
    # stopping rank 0 ends rank 1 (its NCCL peer is gone)
    os.kill(p0.pid, signal.SIGTERM)
    deadline = time.time() + 20
    while time.time() < deadline and alive(p1.pid):
        time.sleep(0.2)
    p1.poll()
    assert not alive(p1.pid)
    assert "NCCL error: remote process exited or there was a network error" in (serve_lab.log_dir / "sglang-node1001.log").read_text()


def test_a_missing_peer_is_diagnosed_on_rank_0_and_on_rank_1(serve_lab):
    init = free_port()
    p0, port0 = start(serve_lab, 0, "lone0001", init)
    r0 = gate(serve_lab, p0, port0, "lone0001", False)
    assert r0["phase"] == "peer_missing" and r0["facts"]["nodes_joined"] == 1 and r0["facts"]["nodes_expected"] == 2
    assert "waiting for clients. 1/2 clients joined." in " ".join(r0["evidence"])
    # rank 0's address: a port this test holds bound and never listens on, so nothing answers there and no other process
    # can take it (a port merely found free could be a parallel test's rank 0 store a moment later: CI saw rank 1 join
    # a stranger and report nccl_error when that one ended)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    try:
        p1, port1 = start(serve_lab, 1, "lone1001", held.getsockname()[1])
        r1 = gate(serve_lab, p1, port1, "lone1001", False, node_rank=1)
    finally:
        held.close()
    assert r1["phase"] == "peer_missing" and "while trying to connect to (127.0.0.1," in " ".join(r1["evidence"])
