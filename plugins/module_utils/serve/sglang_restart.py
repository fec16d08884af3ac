# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve stage's decisions, pure: restart or not, which settings are refused, who holds the GPUs,
and what the memory plan refuses. Each refusal is a :class:`failure.Failure` (phase, msg, evidence, remedy)
that the module reports once, in ``main``.

Standard library only; runs on the target's Python 3.9+.
"""

from __future__ import annotations

import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

RUNNING_STATES = ("active", "activating", "reloading")

REMEDY_SETTINGS = ("Fix each setting named (sglang_server_options, sglang_server_environment, sglang_server_model_dir) and "
                   "re-run; the running server was left serving.")
REMEDY_OPTION = "Fix the value it names (sglang_server_options or sglang_server_environment); nothing was changed."


def restart_reasons(props, stored_fingerprint, fingerprint, force=False):
    """Why the server must be (re)started; [] keeps the running one.

    ``props``: the unit's ``systemctl show`` properties; ``stored_fingerprint``: the fingerprint the running
    launch was started with (the state file); ``fingerprint``: that of the files rendered now."""
    reasons = []
    if force:
        reasons.append("force_restart")
    if props.get("ActiveState") not in RUNNING_STATES:
        reasons.append("the server is not running (%s)" % (props.get("ActiveState") or "unknown"))
    elif stored_fingerprint != fingerprint:
        reasons.append("the rendered unit, environment file or launcher differ from those the running server was started with")
    return reasons


def launch_baseline(holders, our_pids, used_mib, stored_baseline, idle_used_mib):
    """Per-GPU memory.used that is not the server's: measured when nothing holds the GPUs and every GPU is idle,
    else the one stored at the running launch's start (None when neither is known).

    Memory above ``idle_used_mib`` with no process listed is memory still being freed (a server that died a moment
    ago: NVML's used memory and its process list are two calls, and one peer's stop ends the other nodes' servers),
    not a baseline: taken for one, the plan refused a launch that fits (weights_oom with the old server's memory
    counted as used). stop_and_release waits for that memory before the start, or refuses with unreleased."""
    idle = used_mib is not None and all((u or 0) <= idle_used_mib for u in used_mib)
    if not our_pids and not holders and idle:
        return used_mib
    return stored_baseline or None


def probe_regex_refusal(regex):
    """A Failure when the gate's probe regex does not compile, else None."""
    if not regex:
        return None
    try:
        re.compile(regex)
    except re.error as e:
        return Failure("not_started", "sglang_server_probe.regex %r does not compile: %s" % (regex, e),
                       remedy="Fix sglang_server_probe.regex (a Python regular expression); nothing was changed.")
    return None


def options_refusal(options, api_key):
    """A Failure when the API key is not where it must be (options.api_key, or a second --config), else None."""
    if options.get("api_key") not in (None, False):
        return Failure("not_started", "options.api_key: pass the API key as the module's api_key (no_log), not in options",
                       remedy="Move the key to api_key: it then stays out of the unit file and the logs.")
    if api_key and options.get("config") not in (None, False):
        return Failure("not_started", "options.config: SGLang takes one --config file, and it carries the API key (api_key)",
                       remedy="Move the settings of your config file into options, or leave api_key empty.")
    return None


def setting_problems(options, flags, gpu_count, port_busy, found=(), version=None):
    """Every problem of the settings that needs no change to find: (problems, phase).

    ``flags``: the installed SGLang's flags (None: not checked); ``gpu_count``: GPUs NVML sees;
    ``port_busy(port)``: whether another process listens on the port; ``found``: the container's own checks'
    problems (sglang_prestop), reported with these; ``version``: the installed SGLang's (its flags and choices). The
    phase is ``port_in_use`` when that is the only problem, else ``not_started``."""
    problems = []
    for key, flag, close in su.unknown_options(options, flags, version) if flags else []:
        problems.append("option %s: the installed SGLang has no %s%s" % (key, flag, (" (did you mean %s?)" % ", ".join(close)) if close else ""))
    ranges = su.range_problems(options, version)
    problems += ["option %s" % msg for _key, msg in ranges]
    need = su.gpus_needed(options)
    if need > gpu_count:
        problems.append("option tp_size: the server needs %d GPUs (tp_size x pp_size x dp_size from base_gpu_id) but NVML sees %d "
                        "in this container; lower tp_size or pass more GPUs to the container" % (need, gpu_count))
    problems += list(found)
    port = options.get("port", 30000)
    if not any(k == "port" for k, _m in ranges) and port_busy(port):
        problems.append("option port: port %s is taken by another process (not this unit's server): stop it (ss -ltnp "
                        "sport = :%s finds it) or choose another port" % (port, port))
        return problems, ("port_in_use" if len(problems) == 1 else "not_started")
    return problems, "not_started"


def settings_refusal(problems, phase):
    """The Failure for :func:`setting_problems`' list (None when empty)."""
    if not problems:
        return None
    return Failure(phase, "invalid server settings, refused before the running server was touched: %s" % "; ".join(problems),
                   remedy=REMEDY_SETTINGS, evidence=problems)


def foreign_holders(holders, ours=()):
    """Processes in this PID namespace, not of this unit, that hold GPU memory."""
    ours = set(ours)
    return [h for h in holders if h["visible"] and not h["ours"] and h["pid"] not in ours]


def busy_gpus(gpus, idle_used_mib):
    """[(index, used MiB)] of the GPUs above the idle usage."""
    return [(g.get("index"), g.get("memory_used_mib")) for g in gpus if (g.get("memory_used_mib") or 0) > idle_used_mib]


def held_refusal(held, used_mib, why, ended=()):
    """The ``gpu_memory_held`` Failure naming every holder (PID, name, MiB, GPU); never ends one."""
    ev = []
    for h in held:
        where = "" if h["visible"] else " (not visible in this PID namespace: a host PID)"
        if h["pid"] in ended:
            where = " (a process of this unit, ended; the driver still lists its memory)"
        mib = h["used_mib"] if h["used_mib"] is not None else "?"
        ev.append("PID %s %s holds %s MiB on GPU %s%s" % (h["pid"], h["name"], mib, h["gpu"], where))
    if used_mib is not None:
        ev.append("GPU memory used (MiB): %s" % ", ".join(str(u) for u in used_mib))
    names = ", ".join(sorted(set("PID %s %s" % (h["pid"], h["name"]) for h in held)))
    return Failure("gpu_memory_held", "%s. %s" % (why, "; ".join(ev)), evidence=ev,
                   remedy="GPU memory is held by processes that are not this unit's (%s): stop them yourself (this module "
                          "never ends a process that is not in the unit's cgroup) or wait until they exit, then re-run." % names)


def unreleased_refusal(over, timeout):
    """The ``gpu_memory_held`` Failure for memory no process NVML lists holds after ``timeout`` seconds."""
    ev = ["GPU %s: %s MiB used with no process NVML reports" % o for o in over]
    return Failure("gpu_memory_held", "GPU memory was not released within %ss: %s" % (timeout, "; ".join(ev)), evidence=ev,
                   remedy="Something NVML does not attribute (inside LXC: a host process) holds the memory: find it on the "
                          "host (nvidia-smi there), stop it, and re-run; raise idle_used_mib if this is the idle usage.")


def plan_refusal(plan):
    """The Failure of a plan that does not fit (``weights_oom`` when the weights alone do not, else ``kv_cache_oom``);
    None when it fits, or when its verdict is advice only (``advisory``: a rule the plan does not model for that release)."""
    if plan is None or plan["fits"] or plan.get("advisory"):
        return None
    pg = plan["per_gpu"]
    # the plan names its phase (a refusal SGLang makes at startup is init_failed_before_gpu); else by what does not fit
    phase = plan.get("phase") or ("weights_oom" if pg["weights_mib"] > pg["free_mib"] else "kv_cache_oom")
    ev = [plan["reason"],
          "per GPU: total %s MiB, free %s MiB, weights %s MiB, static pool %s MiB (mem_fraction_static %s), reserve %s MiB, "
          "GDN/mamba state %s MiB, speculative reservation %s MiB, KV budget %s MiB = %s tokens, context_length %s"
          % (pg["total_mib"], pg["free_mib"], pg["weights_mib"], pg["static_pool_mib"], plan["options"].get("mem_fraction_static"),
             pg["reserve_mib"], pg["mamba_state_mib"], pg["spec_reservation_mib"], pg["kv_budget_mib"], pg["kv_tokens"],
             plan["context_length"])]
    return Failure(phase, "the memory plan refuses this launch before starting it. %s" % plan["reason"], evidence=ev, remedy=plan["remedy"])


def stored_plan(plan):
    """The part of a plan kept with the launch's state (what the gate and a later no-op run need)."""
    if not plan:
        return None
    return {"fits": plan["fits"], "per_gpu": plan["per_gpu"], "reason": plan["reason"]}
