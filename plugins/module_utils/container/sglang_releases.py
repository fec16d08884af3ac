# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SGLang releases the collection knows, 0.5.11 to the newest on PyPI, and what each changed that matters here.

Read from each release's own wheel (sglang-X-cp311-cp311-manylinux_2_34_x86_64.whl), not its release notes, by
``tests/tools/sglang_release_diff.py WHEEL...`` (its docstring says how to add a release). Every place is a file:line
under sglang/srt/ of that release's wheel. Per release, only what changed against the one before:
  added: how many server arguments are new (none of them one this collection passes);
  deprecated: {flag: (what to use, file:line)}: still accepted, with a warning (DeprecatedAliasStoreAction /
    DeprecatedStoreTrueAction, arg_groups/argparse_actions.py);
  removed: {flag: file:line in the release before}: argparse refuses it ("unrecognized arguments");
  others_removed / others_deprecated: how many more, none of them one this collection passes;
  rules: {rule: file:line} whose code changed: memory (mem_fraction_static, chunked_prefill_size, max_running_requests,
    cuda graph sizes: _handle_gpu_memory_settings, from 0.5.19 arg_groups/memory_hook.py), mamba_radix
    (_handle_mamba_radix_cache, from 0.5.19 arg_groups/mamba_hook.py), speculative (_handle_speculative_decoding,
    from 0.5.13 arg_groups/speculative_hook.py; the diff compares that whole module);
  health: /health and /health_generate (one handler, entrypoints/http_server.py); metrics: the --enable-metrics field
    (the Prometheus app at /metrics), present in every release.
  log: {line: (wording, file:line)} of the startup lines the diagnosis reads (serve/sglang_log.py) whose wording the
    release changed (0.5.11: each one's first wording), a %-format over named values; the lab's stand-in writes them.
The dataclass defaults of mem_fraction_static, max_running_requests, chunked_prefill_size and context_length are None
in every release (computed by the memory rules), so no entry names them. Standard library only.
"""

from __future__ import annotations

import glob
import os
import re

HS = "entrypoints/http_server.py:"
RELEASES = (
    {"version": "0.5.11", "date": "2026-05-05", "health": HS + "506-507", "metrics": "server_args.py:4876",
     "log": {"server_args": ("server_args=ServerArgs(%(fields)s)", "entrypoints/engine.py:188"),
             "dist_begin": ("Init torch distributed begin.", "model_executor/model_runner.py:1103"),
             "dist_end": ("Init torch distributed ends. elapsed=%(elapsed).2f s, mem usage=%(mem).2f GB",
                          "model_executor/model_runner.py:1236-1237"),
             "kv_alloc": ("KV Cache is allocated. #tokens: %(tokens)d, K size: %(k).2f GB, V size: %(v).2f GB",
                          "mem_cache/memory_pool.py:735")}},
    {"version": "0.5.12", "date": "2026-05-16", "health": HS + "505-506", "metrics": "server_args.py:5258", "added": 15,
     "rules": {"mamba_radix": "server_args.py:2481", "speculative": "server_args.py:3551"}},
    {"version": "0.5.12.post1", "date": "2026-05-23", "health": HS + "505-506", "metrics": "server_args.py:5258"},
    {"version": "0.5.13", "date": "2026-06-11", "health": HS + "512-513", "metrics": "server_args.py:5224", "added": 20,
     "others_removed": 2, "others_deprecated": 5,
     "rules": {"memory": "server_args.py:1444", "mamba_radix": "server_args.py:2664",
               "speculative": "arg_groups/speculative_hook.py"},
     "log": {"kv_alloc": ("KV Cache is allocated. dtype: %(dtype)s, #tokens: %(tokens)d, K size: %(k).2f GB, V size: %(v).2f GB",
                          "mem_cache/memory_pool.py:819")}},
    {"version": "0.5.13.post1", "date": "2026-06-15", "health": HS + "512-513", "metrics": "server_args.py:5224"},
    {"version": "0.5.14", "date": "2026-06-26", "health": HS + "561-562", "metrics": "server_args.py:1030", "added": 18,
     "deprecated": {"--mamba-scheduler-strategy": ("--mamba-radix-cache-strategy", "server_args.py:6349"),
                    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode", "server_args.py:6358"),
                    "--disable-cuda-graph": ("--cuda-graph-backend-{decode,prefill}=disabled", "server_args.py:6375"),
                    "--disable-piecewise-cuda-graph": ("--cuda-graph-backend-prefill=disabled", "server_args.py:6390")},
     "others_removed": 4, "others_deprecated": 10,
     "rules": {"memory": "server_args.py:3122", "mamba_radix": "server_args.py:4380",
               "speculative": "arg_groups/speculative_hook.py"}},
    {"version": "0.5.15", "date": "2026-07-10", "health": HS + "578-579", "metrics": "server_args.py:1156", "added": 18,
     "rules": {"memory": "server_args.py:3469", "mamba_radix": "server_args.py:4278",
               "speculative": "arg_groups/speculative_hook.py"}},
    {"version": "0.5.15.post1", "date": "2026-07-14", "health": HS + "578-579", "metrics": "server_args.py:1156"},
    {"version": "0.5.16", "date": "2026-07-25", "health": HS + "616-617", "metrics": "server_args.py:1274", "added": 26,
     "others_removed": 2, "rules": {"memory": "server_args.py:3900", "speculative": "arg_groups/speculative_hook.py"}},
    {"version": "0.5.17", "date": "2026-08-08", "health": HS + "646-647", "metrics": "server_args.py:1492", "added": 14,
     "others_deprecated": 1,
     "rules": {"memory": "server_args.py:4607", "mamba_radix": "server_args.py:5625",
               "speculative": "arg_groups/speculative_hook.py"}},
    {"version": "0.5.18", "date": "2026-08-21", "health": HS + "654-655", "metrics": "server_args.py:1547", "added": 15,
     "others_removed": 1, "others_deprecated": 1,
     "rules": {"memory": "server_args.py:4802", "speculative": "arg_groups/speculative_hook.py"}},
    {"version": "0.5.19", "date": "2026-09-04", "health": HS + "662-663", "metrics": "server_args.py:1501", "added": 15,
     "rules": {"memory": "arg_groups/memory_hook.py", "mamba_radix": "arg_groups/mamba_hook.py",
               "speculative": "arg_groups/speculative_hook.py"},
     # a dict of the resolved fields (resolved_dict()), not the dataclass repr; it prints the API keys as 0.5.11 did
     "log": {"server_args": ("server_args={%(fields)s}", "entrypoints/engine.py:1098")}},
    {"version": "0.5.20", "date": "2026-09-18", "health": HS + "669-670", "metrics": "arg_groups/fields/observability.py:77",
     "added": 14,
     # the 0.5.14 aliases are gone; --disable-cuda-graph stays (server_args.py:404, DeprecatedStoreTrueAction)
     "removed": {"--mamba-scheduler-strategy": "server_args.py:3919", "--cuda-graph-max-bs": "server_args.py:3928",
                 "--disable-piecewise-cuda-graph": "server_args.py:3960"},
     "others_removed": 20, "rules": {"memory": "arg_groups/memory_hook.py", "speculative": "arg_groups/speculative_hook.py"}},
    {"version": "0.5.21", "date": "2026-10-01", "health": HS + "699-700", "metrics": "arg_groups/fields/observability.py:70",
     "added": 21, "others_removed": 2,
     "rules": {"mamba_radix": "arg_groups/mamba_hook.py", "speculative": "arg_groups/speculative_hook.py"},
     # init_parallel_runtime (still before set_device, :130) replaced init_torch_distributed; the memory it used moved
     # to a line of its own, logged by draft workers too (measure_pre_model_load_memory)
     "log": {"dist_begin": ("Init parallel begin.", "distributed/bootstrap.py:118"),
             "dist_end": ("Init parallel ends. elapsed=%(elapsed).2f s", "distributed/bootstrap.py:174"),
             "mem_baseline": ("Memory baseline taken. mem usage=%(mem).2f GB", "distributed/bootstrap.py:203-206")}},
    {"version": "0.5.22", "date": "2026-10-16", "health": HS + "705-706", "metrics": "arg_groups/fields/observability.py:70",
     "added": 11, "others_removed": 1, "others_deprecated": 1,
     "rules": {"memory": "arg_groups/memory_hook.py", "mamba_radix": "arg_groups/mamba_hook.py",
               "speculative": "arg_groups/speculative_hook.py"}},
    {"version": "0.5.23", "date": "2026-10-30", "health": HS + "721-722", "metrics": "arg_groups/fields/observability.py:70",
     "added": 11, "others_removed": 1,
     "rules": {"memory": "arg_groups/memory_hook.py", "speculative": "arg_groups/speculative_hook.py"}},
)
VERSIONS = tuple(r["version"] for r in RELEASES)
NEWEST = VERSIONS[-1]
REGENERATE = "roles/sglang_install/files/locks/regenerate.sh"


def release(version):
    """The table's entry for this release, or None when the table does not know it."""
    return dict(RELEASES[VERSIONS.index(version)]) if version in VERSIONS else None


def _span(since, version):
    """The releases after ``since`` up to ``version`` (both in the table), in order."""
    return RELEASES[VERSIONS.index(since) + 1:VERSIONS.index(version) + 1]


def flag_changes(flags, version, since=VERSIONS[0]):
    """What the releases after ``since`` up to ``version`` did to these server arguments: one line per change, e.g.
    '--cuda-graph-max-bs: removed in 0.5.20 (server_args.py:3928 of the release before)'. [] when none did."""
    out = []
    for r in _span(since, version):
        for flag in flags:
            if flag in r.get("deprecated", {}):
                use, where = r["deprecated"][flag]
                out.append("%s: deprecated in %s, use %s (%s)" % (flag, r["version"], use, where))
            if flag in r.get("removed", {}):
                out.append("%s: removed in %s (%s of the release before)" % (flag, r["version"], r["removed"][flag]))
    return out


def rule_changes(version, since=VERSIONS[0]):
    """{rule: [releases whose code of that rule changed]} after ``since`` up to ``version``."""
    out = {}
    for r in _span(since, version):
        for rule in r.get("rules", {}):
            out.setdefault(rule, []).append(r["version"])
    return out


def not_in_table(version):
    """The warning for a version newer than the table's newest (compat.verdict says it)."""
    return ("sglang %s is not in the compatibility table (newest known: %s): no known-bad rule or argument change "
            "after %s is known; add it with tests/tools/sglang_release_diff.py (docs/sglang-releases.md)."
            % (version, NEWEST, NEWEST))


def lock_versions(lock_dir, arch="*"):
    """The SGLang versions the collection has a lock for (files/locks/sglang-<version>-py<X.Y>-<arch>.txt), sorted."""
    names = glob.glob(os.path.join(lock_dir, "sglang-*-py3.*-%s.txt" % (glob.escape(arch) if arch != "*" else "*")))
    found = set(re.sub(r"^sglang-(.+)-py3\.\d+-.*$", r"\1", os.path.basename(n)) for n in names)
    return sorted(found, key=lambda v: [int(x) if x.isdigit() else -1 for x in re.split(r"[.a-z]+", v) if x])


def no_lock(version, python, available):
    """The answer for a version (and Python) with no lock: which locks exist and how to make one."""
    return ("no lock for SGLang %s on Python %s: the collection has locks for versions %s; make one with %s %s %s"
            % (version, python, ", ".join(available) or "none", REGENERATE, version, python))
