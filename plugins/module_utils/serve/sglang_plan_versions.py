# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which of the memory plan's rules changed in which SGLang release, read from each release's wheel.

The plan (sglang_plan / sglang_rules) follows 0.5.11; each entry here is the first release whose code gives a different
outcome for some input, with the file:line (under sglang/srt/ of that wheel) it follows. Only outcomes are keyed, not
refactors: docs/sglang-releases.md ("Memory plan per version") lists the releases whose code moved without changing one.
Standard library only; runs on the target's Python 3.9+.
"""

from __future__ import annotations

import re

BASE = "0.5.11"
NEWEST = "0.5.23"       # the newest release these thresholds were read against (container/sglang_releases.NEWEST)

# rule: (first release with the new behaviour, where)
SINCE = {
    # the 4096 MiB (EAGLE family) / 6144 MiB (STANDALONE) added to the default mem_fraction_static's reserve is gone;
    # the KV profile counts the loaded draft weights instead (model_runner_kv_cache_mixin.py:84-117)
    "no_spec_reserve": ("0.5.14", "server_args.py:3276-3315"),
    # _handle_mamba_radix_cache: radix on + "auto" picks extra_buffer when overlap is wanted and linear_attn_backend is
    # triton (the default) for Qwen3.5/Qwen3-Next; the two ValueErrors of 0.5.11 (spec + no_buffer radix, extra_buffer +
    # --disable-radix-cache) are gone: with the radix cache off the rules return at once
    "mamba_auto_extra_buffer": ("0.5.14", "server_args.py:4380-4399"),
    # the 20-35 GiB tier: chunked_prefill_size 2048 -> 4096, decode cuda graph max bs 24/80 -> 48/160
    "small_tier_4k": ("0.5.20", "arg_groups/memory_hook.py:100-117"),
    # a given --max-running-requests caps the default decode cuda graph max bs
    "graph_bs_capped_by_mrr": ("0.5.22", "arg_groups/memory_hook.py:182-188"),
}

# _support_mamba_cache_extra_buffer (0.5.14 server_args.py): the hybrid architectures extra_buffer serves
EXTRA_BUFFER_ARCHS = frozenset(["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM",
                                "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM"])


def key(version):
    """A sortable key of a release ("0.5.13.post1" after "0.5.13", before "0.5.14"); None for an unreadable one."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?", str(version or ""))
    return tuple(int(x or 0) for x in m.groups()) if m else None


def resolve(version):
    """(the release whose rules apply, a note or None): None and unreadable versions are 0.5.11's; a newer version than
    NEWEST gets NEWEST's rules, with a note saying so."""
    k = key(version)
    if k is None or k <= key(BASE):
        return BASE, None
    if k > key(NEWEST):
        return NEWEST, ("SGLang %s is newer than the memory plan's rules (read up to %s): planned with %s's rules"
                        % (version, NEWEST, NEWEST))
    return str(version), None


def has(version, rule):
    """Whether release ``version`` (as resolve() returns it) follows the changed ``rule``."""
    return key(version) >= key(SINCE[rule][0])
