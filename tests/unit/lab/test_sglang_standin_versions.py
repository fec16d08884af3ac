"""The SGLang stand-in speaks the version it is installed as: its parser takes and refuses what the release table
(plugins/module_utils/container/sglang_releases.py) says each release did to the collection's flags, its server_args
line has each release's form, and an output drill can name the version it acts on."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "tests", "lab", "sglang_standin"))
from sglang.srt._kpro_lab import args as sargs  # noqa: E402
from sglang.srt._kpro_lab import generate, releases  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import sglang_releases  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log, sglang_options  # noqa: E402

REMOVED = [(flag, r["version"]) for r in sglang_releases.RELEASES for flag in r.get("removed", {})]
DEPRECATED = [(flag, use, r["version"]) for r in sglang_releases.RELEASES for flag, (use, _w) in r.get("deprecated", {}).items()]
VALUE = {"--mamba-scheduler-strategy": ["extra_buffer"], "--cuda-graph-max-bs": ["8"]}


def parse(version, argv, capsys=None):
    """(namespace or None, exit status, stderr) of the stand-in's parser as ``version`` on ``--model-path m`` + argv."""
    p = sargs.add_cli_args(argparse.ArgumentParser(prog="sglang serve"), version)
    try:
        ns, code = p.parse_args(["--model-path", "m"] + argv), 0
    except SystemExit as e:
        ns, code = None, e.code
    return ns, code, capsys.readouterr().err if capsys else ""


def test_the_table_is_the_collections():
    assert releases.TABLE.RELEASES == sglang_releases.RELEASES
    assert REMOVED and DEPRECATED


@pytest.mark.parametrize("flag,removed_in", REMOVED)
def test_a_removed_flag_is_refused_from_its_release_as_argparse_does(flag, removed_in, capsys):
    before = sglang_releases.VERSIONS[sglang_releases.VERSIONS.index(removed_in) - 1]
    for version in (before, removed_in, sglang_releases.NEWEST):
        ns, code, err = parse(version, [flag] + VALUE.get(flag, []), capsys)
        if version == before:
            assert code == 0 and ns is not None, (version, err)
        else:
            # argparse's prefix match: --cuda-graph-max-bs is the start of the -decode and -prefill flags
            refusal = ("ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
                       if flag == "--cuda-graph-max-bs" else "unrecognized arguments: %s" % " ".join([flag] + VALUE.get(flag, [])))
            assert code == 2 and err.splitlines()[-1] == "sglang serve: error: " + refusal, (version, err)


@pytest.mark.parametrize("flag,use,since", DEPRECATED)
def test_a_deprecated_flag_warns_as_the_release_does_and_still_works(flag, use, since, capsys, caplog):
    ns, code, err = parse("0.5.11", [flag] + VALUE.get(flag, []), capsys)
    assert code == 0 and "deprecated" not in caplog.text
    ns, code, err = parse(since, [flag] + VALUE.get(flag, []), capsys)
    assert code == 0, err
    # arg_groups/argparse_actions.py:98-108 of 0.5.14 (a logger warning: pytest's caplog holds it)
    assert "'%s' is deprecated and will be removed in a future release. Use '%s' instead." % (flag, use) in caplog.text
    dest = {"--mamba-scheduler-strategy": "mamba_scheduler_strategy", "--cuda-graph-max-bs": "cuda_graph_max_bs"}.get(flag)
    if dest:
        assert getattr(ns, dest) == (int if dest == "cuda_graph_max_bs" else str)(VALUE[flag][0])


@pytest.mark.parametrize("name", sorted(sglang_options.RENAMED))
def test_the_flag_the_collection_renders_for_a_version_is_one_its_parser_takes(name, capsys):
    """sglang_options.spelling gives the flag of each release; the stand-in as that release parses it (and 0.5.11's
    own flag is refused once the release removed it)."""
    value = {"mamba_scheduler_strategy": "extra_buffer", "cuda_graph_max_bs": "8"}.get(name)
    for version in sglang_releases.VERSIONS:
        flag = sglang_options.flag(name, version)
        argv = [flag] + ([value] if value and "=" not in flag else [])
        ns, code, err = parse(version, argv, capsys)
        assert code == 0, (version, flag, err)
        modelled = {"mamba_scheduler_strategy": "extra_buffer", "cuda_graph_max_bs": 8, "disable_piecewise_cuda_graph": True}
        assert getattr(ns, name) == modelled[name], (version, flag)


def test_new_flags_are_refused_before_their_release_and_take_that_releases_choices(capsys):
    assert parse("0.5.13.post1", ["--cuda-graph-max-bs-decode", "8"], capsys)[1] == 2
    assert parse("0.5.14", ["--cuda-graph-backend-decode", "tc_piecewise"], capsys)[1] == 0
    assert parse("0.5.21", ["--cuda-graph-backend-decode", "tc_piecewise"], capsys)[1] == 0
    _ns, code, err = parse("0.5.22", ["--cuda-graph-backend-decode", "tc_piecewise"], capsys)
    assert code == 2 and "invalid choice: 'tc_piecewise' (choose from 'full', 'breakable', 'disabled')" in err
    ns, code, _err = parse("0.5.23", ["--cuda-graph-backend-decode=disabled"], capsys)
    assert code == 0 and ns.disable_cuda_graph is True


def _args(version):
    ns = parse(version, ["--cuda-graph-max-bs-decode" if version != "0.5.11" else "--cuda-graph-max-bs", "24"])[0]
    return sargs.ServerArgs(ns)


def test_server_args_line_has_each_releases_form_and_names():
    old, renamed, newest = _args("0.5.11").log_text("0.5.11"), _args("0.5.14").log_text("0.5.14"), _args(NEW).log_text(NEW)
    assert old.startswith("server_args=ServerArgs(model_path='m', ") and "cuda_graph_max_bs=24" in old
    assert "cuda_graph_max_bs_decode=24" in renamed and "mamba_radix_cache_strategy='auto'" in renamed
    # 0.5.19+: the resolved dict (engine.py:1098 of 0.5.19)
    assert newest.startswith("server_args={'model_path': 'm', ") and "'cuda_graph_max_bs_decode': 24" in newest
    # the diagnosis reads the renamed field of the repr form (the CUDA graph remedy's flag)
    assert sglang_log.parse_server_args(renamed[len("server_args="):])["cuda_graph_max_bs_decode"] == 24


NEW = sglang_releases.NEWEST


def test_an_output_drill_can_name_the_version_it_acts_on(monkeypatch):
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "wrong_answer_tp:%s" % NEW)
    monkeypatch.setattr(generate, "__version__", NEW)
    assert generate.live_modes(2) == {"wrong_answer_tp"}
    monkeypatch.setattr(generate, "__version__", "0.5.11")
    assert generate.live_modes(2) == set()
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "wrong_answer_tp")
    assert generate.live_modes(2) == {"wrong_answer_tp"}


@pytest.mark.parametrize("version,begin,kv", [
    ("0.5.11", "Init torch distributed begin.", "KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB"),
    ("0.5.13", "Init torch distributed begin.", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 1.00 GB"),
    ("0.5.20", "Init torch distributed begin.", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 1.00 GB"),
    (NEW, "Init parallel begin.", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 1.00 GB"),
])
def test_the_startup_lines_have_each_releases_wording_and_the_diagnosis_reads_them(version, begin, kv, monkeypatch):
    """0.5.13 added the KV pool's dtype (memory_pool.py:819), 0.5.21 renamed the distributed init lines (bootstrap.py:118,
    :174) and moved their memory figure to "Memory baseline taken." (:203-206): the stand-in writes what its release does."""
    from sglang.srt._kpro_lab import scheduler
    monkeypatch.setattr(sys.modules["sglang.version"], "__version__", version)
    lines = [scheduler._line("dist_begin"), scheduler._line("dist_end", elapsed=0.5, mem=0.25),
             scheduler._line("mem_baseline", mem=0.25), scheduler._line("kv_alloc", dtype="torch.bfloat16", tokens=1000, k=1, v=1)]
    assert lines[0] == begin and lines[3].startswith(kv)
    assert (lines[2] is None) == (version != NEW) and ("mem usage=0.25 GB" in lines[1]) == (version != NEW)
    log = "".join("[2026-10-30 10:00:0%d TP0] %s\n" % (i, line) for i, line in enumerate(lines) if line)
    res = sglang_log.diagnose(log, exit_status=1, process_alive=False)
    assert res["facts"]["kv_tokens"] == 1000 and res["facts"]["gpu_touched_per_log"] is True
    assert sglang_log.parse_log(log)["milestones"]["dist_end"][0]["data"]["elapsed_s"] == 0.5


def test_the_kv_dtype_is_printed_as_the_real_pool_does():
    from sglang.srt._kpro_lab import scheduler
    assert scheduler._torch_dtype(argparse.Namespace(kv_cache_dtype="auto", model_dtype="bfloat16")) == "torch.bfloat16"
    assert scheduler._torch_dtype(argparse.Namespace(kv_cache_dtype="fp8_e4m3", model_dtype="bfloat16")) == "torch.float8_e4m3fn"
