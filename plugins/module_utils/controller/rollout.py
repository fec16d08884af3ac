# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rolling rebuild over a fleet: which hosts go together, in which order, and what the fleet looks like.

The unit of a rollout is a Proxmox host with its GPU containers (those whose ``pve_node_host`` names it). The
containers of one multi-node server (``nnodes`` > 1 with the same ``dist_init_addr`` in the options each runs with,
:func:`run_options`) must start together, so their hosts' units are merged into one. The playbook's rollout play runs
over :func:`plan`'s ``hosts`` in that order with ``serial`` set to its ``serial`` (the number of hosts of each batch):
each batch is ``batch_size`` units, whole. Used by the filters kpro.gpu_serving.rollout_plan and kpro.gpu_serving.rollout_status.
"""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_multinode


def _get(hostvars, name, key, default=None):
    try:
        value = hostvars[name].get(key, default) if hasattr(hostvars[name], "get") else hostvars[name][key]
    except Exception:       # an undefined or broken variable of one host: the default (a plan never fails on it)
        return default
    return default if value is None else value


# The fact the plan play sets on each container (roles/sglang_server/tasks/options.yml): the SGLang options its server
# runs with, merged by the role itself (its defaults, tp_size from sglang_install_tp, the inventory's options).
RUN_OPTIONS = "sglang_server_run_options"


def run_options(hostvars, name):
    """The SGLang options a container's server runs with: the role's merge (:data:`RUN_OPTIONS`), else, without that
    fact (a caller that did not include the role's options.yml), the inventory's sglang_server_options as they are."""
    options = _get(hostvars, name, RUN_OPTIONS) or _get(hostvars, name, "sglang_server_options", {}) or {}
    return dict(options) if hasattr(options, "items") else {}


def _server_key(hostvars, name):
    """The multi-node server a container belongs to ((dist_init_addr, model)) or None for a single-node one."""
    options = run_options(hostvars, name)
    try:
        if int(options.get("nnodes") or 1) > 1 and options.get("dist_init_addr"):
            return str(options["dist_init_addr"])
    except (TypeError, ValueError, AttributeError):
        return None
    return None


def units(proxmox_hosts, containers, hostvars):
    """[[proxmox host, its containers...], ...] in inventory order; hosts sharing a multi-node server merged."""
    out = []
    where = {}
    for h in proxmox_hosts:
        where[h] = len(out)
        out.append([h])
    orphans = []
    for c in containers:
        host = _get(hostvars, c, "pve_node_host")
        if host in where:
            out[where[host]].append(c)
        else:
            orphans.append([c])
    # merge the units of one multi-node server (union-find over unit indexes)
    parent = list(range(len(out)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    first_of = {}
    for i, unit in enumerate(out):
        for c in unit[1:]:
            key = _server_key(hostvars, c)
            if key is None:
                continue
            if key in first_of:
                a, b = root(first_of[key]), root(i)
                parent[max(a, b)] = min(a, b)
            else:
                first_of[key] = i
    merged = {}
    for i, unit in enumerate(out):
        merged.setdefault(root(i), []).extend(unit)
    return [merged[i] for i in sorted(merged)] + orphans


def plan(groups, hostvars, batch_size=None, max_fail_percentage=None, play_hosts=None):
    """dict(hosts, serial, max_fail_percentage, units, batches, problems) of a rollout.

    ``batch_size``: units per batch (default: the first Proxmox host's ``kpro_rollout_serial``, else 1; 0 = all at
    once); ``max_fail_percentage``: likewise from ``kpro_rollout_max_fail_percentage``, default 0 (any failed host stops
    the rollout after its batch; the hosts done before keep serving). ``play_hosts``: the hosts of this run (the plan
    play's ``ansible_play_hosts_all``, that is the inventory under ``--limit``); None for every host. Only the units
    inside it are planned; a unit only partly inside it is a problem (a host and its containers, and the hosts of one
    multi-node server, are rolled out together or not at all).
    """
    prox = list((groups or {}).get("proxmox_hosts") or [])
    cts = list((groups or {}).get("gpu_containers") or [])
    us = units(prox, cts, hostvars)
    problems = []
    if play_hosts is not None:
        inside = set(play_hosts)
        for unit in us:
            missing = [h for h in unit if h not in inside]
            if missing and len(missing) < len(unit):
                problems.append("--limit names part of the rollout unit %s: name all of it (add %s) or none of it; a "
                                "Proxmox host, its containers and the hosts of one multi-node server are rolled out "
                                "together" % (" + ".join(unit), ":".join(missing)))
        us = [unit for unit in us if all(h in inside for h in unit)]
        planned = set(h for unit in us for h in unit)
        prox = [h for h in prox if h in planned]
        cts = [h for h in cts if h in planned]
    first = prox[0] if prox else (cts[0] if cts else None)
    if batch_size is None:
        batch_size = _get(hostvars, first, "kpro_rollout_serial", 1) if first else 1
    if max_fail_percentage is None:
        max_fail_percentage = _get(hostvars, first, "kpro_rollout_max_fail_percentage", 0) if first else 0
    batch_size = int(batch_size)
    if batch_size < 0:
        raise ValueError("kpro_rollout_serial must be 0 (all hosts at once) or a number of Proxmox hosts per batch, not %d" % batch_size)
    size = batch_size or max(1, len(us))
    batches = [us[i:i + size] for i in range(0, len(us), size)]
    hosts = [h for unit in us for h in unit]
    serial = [sum(len(u) for u in b) for b in batches] or [1]
    return {"hosts": hosts, "serial": serial, "max_fail_percentage": int(max_fail_percentage), "units": us,
            "batches": [[h for u in b for h in u] for b in batches], "problems": problems + server_problems(cts, hostvars)}


def server_problems(containers, hostvars):
    """[message] for each multi-node server whose nodes disagree (ranks, nnodes, tp_size, init address, model), on the
    options each node really runs with (:func:`run_options`)."""
    servers = {}
    for c in containers:
        key = _server_key(hostvars, c)
        if key:
            servers.setdefault(key, {})[c] = run_options(hostvars, c)
    out = []
    for key in sorted(servers):
        out += ["the multi-node server at %s: %s" % (key, m) for m in sglang_multinode.group_problems(servers[key])]
    return out


BATCH_GROUP = "kpro_rollout_batch_"
MAX_FAIL_GROUP = "kpro_rollout_max_fail_"


def enumerate_batches(batches):
    """[[batch index, host], ...]: the loop of the play that puts each host in its batch's group."""
    return [[i, h] for i, b in enumerate(batches or []) for h in b]


def serial_from_groups(groups):
    """The rollout play's ``serial`` from the batch groups the plan play made (play keywords see ``groups``, not
    ``hostvars``): the size of each batch, in order; [1] when there is none (nothing to roll)."""
    names = sorted(k for k in (groups or {}) if k.startswith(BATCH_GROUP))
    return [len(groups[k]) for k in names] or [1]


def max_fail_from_groups(groups):
    for k in groups or {}:
        if k.startswith(MAX_FAIL_GROUP) and groups[k]:
            return int(k[len(MAX_FAIL_GROUP):])
    return 0


def status(units_, hostvars, play_hosts=None):
    """One line per unit: serving, FAILED (host: task, phase), or not touched, from the facts the rollout play sets
    (``kpro_rollout_result``: 'served' or 'failed'; ``kpro_rollout_failure``: dict(task, phase, msg))."""
    lines = []
    for unit in units_ or []:
        failed = [(h, _get(hostvars, h, "kpro_rollout_failure")) for h in unit if _get(hostvars, h, "kpro_rollout_failure")]
        results = [_get(hostvars, h, "kpro_rollout_result") for h in unit]
        name = " + ".join(unit)
        if failed:
            h, f = failed[0]
            f = f if isinstance(f, dict) else {}
            lines.append("%s: FAILED on %s at %r (%s)" % (name, h, f.get("task") or "?", f.get("phase") or "failed"))
        elif all(r == "served" for r in results):
            lines.append("%s: serving" % name)
        elif any(results):
            lines.append("%s: stopped in this batch (another host of the batch failed)" % name)
        else:
            lines.append("%s: not touched (the rollout stopped before it)" % name)
    return lines
