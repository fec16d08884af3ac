# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One model served over several hosts' containers (SGLang's ``--nnodes``, ``--node-rank``, ``--dist-init-addr``).

The options are inventory data, by SGLang's own names, in ``sglang_server_options`` of each container: the same
``tp_size`` (and ``pp_size``) and ``dist_init_addr`` everywhere, ``nnodes`` the number of containers, ``node_rank``
0 .. nnodes-1, one per container. Rank 0 serves the HTTP endpoint; a rank >= 1 runs its schedulers and, once they
are ready, only a health server (real SGLang 0.5.11: sglang/srt/entrypoints/engine.py:712-737,
``launch_dummy_health_check_server``, sglang/srt/utils/common.py:2524).

This module holds the pure rules: what SGLang refuses (or hangs on), the GPUs of one node, and when a node of
rank >= 1 counts as ready (NVML and its health server; the completion probe is rank 0's).
"""

from __future__ import annotations

import re

_ADDR_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def _int(options, key, default):
    value = (options or {}).get(key)
    if value is None or value is False:
        return default
    return int(value)


def layout(options):
    """dict(nnodes, node_rank, dist_init_addr, gpus_per_node, leader) of one node's options (a single node: nnodes 1)."""
    o = options or {}
    nnodes = max(1, _int(o, "nnodes", 1))
    gpus = _int(o, "tp_size", 1) * _int(o, "pp_size", 1)
    return {
        "nnodes": nnodes,
        "node_rank": _int(o, "node_rank", 0),
        "dist_init_addr": o.get("dist_init_addr") or None,
        # server_args.py:6775-6777: (tp_size * pp_size) % nnodes == 0; each node runs its share of the ranks
        "gpus_per_node": gpus // nnodes if gpus % nnodes == 0 else gpus,
        "leader": _int(o, "node_rank", 0) == 0,
    }


def is_multinode(options):
    return layout(options)["nnodes"] > 1


def problems(options):
    """[(key, message)] for multi-node settings SGLang refuses or would hang on; [] for a single node."""
    o = options or {}
    try:
        lay = layout(o)
    except (TypeError, ValueError):
        return [("nnodes", "nnodes=%r / node_rank=%r are not whole numbers; give nnodes >= 1 and node_rank 0 .. nnodes-1"
                 % (o.get("nnodes"), o.get("node_rank")))]
    out = []
    n, rank = lay["nnodes"], lay["node_rank"]
    if not 0 <= rank < n:
        out.append(("node_rank", "node_rank=%s is out of range for nnodes=%s; give each container its own rank 0 .. %d"
                    % (rank, n, n - 1)))
    if n == 1:
        return out
    if (_int(o, "tp_size", 1) * _int(o, "pp_size", 1)) % n:
        # the real assert's message (server_args.py:6775-6777)
        out.append(("tp_size", "tp_size must be divisible by number of nodes (tp_size x pp_size = %d, nnodes = %d)"
                    % (_int(o, "tp_size", 1) * _int(o, "pp_size", 1), n)))
    addr = lay["dist_init_addr"]
    if not addr:
        # without it each node's TP group would rendezvous on its own loopback (tcp://127.0.0.1:<nccl_port>) and wait
        out.append(("dist_init_addr", "nnodes=%d needs dist_init_addr, rank 0's address and a free port (host:port, e.g. "
                    "192.0.2.11:20000), the same on every node" % n))
    elif not _ADDR_RE.match(str(addr)):
        out.append(("dist_init_addr", "dist_init_addr=%r is not host:port (e.g. 192.0.2.11:20000)" % (addr,)))
    if _int(o, "dp_size", 1) > 1 and not o.get("enable_dp_attention"):
        # server_args.py:6790-6792
        out.append(("dp_size", "multi-node data parallel is not supported unless dp attention!"))
    return out


def group_problems(members):
    """[message] for the options of every node of one multi-node server (``members``: {name: options}): the ranks
    0 .. n-1 once each, and the same nnodes, dist_init_addr, tp_size, pp_size and model everywhere."""
    out = []
    lays = dict((name, layout(o)) for name, o in members.items())
    ranks = sorted(lay["node_rank"] for lay in lays.values())
    n = max([lay["nnodes"] for lay in lays.values()] or [1])
    if ranks != list(range(n)):
        out.append("node ranks %s: each of 0 .. %d must be given to exactly one container (%s)"
                   % (ranks, n - 1, ", ".join("%s=%s" % (k, lays[k]["node_rank"]) for k in sorted(lays))))
    for key in ("nnodes", "dist_init_addr", "tp_size", "pp_size", "model_path", "served_model_name"):
        values = dict((name, (o or {}).get(key)) for name, o in members.items())
        if len(set(repr(v) for v in values.values())) > 1:
            out.append("%s differs between the nodes (%s); it must be the same on every node"
                       % (key, ", ".join("%s=%s" % (k, values[k]) for k in sorted(values))))
    return out


# Startup milestones of sglang_log after which a node's KV pool exists (only TP rank 0 logs max_total_num_tokens,
# real scheduler.py:762, so a node of rank >= 1 never shows it).
POOL_MILESTONES = ("kv_alloc", "mem_pool_end", "graph_end", "max_total_tokens")


def follower_ready(milestones, http_state, gpu_used_mib, planned_weights_mib):
    """(ready, evidence) of a node of rank >= 1: its log is past the KV pool, its health server (started only once all
    its schedulers are ready) answers 200, and NVML shows every GPU holding at least 90 % of the planned weights."""
    if not any(k in (milestones or {}) for k in POOL_MILESTONES):
        return False, []
    if not http_state or http_state.get("health") != 200:
        return False, []
    if planned_weights_mib and gpu_used_mib:
        if any(u < 0.9 * float(planned_weights_mib) for u in gpu_used_mib):
            return False, []
    ev = ["node rank >= 1: schedulers ready, GET /health 200 (the endpoint and its probe are rank 0's)"]
    if gpu_used_mib:
        ev.append("GPU memory used (MiB): %s" % ", ".join(str(int(u)) for u in gpu_used_mib))
    return True, ev
