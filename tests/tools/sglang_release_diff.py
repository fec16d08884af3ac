# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What changed between SGLang releases, read from the wheels' own source (not release notes).

For each wheel (sorted by version) it reads sglang/srt/server_args.py and sglang/srt/entrypoints/http_server.py and
prints, against the previous wheel: the server arguments added, removed or deprecated (renamed when the deprecation's
help says "use --X"), the dataclass defaults and the body digests of the methods that compute mem_fraction_static,
max_running_requests, chunked_prefill_size and context_length, the mamba / radix and speculative rules, the health
routes and the metrics flag; each with the wheel's file:line. The result is what plugins/module_utils/container/sglang_releases.py
holds (the collection's flags in full, other added flags as a count).

    .venv/bin/python tests/tools/sglang_release_diff.py /tmp/wheels/sglang-0.5.11-*.whl /tmp/wheels/v*/sglang-*.whl

Get a wheel with `pip download --no-deps --only-binary :all: --python-version 3.11 sglang==X` (any CPython wheel:
the Python sources are the same).
"""

import ast
import hashlib
import json
import re
import sys
import zipfile

SERVER_ARGS = "sglang/srt/server_args.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
# the arguments kpro.gpu_serving passes or reads (sglang_options, sglang_unit, sglang_plan): listed in full when they change
COLLECTION_FLAGS = {
    "--api-key", "--attention-backend", "--chunked-prefill-size", "--context-length", "--cuda-graph-max-bs",
    "--disable-cuda-graph", "--disable-custom-all-reduce", "--disable-radix-cache", "--dist-init-addr", "--dtype",
    "--enable-metrics", "--enable-p2p-check", "--enable-torch-compile", "--host", "--kv-cache-dtype",
    "--mamba-scheduler-strategy", "--mamba-ssm-dtype", "--max-running-requests", "--max-total-tokens",
    "--mem-fraction-static", "--model-impl", "--model-loader-extra-config", "--model-path", "--nccl-port", "--nnodes",
    "--node-rank", "--port", "--quantization", "--reasoning-parser", "--served-model-name", "--speculative-algorithm",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-num-steps", "--tp-size",
}
DEFAULT_FIELDS = ("mem_fraction_static", "max_running_requests", "chunked_prefill_size", "context_length")
# the rules the plan and the options follow (a changed body = a changed rule): the ServerArgs method up to 0.5.19, the
# arg_groups hook module from 0.5.20
RULES = {
    "memory": ("_handle_gpu_memory_settings", "arg_groups/memory_hook.py"),
    "mamba_radix": ("_handle_mamba_radix_cache", "arg_groups/mamba_hook.py"),
    "speculative": ("_handle_speculative_decoding", "arg_groups/speculative_hook.py"),
}
ROUTES = ("/health", "/health_generate", "/metrics")


def version_of(path):
    m = re.search(r"sglang-([0-9][^-]*)-", path.rsplit("/", 1)[-1])
    return m.group(1)


def sort_key(version):
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$", version)
    return tuple(int(x or -1) for x in m.groups())


def _string_args(call):
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _kw(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _deprecation(action, new_flag, hlp):
    """(deprecated, replacement) of an argument: DeprecatedAction (refused, help says what to use) or, from 0.5.14,
    DeprecatedAliasStoreAction / DeprecatedStoreTrueAction (still work, stored into new_flag's field)."""
    if not getattr(action, "id", "").startswith("Deprecated"):
        return False, None
    if isinstance(new_flag, ast.Constant):
        return True, new_flag.value
    m = re.search(r"use (--[a-z0-9-]+)", ast.unparse(hlp) if hlp is not None else "", re.I)
    return True, m.group(1) if m else None


def _annotated_flags(cls, where):
    """From 0.5.14 most arguments are fields ``name: A[type, "help" | Arg(...)]`` (of ServerArgs; from 0.5.20 of the
    classes in arg_groups/fields/), added by arg_groups/arg_utils.py add_cli_args_from_dataclass as --name-with-dashes
    (or Arg's cli_name) plus Arg's aliases."""
    out = {}
    for node in cls.body:
        ann = getattr(node, "annotation", None)
        if not (isinstance(node, ast.AnnAssign) and isinstance(ann, ast.Subscript)
                and getattr(ann.value, "id", "") in ("A", "Annotated") and isinstance(ann.slice, ast.Tuple)):
            continue
        meta = ann.slice.elts[1:]
        arg = next((m for m in meta if isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg"), None)
        if arg is None and not any(isinstance(m, ast.Constant) and isinstance(m.value, str) for m in meta):
            continue
        no_cli, cli, aliases = (_kw(arg, k) if arg is not None else None for k in ("no_cli", "cli_name", "aliases"))
        if getattr(no_cli, "value", False):
            continue
        names = [cli.value if isinstance(cli, ast.Constant) else "--" + node.target.id.replace("_", "-")]
        names += [a.value for a in getattr(aliases, "elts", []) if isinstance(a, ast.Constant)]
        dep = _deprecation(*(_kw(arg, k) for k in ("action", "new_flag", "help"))) if arg is not None else (False, None)
        for flag in names:
            out[flag] = ["%s:%d" % (where, node.lineno), dep[0], dep[1]]
    return out


def _flags(cls):
    """{flag: [file:line, deprecated, replacement]} of add_cli_args' parser.add_argument calls."""
    out = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
                    dep = _deprecation(*(_kw(call, k) for k in ("action", "new_flag", "help")))
                    for flag in (f for f in _string_args(call) if f.startswith("--")):
                        out[flag] = ["server_args.py:%d" % call.lineno, dep[0], dep[1]]
    return out


def _digest(node):
    return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:12]


def _server_args(files):
    """files: {path under sglang/srt/: source}. Flags, the watched fields' defaults and the rules' digests."""
    flags, defaults, rules = {}, {}, {}
    for path, source in sorted(files.items()):
        tree = ast.parse(source)
        if path.startswith("arg_groups/") and path.endswith("_hook.py"):
            for rule, (_method, hook) in RULES.items():
                if path == hook:
                    rules[rule] = [_digest(tree), path + ":1"]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            if cls.name == "ServerArgs" or path.startswith("arg_groups/fields/"):
                flags.update(_annotated_flags(cls, path))
            if cls.name == "ServerArgs":
                flags.update(_flags(cls))
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") in DEFAULT_FIELDS:
                    value = ast.unparse(node.value) if node.value else None
                    defaults[node.target.id] = [value, "%s:%d" % (path, node.lineno)]
                for rule, (method, _hook) in RULES.items():
                    if isinstance(node, ast.FunctionDef) and node.name == method:
                        rules[rule] = [_digest(node), "%s:%d" % (path, node.lineno)]
    return {"flags": flags, "defaults": defaults, "methods": rules}


def _routes(source):
    out = {}
    for n, line in enumerate(source.splitlines(), 1):
        m = re.search(r'@app\.(?:get|post|api_route)\("(/[a-z_]+)"', line)
        if m and m.group(1) in ROUTES:
            out.setdefault(m.group(1), n)
        if "/metrics" not in out and re.search(r"add_prometheus_middleware\(app\)", line):
            out["/metrics"] = n  # the Prometheus app is mounted at /metrics when --enable-metrics is set
    return out


def extract(path):
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n == SERVER_ARGS or re.match(r"sglang/srt/arg_groups/[a-z_/]+\.py$", n)]
        info = _server_args(dict((n[len("sglang/srt/"):], z.read(n).decode()) for n in names))
        info["routes"] = dict((k, "entrypoints/http_server.py:%d" % v) for k, v in _routes(z.read(HTTP_SERVER).decode()).items())
    return info


def diff(old, new):
    """The changes from old to new (both extract() results): each with its file:line (under sglang/srt/) in new, a
    removed argument with its file:line in old."""
    of, nf = old["flags"], new["flags"]
    live = set(k for k, v in nf.items() if not v[1])
    added = sorted(live - set(of))
    return {
        "added": dict((f, nf[f][0]) for f in added if f in COLLECTION_FLAGS),
        "added_count": len(added),
        "removed": dict((f, of[f][0]) for f in sorted(set(of) - set(nf))),
        "deprecated": dict((f, [nf[f][2], nf[f][0]]) for f in sorted(set(of) & set(nf)) if nf[f][1] and not of[f][1]),
        "defaults": dict((k, v) for k, v in new["defaults"].items() if old["defaults"].get(k, [None])[0] != v[0]),
        "rules": dict((k, v[1]) for k, v in new["methods"].items() if old["methods"].get(k, [None])[0] != v[0]),
        "routes_gone": sorted(set(old["routes"]) - set(new["routes"])),
        "routes": new["routes"],
    }


def main(paths):
    wheels = sorted(paths, key=lambda p: sort_key(version_of(p)))
    prev = None
    report = {}
    for path in wheels:
        cur = extract(path)
        version = version_of(path)
        if prev is None:
            report[version] = {"base": True, "routes": cur["routes"],
                               "metrics_flag": cur["flags"].get("--enable-metrics", [None])[0],
                               "defaults": cur["defaults"], "methods": {k: v[1] for k, v in cur["methods"].items()}}
        else:
            report[version] = dict(diff(prev, cur), metrics_flag=cur["flags"].get("--enable-metrics", [None])[0])
        prev = cur
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
