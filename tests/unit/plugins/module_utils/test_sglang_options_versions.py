# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 35: the option table renders and checks the flags of the INSTALLED SGLang (0.5.20 removed
--mamba-scheduler-strategy, --cuda-graph-max-bs and --disable-piecewise-cuda-graph), and remedies name them."""
from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import sglang_releases as rel
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_options as so
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan, sglang_restart as sr, sglang_serve
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from test_sglang_serve import FakeModule

OPTS = {"model_path": "/m", "tp_size": 2, "mamba_scheduler_strategy": "extra_buffer", "cuda_graph_max_bs": 16,
        "disable_piecewise_cuda_graph": True}
OLD = ["--mamba-scheduler-strategy", "extra_buffer", "--cuda-graph-max-bs", "16", "--disable-piecewise-cuda-graph"]
NEW = ["--mamba-radix-cache-strategy", "extra_buffer", "--cuda-graph-max-bs-decode", "16", "--cuda-graph-backend-prefill=disabled"]
FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "qwen3.6-27b")


def _tail(argv):
    return argv[argv.index("--tp-size") + 2:]


@pytest.mark.parametrize("version", [None, "0.5.11", "0.5.13.post1", "not-a-version"])
def test_up_to_0513_the_old_flags(version):
    assert sorted(_tail(su.render_flags(OPTS, version))) == sorted(OLD)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.19", "0.5.20", "0.5.23", "0.5.24.dev0"])
def test_from_0514_the_new_flags(version):
    assert sorted(_tail(su.render_flags(OPTS, version))) == sorted(NEW)


def test_no_release_in_the_table_gets_a_flag_it_removed():
    """Cross-check with the release table: a flag removed in a release is never rendered for it or a later one."""
    removed = set()
    for r in rel.RELEASES:
        removed |= set(r.get("removed", {}))
        rendered = set(w.split("=")[0] for w in su.render_flags(OPTS, r["version"]) if w.startswith("--"))
        assert not rendered & removed, r["version"]


def test_choices_follow_the_version():
    lazy = {"mamba_scheduler_strategy": "extra_buffer_lazy"}
    (key, msg), = so.problems(lazy)
    assert key == "mamba_scheduler_strategy" and "SGLang 0.5.11's choices: auto, no_buffer, extra_buffer" in msg
    assert so.problems(lazy, "0.5.13") == [] and so.problems(lazy, "0.5.23") == []
    (key, msg), = so.problems({"mamba_scheduler_strategy": "lazy"}, "0.5.23")
    assert msg == ("mamba_scheduler_strategy='lazy' is not one of SGLang 0.5.23's choices (its flag "
                   "--mamba-radix-cache-strategy): auto, no_buffer, extra_buffer, extra_buffer_lazy")


def test_a_refused_value_and_an_old_flag_are_refused_before_the_stop():
    flags_0523 = ["--model-path", "--tp-size", "--mamba-radix-cache-strategy", "--cuda-graph-max-bs-decode",
                  "--cuda-graph-backend-prefill"]
    assert sr.setting_problems(OPTS, flags_0523, 2, lambda port: False, version="0.5.23") == ([], "not_started")
    # the same options rendered for 0.5.11 against 0.5.23's parser: each old flag named, with the new one
    problems, _phase = sr.setting_problems(OPTS, flags_0523, 2, lambda port: False)
    assert "option mamba_scheduler_strategy: the installed SGLang has no --mamba-scheduler-strategy" in problems
    assert "option cuda_graph_max_bs: the installed SGLang has no --cuda-graph-max-bs (did you mean cuda_graph_max_bs_decode?)" \
        in problems
    refusal = sr.settings_refusal(*sr.setting_problems(dict(OPTS, mamba_scheduler_strategy="lazy"), flags_0523, 2,
                                                       lambda port: False, version="0.5.23"))
    assert refusal.phase == "not_started" and "--mamba-radix-cache-strategy" in refusal.msg


def _venv(tmp_path, version):
    os.makedirs(str(tmp_path / "opt/sglang/venv/lib/python3.11/site-packages" / ("sglang-%s.dist-info" % version)))


@pytest.mark.parametrize("version,want", [("0.5.11", OLD), ("0.5.23", NEW)])
def test_the_server_renders_the_venvs_version(tmp_path, version, want):
    _venv(tmp_path, version)
    server = sglang_serve.Server(FakeModule(tmp_path, options=dict(OPTS)))
    server.render()
    line = server.result["exec_start"]
    assert all(w in line.split() for w in want) and server.version == version


def test_without_a_venv_the_gates_version_then_0511(tmp_path):
    server = sglang_serve.Server(FakeModule(tmp_path, options=dict(OPTS), look={"sglang_version": "0.5.23"}))
    server.render()
    assert "--cuda-graph-max-bs-decode" in server.result["exec_start"].split()
    server = sglang_serve.Server(FakeModule(tmp_path, options=dict(OPTS)))
    server.render()
    assert server.version is None and "--cuda-graph-max-bs" in server.result["exec_start"].split()


# 0.5.23 is not here: from 0.5.14 SGLang refuses neither configuration (sglang_plan_versions "mamba_auto_extra_buffer",
# test_sglang_plan_versions.py), so no remedy names --mamba-radix-cache-strategy
@pytest.mark.parametrize("version,flag", [(None, "--mamba-scheduler-strategy"), ("0.5.13.post1", "--mamba-scheduler-strategy")])
def test_the_plans_remedy_names_the_versions_flag(version, flag):
    seed = dict(tp=2, context_length=65536, mem_fraction_static=0.85, speculative_algorithm="NEXTN", speculative_num_steps=3,
                speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    p = sglang_plan.plan(os.path.join(FIX, "config.json"), os.path.join(FIX, "model.safetensors.index.json"), seed,
                         gpu_total_mib=[49140, 49140], sglang_version=version)
    assert p["suggestions"][1]["flag"] == flag and "%s extra_buffer" % flag in p["remedy"]
