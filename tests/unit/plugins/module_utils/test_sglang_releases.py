from __future__ import annotations

import importlib.util
import os
import re
import zipfile

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import compat as c
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import sglang_releases as sr

# every release on PyPI from 0.5.11 to 0.5.23 (https://pypi.org/pypi/sglang/json, read 2026-12-05)
PYPI = ["0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16",
        "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
PLACE = re.compile(r"^(server_args\.py|entrypoints/http_server\.py|arg_groups/[a-z_/]+\.py)(:\d+(-\d+)?)?$")
# what the collection passes (sglang_options / sglang_unit) and this table tracks
OURS = ["--mamba-scheduler-strategy", "--cuda-graph-max-bs", "--disable-cuda-graph", "--mem-fraction-static",
        "--max-running-requests", "--chunked-prefill-size", "--context-length", "--tp-size"]


def test_the_table_lists_every_release_in_order():
    assert list(sr.VERSIONS) == PYPI and sr.NEWEST == "0.5.23"
    assert [c.compare(a, b) for a, b in zip(sr.VERSIONS, sr.VERSIONS[1:])] == [-1] * (len(PYPI) - 1)
    dates = [r["date"] for r in sr.RELEASES]
    assert dates == sorted(dates)


@pytest.mark.parametrize("version", PYPI)
def test_each_release_cites_its_wheel(version):
    r = sr.release(version)
    assert PLACE.match(r["health"]) and r["health"].startswith("entrypoints/http_server.py:")
    assert PLACE.match(r["metrics"])
    places = list(r.get("rules", {}).values()) + list(r.get("removed", {}).values())
    places += [where for _use, where in r.get("deprecated", {}).values()]
    assert all(PLACE.match(p) for p in places), places
    assert set(r.get("rules", {})) <= {"memory", "mamba_radix", "speculative"}
    # a post release changed nothing this table tracks
    if ".post" in version:
        assert set(r) == {"version", "date", "health", "metrics"}


@pytest.mark.parametrize("version,deprecated,removed,rules", [
    ("0.5.11", {}, {}, []),
    ("0.5.12", {}, {}, ["mamba_radix", "speculative"]),
    ("0.5.13", {}, {}, ["mamba_radix", "memory", "speculative"]),
    ("0.5.14", {"--mamba-scheduler-strategy": "--mamba-radix-cache-strategy", "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
                "--disable-cuda-graph": "--cuda-graph-backend-{decode,prefill}=disabled",
                "--disable-piecewise-cuda-graph": "--cuda-graph-backend-prefill=disabled"}, {},
     ["mamba_radix", "memory", "speculative"]),
    ("0.5.19", {}, {}, ["mamba_radix", "memory", "speculative"]),
    ("0.5.20", {}, {"--mamba-scheduler-strategy", "--cuda-graph-max-bs", "--disable-piecewise-cuda-graph"}, ["memory", "speculative"]),
    ("0.5.23", {}, {}, ["memory", "speculative"]),
])
def test_rows(version, deprecated, removed, rules):
    r = sr.release(version)
    assert dict((f, use) for f, (use, _w) in r.get("deprecated", {}).items()) == deprecated
    assert set(r.get("removed", {})) == set(removed)
    assert sorted(r.get("rules", {})) == rules


def test_what_an_upgrade_does_to_the_collections_arguments():
    assert sr.flag_changes(OURS, "0.5.13") == []
    assert sr.flag_changes(OURS, "0.5.14") == [
        "--mamba-scheduler-strategy: deprecated in 0.5.14, use --mamba-radix-cache-strategy (server_args.py:6349)",
        "--cuda-graph-max-bs: deprecated in 0.5.14, use --cuda-graph-max-bs-decode (server_args.py:6358)",
        "--disable-cuda-graph: deprecated in 0.5.14, use --cuda-graph-backend-{decode,prefill}=disabled (server_args.py:6375)"]
    got = sr.flag_changes(OURS, "0.5.23")
    assert got[3:] == ["--mamba-scheduler-strategy: removed in 0.5.20 (server_args.py:3919 of the release before)",
                       "--cuda-graph-max-bs: removed in 0.5.20 (server_args.py:3928 of the release before)"]
    # from 0.5.20 on nothing more changes for them; a downgrade's span is empty
    assert sr.flag_changes(OURS, "0.5.23", since="0.5.20") == [] and sr.flag_changes(OURS, "0.5.11", since="0.5.23") == []


def test_rule_changes_over_an_upgrade():
    got = sr.rule_changes("0.5.23")
    assert got["memory"] == ["0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.22",
                             "0.5.23"]
    assert got["mamba_radix"][0] == "0.5.12" and "0.5.20" not in got["mamba_radix"]
    assert sr.rule_changes("0.5.12.post1", since="0.5.12") == {}


def test_an_unknown_version():
    assert sr.release("0.5.24") is None and sr.release("0.5.12.post2") is None
    msg = sr.not_in_table("0.5.24")
    assert "sglang 0.5.24 is not in the compatibility table (newest known: 0.5.23)" in msg
    assert "tests/tools/sglang_release_diff.py" in msg


def test_locks(tmp_path):
    for name in ("sglang-0.5.11-py3.11-x86_64.txt", "sglang-0.5.9-py3.12-x86_64.txt", "sglang-0.5.12.post1-py3.11-x86_64.txt",
                 "sglang-0.5.11-py3.13-aarch64.txt", "README.txt"):
        (tmp_path / name).write_text("")
    assert sr.lock_versions(str(tmp_path)) == ["0.5.9", "0.5.11", "0.5.12.post1"]
    assert sr.lock_versions(str(tmp_path), "aarch64") == ["0.5.11"]
    assert sr.no_lock("0.5.24", "3.11", sr.lock_versions(str(tmp_path), "x86_64")) == (
        "no lock for SGLang 0.5.24 on Python 3.11: the collection has locks for versions 0.5.9, 0.5.11, 0.5.12.post1; "
        "make one with roles/sglang_install/files/locks/regenerate.sh 0.5.24 3.11")
    assert "locks for versions none;" in sr.no_lock("0.5.24", "3.12", [])


def test_the_shipped_locks():
    """The role's own locks: the pinned default and the table's newest, each for Python 3.11 to 3.13."""
    here = os.path.dirname(os.path.abspath(__file__))
    locks = os.path.join(here, "..", "..", "..", "..", "roles", "sglang_install", "files", "locks")
    assert sr.lock_versions(locks, "x86_64")[-1] == sr.NEWEST
    for py in ("3.11", "3.12", "3.13"):
        with open(os.path.join(locks, "sglang-%s-py%s-x86_64.txt" % (sr.NEWEST, py))) as f:
            text = f.read()
        assert re.search(r"^sglang==%s \\\n    --hash=sha256:[0-9a-f]{64}" % re.escape(sr.NEWEST), text, re.M)
        assert re.search(r"^nvidia-cuda-nvcc==", text, re.M)


OLD_ARGS = """
class ServerArgs:
    mem_fraction_static: Optional[float] = None

    def _handle_gpu_memory_settings(self, gpu_mem):
        self.mem_fraction_static = 0.9

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--mem-fraction-static", type=float)
        parser.add_argument("--mamba-scheduler-strategy", type=str)
        parser.add_argument("--enable-metrics", action="store_true")
"""
# 0.5.14's style: fields with A[type, help | Arg(...)], a deprecated alias, one argument gone, the memory rule changed
NEW_ARGS = """
class ServerArgs:
    mem_fraction_static: A[Optional[float], "The fraction."] = None
    mamba_radix_cache_strategy: A[str, Arg(help="x", aliases=["--mamba-strategy"])] = "auto"
    hidden: A[bool, Arg(no_cli=True)] = False

    def _handle_gpu_memory_settings(self, gpu_mem):
        self.mem_fraction_static = 0.85

    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--mamba-scheduler-strategy", action=DeprecatedAliasStoreAction,
                            new_flag="--mamba-radix-cache-strategy", help="Deprecated alias.")
"""
HTTP = '@app.get("/health")\n@app.get("/health_generate")\nasync def health_generate():\n    pass\n'


def _wheel(path, server_args):
    with zipfile.ZipFile(str(path), "w") as z:
        z.writestr("sglang/srt/server_args.py", server_args)
        z.writestr("sglang/srt/entrypoints/http_server.py", HTTP)
    return str(path)


def test_the_release_diff_tool(tmp_path):
    """tests/tools/sglang_release_diff.py, which made the table, on two made-up wheels."""
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools", "sglang_release_diff.py")
    spec = importlib.util.spec_from_file_location("sglang_release_diff", tool)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    old = mod.extract(_wheel(tmp_path / "sglang-0.5.13-cp311-cp311-manylinux_2_34_x86_64.whl", OLD_ARGS))
    new = mod.extract(_wheel(tmp_path / "sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl", NEW_ARGS))
    d = mod.diff(old, new)
    assert d["deprecated"] == {"--mamba-scheduler-strategy": ["--mamba-radix-cache-strategy", "server_args.py:13"]}
    assert d["removed"] == {"--enable-metrics": "server_args.py:12"}
    assert d["added_count"] == 2 and d["added"] == {}  # --mamba-radix-cache-strategy, --mamba-strategy; no_cli is none
    assert d["rules"] == {"memory": "server_args.py:7"} and d["defaults"] == {}
    assert d["routes"] == {"/health": "entrypoints/http_server.py:1", "/health_generate": "entrypoints/http_server.py:2"}
    assert mod.sort_key(mod.version_of("/x/sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl")) == (0, 5, 12, 1)
