"""What the stand-in's parser and log do differently per SGLang release, from kpro.gpu_serving's release table
(plugins/module_utils/container/sglang_releases.py: each release's deprecated and removed server arguments, read from its
wheel), not a second copy of it. build_wheel.py puts that file into the wheel as ``_release_table.py``; run from the
source tree, the file is read where it lives. Only the arguments the table names change; every other flag stays
0.5.11's (flags_0_5_11.py), so a flag added after 0.5.11 that the table does not name is still refused (an
approximation, tests/lab/sglang_standin/README.md)."""

import argparse
import importlib.util
import logging
import os

HERE = os.path.dirname(os.path.abspath(__file__))
# the source tree: tests/lab/sglang_standin/sglang/srt/_kpro_lab -> the repository root, six levels up
_IN_TREE = os.path.join(HERE, *([os.pardir] * 6 + ["plugins", "module_utils", "container", "sglang_releases.py"]))


def _table():
    try:
        from sglang.srt._kpro_lab import _release_table
        return _release_table
    except ImportError:
        spec = importlib.util.spec_from_file_location("_kpro_release_table", _IN_TREE)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


TABLE = _table()


def vt(version):
    """'0.5.13.post1' -> (0, 5, 13, 1): the order of the table's versions."""
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.replace(".post", ".").split(".")]
    return tuple(parts + [0] * (4 - len(parts)))


def changes(version):
    """({flag: (what to use, release, file:line)} deprecated, {flag: (release, file:line)} removed) in force for a
    server installed as ``version``: every release of the table up to it."""
    deprecated, removed = {}, {}
    for r in TABLE.RELEASES:
        if vt(r["version"]) > vt(version):
            break
        for flag, (use, where) in r.get("deprecated", {}).items():
            deprecated[flag] = (use, r["version"], where)
        for flag, where in r.get("removed", {}).items():
            removed[flag] = (r["version"], where)
            deprecated.pop(flag, None)
    return deprecated, removed


def new_flags(use):
    """The flags a deprecation names ('--cuda-graph-backend-{decode,prefill}=disabled'): [(flag, value or None)]."""
    flag, _eq, value = use.partition("=")
    if "{" in flag:
        head, rest = flag.split("{", 1)
        alts, tail = rest.split("}", 1)
        return [(head + a + tail, value or None) for a in alts.split(",")]
    return [(flag, value or None)]


# What the new flags take, and the stand-in's own name for what they set (the 0.5.11 option it models).
# --mamba-radix-cache-strategy: 0.5.14 server_args.py:1731-1737, 0.5.23 arg_groups/fields/exec_.py:512-519 (extra_buffer_lazy
# a choice since 0.5.13); --cuda-graph-max-bs-decode: 0.5.14 server_args.py:1939-1942, 0.5.23 exec_.py:629-631;
# --cuda-graph-backend-{decode,prefill}: choices Backend.ALL, with tc_piecewise through 0.5.21
# (model_executor/cuda_graph_config.py:45 of 0.5.14, :47 of 0.5.21) and without it from 0.5.22 (:48).
STRATEGIES = ["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]
FIELD = {"--mamba-radix-cache-strategy": "mamba_scheduler_strategy", "--cuda-graph-max-bs-decode": "cuda_graph_max_bs",
         "--cuda-graph-backend-decode": "disable_cuda_graph", "--cuda-graph-backend-prefill": "disable_piecewise_cuda_graph"}


def backends(version):
    return ["full", "breakable", "disabled"] + (["tc_piecewise"] if vt(version) < vt("0.5.22") else [])


def _warn(option_string, use):
    # arg_groups/argparse_actions.py:28-29 and 98-108 (0.5.14): logger.warning in yellow, before logging is set up (so
    # Python's last-resort handler writes the bare message to stderr)
    logging.getLogger("sglang.srt.arg_groups.argparse_actions").warning(
        "\033[1;33m'%s' is deprecated and will be removed in a future release. Use '%s' instead.\033[0m", option_string, use)


class DeprecatedAlias(argparse.Action):
    """0.5.14+ DeprecatedAliasStoreAction / DeprecatedStoreTrueAction / DeprecatedStoreConstAction: a warning, then the
    value (or True) stored where the new flag stores it."""

    def __init__(self, option_strings, dest, use=None, **kwargs):
        self.use = use
        super(DeprecatedAlias, self).__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _warn(option_string, self.use)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


class Backend(argparse.Action):
    """--cuda-graph-backend-{decode,prefill}: 'disabled' is what the 0.5.11 option it replaces turned on."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values == "disabled")


def new_arguments(version):
    """(flags, kwargs) of the new flags the table's deprecations name, for ``version``."""
    out, seen = [], set()
    uses = [use for r in TABLE.RELEASES if vt(r["version"]) <= vt(version) for use, _where in r.get("deprecated", {}).values()]
    for use in uses:    # a replacement stays when its old flag is removed (0.5.20)
        for flag, _value in new_flags(use):
            if flag in seen:
                continue
            seen.add(flag)
            if flag == "--mamba-radix-cache-strategy":
                out.append(((flag,), dict(type=str, dest=FIELD[flag], default="auto", choices=STRATEGIES)))
            elif flag == "--cuda-graph-max-bs-decode":
                out.append(((flag,), dict(type=int, dest=FIELD[flag])))
                # its sibling, declared with it (0.5.14 server_args.py:1943, 0.5.20 arg_groups/fields/exec_.py:485): with
                # both, argparse's prefix matching calls the removed --cuda-graph-max-bs "ambiguous", as the real one does
                out.append((("--cuda-graph-max-bs-prefill",), dict(type=int)))
            elif flag in FIELD:
                out.append(((flag,), dict(action=Backend, dest=FIELD[flag], default=False, choices=backends(version))))
    return out


def old_argument(flag, kwargs, version):
    """How ``version`` declares a 0.5.11 flag: None when removed, a deprecated alias of its replacement, or as it was."""
    deprecated, removed = changes(version)
    if flag in removed:
        return None
    if flag not in deprecated:
        return kwargs
    use = deprecated[flag][0]
    new = dict(dest=kwargs.get("dest") or flag[2:].replace("-", "_"), action=DeprecatedAlias, use=use)
    if kwargs.get("action") == "store_true":
        new.update(nargs=0, default=False)
    else:
        new.update({k: v for k, v in kwargs.items() if k in ("type", "default")})
        if flag == "--mamba-scheduler-strategy":
            new["choices"] = STRATEGIES
    return new


def field_name(name, version):
    """A 0.5.11 field's name in ``version``'s ServerArgs: the new flag's, once a release made its flag an alias of a
    renamed one (0.5.14: cuda_graph_max_bs_decode, mamba_radix_cache_strategy; the diagnosis reads them)."""
    for r in TABLE.RELEASES:
        if vt(r["version"]) > vt(version):
            break
        for flag, (use, _where) in r.get("deprecated", {}).items():
            if flag[2:].replace("-", "_") == name and "=" not in use and "{" not in use:
                return use[2:].replace("-", "_")
    return name


def log_line(name, version, **values):
    """The startup line ``name`` (the table's "log": dist_begin, dist_end, mem_baseline, kv_alloc) in the wording of
    ``version``: the last release up to it that worded it (0.5.11's for an older stand-in), None when none writes it yet."""
    found = {}
    for r in TABLE.RELEASES:
        if found and vt(r["version"]) > vt(version):
            break
        found.update(r.get("log", {}))
    return found[name][0] % values if name in found else None
