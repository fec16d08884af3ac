#!/usr/bin/env python3
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the serve stage against a failure drill of the lab's SGLang stand-in and print the diagnosis.

    make drill DRILL=kv_cache_oom          # one drill
    make drill DRILL=all                   # every drill in DRILLS, one after the other
    tests/tools/drill.py [--keep] NAME...  # the same; --keep leaves the lab up and the drill's state

The lab is brought up (if it is down) and the stages before serve are converged (idempotent: a re-run
changes nothing). For each drill the stand-in is told what to do through the lab's drill file (the
node's /var/lib/kpro-lab/sglang-drill, which container 129 sees), the serve stage runs (without the preflight plays:
the drills are about the serve stage, and its inputs are the converged lab's) with
sglang_server_force_restart=true (the output drills in REUSE: against the running server, no restart), and the
gate's result (phase, evidence, remedy, the failed known-answer checks) is printed. The
drill `gpu_memory_held` starts a foreign process in the container that holds GPU memory (ended by PID
afterwards). Exit status 0 when every drill gave its expected phase, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LABCTL = os.path.join(TOP, "tests", "lab", "labctl.py")
PLAYBOOK = os.path.join(TOP, "playbooks", "migrate-kpro6-to-kpro5.yml")
INVENTORY = os.path.join(TOP, "inventories", "lab")
BIN = os.path.join(TOP, ".venv", "bin")
VENV_PY = "/opt/sglang/venv/bin/python"

# drill -> (the phase the serve stage must report, extra -e variables for that run)
DRILLS = {
    "kv_cache_oom": ("kv_cache_oom", {}),
    "weights_oom": ("weights_oom", {}),
    "init_failed_before_gpu": ("init_failed_before_gpu", {}),
    # a rank SIGKILLed halfway through the shards (the OOM killer's way): host RAM, not weights_oom as 0.1.0 said
    "host_oom_killed": ("host_oom_killed", {}),
    # no weights files after the parameters took the GPUs' memory: not init_failed_before_gpu as 0.1.0 said
    "weights_load_failed": ("weights_load_failed", {}),
    "nccl_error": ("nccl_error", {}),
    "cuda_graph_failed": ("cuda_graph_failed", {}),
    "port_in_use": ("port_in_use", {}),
    "warmup_failed": ("warmup_failed", {}),
    "degenerate_output": ("degenerate_output", {}),
    "degenerate_loop": ("degenerate_output", {}),
    # a scheduler that outlives kill_process_tree (the seed's leftover scheduler): the next launch's stop ends
    # it by the unit's cgroup and waits on NVML for the memory, so the stage still ends ready
    "leftover_child": ("ready", {}),
    # slow but progressing (log and GPU memory move): not a hang, the gate waits and ends ready. The stall budget is
    # 10 s, not less: on a loaded 2-core CI machine the stand-in's own start can go quiet for several seconds
    "slow_load:20": ("ready", {"sglang_server_stall_timeout": 10}),
    # no progress at all: timeout once the stall budget is spent
    "hang": ("timeout", {"sglang_server_stall_timeout": 10}),
    # memory held by a process that is not ours: reported with PID and MiB, never killed
    "gpu_memory_held": ("gpu_memory_held", {}),
    # the seed's configuration (65536 context, 0.85, NEXTN with the radix cache on; null drops the role's
    # max_running_requests, so SGLang's default of 48 applies): SGLang 0.5.10+ stops while parsing its arguments
    # ("ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache ...",
    # sglang/srt/server_args.py:2453-2456), so the plan refuses it before anything is launched, naming
    # --disable-radix-cache (with it, SGLang's default of 48 requests still leaves no KV pool)
    "seed_nextn": ("init_failed_before_gpu", {"sglang_server_options": {
        "context_length": 65536, "mem_fraction_static": 0.85, "max_running_requests": None, "speculative_algorithm": "NEXTN",
        "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}}),
    # output drills: the stand-in reads them at every request, so they run against the running server (no restart); the
    # known-answer check of the gate fails with the prompt, the expected and the received text
    "dropped_draft_tokens": ("wrong_answer", {}),
    "duplicated_tokens": ("wrong_answer", {}),
    "wrong_answer_tp": ("wrong_answer", {}),
    "reasoning_only": ("wrong_answer", {}),
}
# drills that are a configuration, not a behaviour of the stand-in (no drill file)
NOT_STANDIN = ("gpu_memory_held", "seed_nextn")
# drills against the running server: no forced restart, and the background gate polled every second
REUSE = ("dropped_draft_tokens", "duplicated_tokens", "wrong_answer_tp", "reasoning_only")


# what each failure's own evidence says; no other drill's evidence may show it (a stale log never leaks)
NEEDLES = {
    # (weights_oom has none of its own: its CUDA OOM message is also cuda_graph_failed's)
    "kv_cache_oom": "Not enough memory",
    "init_failed_before_gpu": "HFValidationError", "nccl_error": "NCCL error", "cuda_graph_failed": "Capture cuda graph failed",
    "host_oom_killed": "(exit code: -9)", "weights_load_failed": "Cannot find any model weights",
    "port_in_use": "address already in use", "warmup_failed": "warmup error",
}
# outside the serve stage: the host's boot and guest configs, the container's venv and model
UNTOUCHED_NODE = ("etc/pve/lxc/129.conf", "etc/kernel/cmdline", "etc/default/grub", "etc/modules")
UNTOUCHED_CT = "cat /opt/sglang/venv/.kpro-lock.sha256; find /srv/models/Qwen3.6-27B -path '*/.cache' -prune -o -type f -printf '%p %s\\n' | sort"


def labctl(*args, check=True):
    return subprocess.run([os.path.join(BIN, "python"), LABCTL] + list(args), check=check, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def play(*args):
    # our own Ansible settings only: under molecule the environment forces colour and other callbacks
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_", "PY_COLORS")))
    env.update(ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_CALLBACK_FORMAT_PRETTY="0")
    return subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", INVENTORY, PLAYBOOK] + list(args), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=TOP, check=False)


def gate_result(out):
    """The last ct129 task result that carries a diagnosis (`phase`): the gate's, or the service
    module's when it refused before launching (gpu_memory_held, kv_cache_oom by the plan)."""
    found = None
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)
    for m in re.finditer(r"^(?:fatal|ok|changed): \[ct129\]: (?:FAILED! )?=> (\{.*\})$", out, re.M):
        res = json.loads(m.group(1))
        if res.get("phase"):
            found = res
    return found


def node_root():
    return labctl("root").stdout.strip()


def set_drill(text):
    path = os.path.join(node_root(), "var/lib/kpro-lab/sglang-drill")
    if text:
        with open(path, "w") as f:
            f.write(text + "\n")
    elif os.path.exists(path):
        os.unlink(path)


def start_foreign_holder(mib=6000):
    """A process in container 129, outside the sglang unit, that holds GPU memory; returns its PID (node's view)."""
    code = ("import os, sys, time; sys.path.insert(0, '/opt/sglang/venv/lib/python3.11/site-packages');"
            "from sglang.srt._kpro_lab import gpustate;"
            "gpustate.set_usage(0, %d, 'python3'); gpustate.set_usage(1, %d, 'python3');"
            "print(os.getpid(), flush=True); time.sleep(3600)" % (mib, mib))
    # nohup + setsid: it outlives the pct exec session like an operator's stray notebook kernel would
    r = labctl("exec", "--", "pct", "exec", "129", "--", "sh", "-c",
               "setsid nohup %s -c \"%s\" > /tmp/kpro-drill-holder.pid 2>/dev/null & sleep 1; cat /tmp/kpro-drill-holder.pid"
               % (VENV_PY, code))
    return int(r.stdout.split()[0])


def stop_foreign_holder(ct_pid):
    labctl("exec", "--", "pct", "exec", "129", "--", "kill", "-9", str(ct_pid), check=False)
    labctl("exec", "--", "pct", "exec", "129", "--", VENV_PY, "-m", "sglang.srt._kpro_lab.gpustate", "reap", check=False)


def untouched_digest():
    root = node_root()
    out = {}
    for rel in UNTOUCHED_NODE:
        with open(os.path.join(root, rel), "rb") as f:
            out[rel] = f.read()
    out["ct"] = labctl("exec", "--", "pct", "exec", "129", "--", "sh", "-c", UNTOUCHED_CT).stdout
    return out


def print_known_answer(ka):
    """The failed known-answer checks: the prompt, the expected and the received text."""
    for c in [c for c in (ka or {}).get("checks") or [] if not c.get("ok")]:
        print("check:    %s via %s: %s" % (c.get("name"), c.get("endpoint"), c.get("why")))
        print("  prompt:   %r" % c.get("prompt"))
        print("  expected: %r" % c.get("expected"))
        print("  received: %r" % (c.get("received") if c.get("received") is not None else None))
        if c.get("reasoning_content"):
            print("  reasoning_content: %r" % c["reasoning_content"][:200])


def run_drill(name, quiet=False):
    expected, extra = DRILLS[name]
    holder = None
    set_drill("" if name in NOT_STANDIN else name)
    if name == "gpu_memory_held":
        # stop our server first: the check is about memory that is not ours
        play("--tags", "serve", "--skip-tags", "preflight", "-e", "sglang_server_state=stopped")
        holder = start_foreign_holder()
    args = ["--tags", "serve", "--skip-tags", "preflight", "-e", "sglang_server_gate_timeout=120"]
    args += ["-e", "sglang_server_gate_poll=1"] if name in REUSE else ["-e", "sglang_server_force_restart=true"]
    for k, v in extra.items():
        args += ["-e", json.dumps({k: v})]
    t0 = time.time()
    holder_alive = None
    try:
        r = play(*args)
    finally:
        set_drill("")
        if holder is not None:
            # reported, never killed: the foreign process must still be there
            holder_alive = labctl("exec", "--", "pct", "exec", "129", "--", "kill", "-0", str(holder), check=False).returncode == 0
            stop_foreign_holder(holder)
    res = gate_result(r.stdout) or {}
    phase = res.get("phase") or ("ready" if r.returncode == 0 else None)
    ok = phase == expected and holder_alive is not False
    if holder_alive is False:
        print("    the foreign process holding GPU memory was killed")
    verdict = "OK" if ok else "MISMATCH"
    print("=== drill %-24s phase=%-24s expected=%-22s %s (%.1fs)" % (name, phase, expected, verdict, time.time() - t0))
    if not quiet:
        if res.get("remedy"):
            print("remedy:   %s" % res["remedy"])
        for line in (res.get("evidence") or [])[:12]:
            print("evidence: %s" % str(line)[:220])
        if res.get("gpu_used_mib") is not None:
            print("gpu MiB:  %s   exit status: %s   launch: %s" % (res.get("gpu_used_mib"), res.get("exit_status"), res.get("launch_id")))
        if res.get("holders"):
            print("holders:  %s" % res.get("holders"))
        print_known_answer(res.get("known_answer"))
    if not ok:
        print(r.stdout[-4000:])
    return ok, res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("drills", nargs="+", help="drill names, or 'all': %s" % ", ".join(DRILLS))
    ap.add_argument("--keep", action="store_true", help="leave the server as the last drill left it")
    args = ap.parse_args(argv)
    names = list(DRILLS) if args.drills == ["all"] else args.drills
    unknown = [n for n in names if n not in DRILLS]
    if unknown:
        ap.error("unknown drill(s) %s; known: %s" % (", ".join(unknown), ", ".join(DRILLS)))
    if labctl("status", check=False).returncode != 0:
        subprocess.run([os.path.join(BIN, "python"), LABCTL, "up"], check=True)
    r = play("--tags", "gpu_host,lxc_gpu,container,model")
    if r.returncode != 0:
        print(r.stdout[-4000:])
        return 1
    before = untouched_digest()
    results, seen = [], []
    for n in names:
        ok, res = run_drill(n)
        evidence = "\n".join(str(x) for x in res.get("evidence") or [])
        leaked = [d for d in seen if d != n.split(":", maxsplit=1)[0] and NEEDLES.get(d) and NEEDLES[d] in evidence]
        if leaked:
            print("    evidence of %s shows an earlier launch's failure: %s" % (n, leaked))
            ok = False
        if ok and res.get("phase") not in (None, "ready") and not res.get("remedy"):
            print("    %s: no remedy" % n)
            ok = False
        seen.append(n.split(":", maxsplit=1)[0])
        results.append(ok)
    after = untouched_digest()
    changed = [k for k in before if before[k] != after[k]]
    print("=== outside the serve stage: %s" % ("unchanged" if not changed else "CHANGED: %s" % changed))
    results.append(not changed)
    if not args.keep:
        r = play("--tags", "serve")  # back to the good configuration
        print("=== after the drills the server is %s" % ("ready again" if r.returncode == 0 else "NOT ready:\n" + r.stdout[-2000:]))
    print("%d passed, %d failed" % (sum(results), len(results) - sum(results)))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
