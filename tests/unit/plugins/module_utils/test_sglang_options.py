# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option table (issue 29): every option that reaches ExecStart has a row saying what the memory plan does with it,
the rows the plan computes with do change its figures, and the unit, the plan and the role read the same table."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest
import yaml

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_options as so
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_plan, sglang_serve
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
ROLE = os.path.join(TOP, "roles", "sglang_server")
FIXTURE = os.path.join(TOP, "tests", "unit", "fixtures", "qwen3.6-27b")
MEMORY = (so.SIZED, so.GPUS, so.NONE, so.UNMODELLED)


def _yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def _inventory_options(node):
    """Every key of every sglang_server_options dict in an inventory file."""
    if isinstance(node, dict):
        found = set(node["sglang_server_options"]) if isinstance(node.get("sglang_server_options"), dict) else set()
        return found.union(*[_inventory_options(v) for v in node.values()])
    if isinstance(node, list):
        return set().union(*[_inventory_options(v) for v in node])
    return set()


def collection_options():
    """The options the collection itself puts in ExecStart or documents: the role's defaults and argument spec, the
    well-known order, the inventories."""
    names = set(_yaml(os.path.join(ROLE, "defaults", "main.yml"))["sglang_server_options_defaults"])
    spec = _yaml(os.path.join(ROLE, "meta", "argument_specs.yml"))["argument_specs"]["main"]["options"]
    names |= set(spec["sglang_server_options_defaults"]["options"])
    names |= set(su.FLAG_ORDER)
    for path in glob.glob(os.path.join(TOP, "inventories", "**", "*.yml"), recursive=True):
        names |= _inventory_options(_yaml(path))
    return sorted(n for n in names if not (n in so.ROWS and so.ROWS[n].memory == so.REFUSED))


def unaccounted(names):
    """The options of ``names`` whose flag reaches ExecStart while the table does not say what the plan does with it."""
    options = dict((n, so.ROWS[n].example if n in so.ROWS and so.ROWS[n].example is not None else
                    (["--x"] if n == "extra" else "x")) for n in names)
    flags = [w[2:].replace("-", "_") for w in su.render_flags(options) if w.startswith("--") and w != "--x"]
    flags += ["extra"] if "extra" in names else []
    return [n for n in flags if n not in so.ROWS or so.ROWS[n].memory not in MEMORY or not so.ROWS[n].why]


def test_every_option_reaching_execstart_has_a_row_saying_what_the_plan_does():
    names = collection_options()
    assert {"tp_size", "pp_size", "max_total_tokens", "disable_overlap_schedule", "reasoning_parser", "port"} <= set(names) | set(so.ROWS)
    assert unaccounted(names) == []
    assert unaccounted([n for n in so.ROWS if so.ROWS[n].memory != so.REFUSED]) == []
    # the check fails for a flag without a row (what an inventory may add: the serve stage then warns, below)
    assert unaccounted(names + ["enable_made_up_thing"]) == ["enable_made_up_thing"]


def test_the_plan_reads_exactly_the_sized_rows_and_their_defaults():
    sized = set(so.names(so.SIZED))
    assert {"pp_size", "disable_overlap_schedule", "max_total_tokens"} <= sized
    assert set(su.PLAN_OPTIONS) == sized
    assert set(sglang_plan.PLAN_OPTIONS) == (sized - {"tp_size"}) | {"tp", "context_overhead_mib"}
    for name in sized - {"tp_size"}:
        assert sglang_plan.DEFAULTS[name] == so.ROWS[name].default, name
    every = dict((n, so.ROWS[n].example) for n in so.ROWS if so.ROWS[n].example is not None)
    assert set(su.plan_options(every)) == set(n for n in sized if n in every)


def test_unplanned_options_are_named_by_the_serve_stage():
    msgs = sglang_serve.unplanned_warnings({"tp_size": 2, "enable_made_up_thing": True, "quantization": "fp8", "extra": ["--a"],
                                            "disable_foo": False, "bar": None})
    assert msgs[0].startswith("the memory plan does not know whether option(s) enable_made_up_thing change GPU memory")
    assert [m.split(":")[0] for m in msgs[1:]] == ["the memory plan does not model option extra",
                                                   "the memory plan does not model option quantization"]
    assert sglang_serve.unplanned_warnings({"tp_size": 2, "pp_size": 2, "reasoning_parser": "qwen3"}) == []


# Per row the plan computes with: (the options it needs around it, the value tried when the table's example is not one
# that makes a difference on the base below). A new "sized" row needs an entry only when its example changes nothing here.
BASE = {"tp_size": 2, "context_length": 32768}
TRIED = {
    "tp_size": ({}, 4), "dtype": ({}, "float32"), "chunked_prefill_size": ({}, 8192),
    "disable_overlap_schedule": ({"mamba_scheduler_strategy": "extra_buffer", "max_mamba_cache_size": 40}, None),
    "mamba_scheduler_strategy": ({"max_mamba_cache_size": 40}, None),
    "disable_piecewise_cuda_graph": ({"_text_only": True}, None), "enable_torch_compile": ({"_text_only": True}, None),
    "speculative_num_steps": ({"speculative_algorithm": "EAGLE", "disable_radix_cache": True}, 5),
    "speculative_eagle_topk": ({"speculative_algorithm": "EAGLE", "disable_radix_cache": True, "speculative_num_steps": 3,
                                "speculative_num_draft_tokens": 8}, None),
    "speculative_num_draft_tokens": ({"speculative_algorithm": "EAGLE", "disable_radix_cache": True, "speculative_num_steps": 3,
                                      "speculative_eagle_topk": 2}, 8),
    "node_rank": ({"nnodes": 2, "dist_init_addr": "192.0.2.1:20000"}, None),
}


def _figures(context, **options):
    with open(os.path.join(FIXTURE, "config.json")) as f:
        config = json.load(f)
    if context.get("_text_only"):
        config = copy.deepcopy(config)
        config.pop("vision_config")     # piecewise CUDA graphs are on only for a model without a vision tower
    opts = dict(BASE, **dict((k, v) for k, v in context.items() if not k.startswith("_")))
    opts.update(options)
    r = sglang_plan.plan(config, os.path.join(FIXTURE, "model.safetensors.index.json"), su.plan_options(opts),
                         gpu_total_mib=[49140, 49140])
    return (r["per_gpu"], r["max_running_requests"], r["context_length"], r["fits"], r["phase"], r.get("node"),
            r["options"]["mem_fraction_static"])


@pytest.mark.parametrize("name", so.names(so.SIZED))
def test_each_sized_row_changes_the_plans_figures(name):
    context, value = TRIED.get(name, ({}, None))
    value = so.ROWS[name].example if value is None else value
    assert value is not None, "row %s: give it an example" % name
    assert _figures(context, **{name: value}) != _figures(context), "%s=%r changes no figure of the plan" % (name, value)


def test_pp_size_splits_the_layers_and_max_total_tokens_caps_the_pool():
    one, two = _figures({}, tp_size=1)[0], _figures({}, tp_size=1, pp_size=2)[0]
    assert two["weights_mib"] < one["weights_mib"] * 0.52 and two["kv_cell_bytes"] == one["kv_cell_bytes"] // 2
    capped = _figures({}, max_total_tokens=100000)[0]
    assert capped["kv_tokens"] == 100000 and capped["kv_capacity_tokens"] == _figures({})[0]["kv_tokens"] > 100000
    assert sglang_plan.pp_stages(65, 2) == [(0, 32), (32, 65)] and sglang_plan.pp_stages(64, 3) == [(0, 21), (21, 42), (42, 64)]


def test_the_roles_argument_spec_types_the_options_as_the_table_does():
    spec = _yaml(os.path.join(ROLE, "meta", "argument_specs.yml"))["argument_specs"]["main"]["options"]
    for name, entry in spec["sglang_server_options_defaults"]["options"].items():
        assert entry["type"] == so.ROWS[name].type, name
    for name, value in _yaml(os.path.join(ROLE, "defaults", "main.yml"))["sglang_server_options_defaults"].items():
        assert name in so.ROWS and so.ROWS[name].memory != so.REFUSED, name
        if not isinstance(value, str) or "{{" not in value:
            assert so.problems({name: value}) == [], (name, value)


def test_problems_follow_the_table():
    got = dict(so.problems({"tp_size": True, "pp_size": 0, "disable_radix_cache": "yes", "mamba_ssm_dtype": "fp8", "extra": "--a",
                            "max_total_tokens": "64k", "port": 30000, "context_length": "32768", "disable_cuda_graph": False,
                            "unknown_thing": 3, "api_key": "k", "served_model_name": ["a"]}))
    assert sorted(got) == ["disable_radix_cache", "extra", "mamba_ssm_dtype", "max_total_tokens", "pp_size", "served_model_name",
                           "tp_size"]
    assert got["pp_size"] == "pp_size=0 is out of range; give a positive whole number, e.g. 2"
    assert got["disable_radix_cache"].startswith("disable_radix_cache='yes' is not true or false")
    assert got["mamba_ssm_dtype"] == "mamba_ssm_dtype='fp8' is not one of SGLang 0.5.11's choices: float32, bfloat16, float16"
    assert got["max_total_tokens"].startswith("max_total_tokens='64k' is not a number")
    # SGLang refuses pipeline parallelism with speculative decoding (server_args.py:6786-6789): before the server is touched
    assert [k for k, _m in su.range_problems({"pp_size": 2, "speculative_algorithm": "EAGLE"})] == ["pp_size"]


def test_execstart_order_is_the_one_running_servers_have():
    """A changed order changes every unit's fingerprint: every running server would restart on upgrade."""
    assert su.FLAG_ORDER == (
        "model_path", "tokenizer_path", "served_model_name", "revision", "trust_remote_code", "dtype", "quantization",
        "kv_cache_dtype", "tp_size", "dp_size", "pp_size", "context_length", "mem_fraction_static", "max_running_requests",
        "max_total_tokens", "chunked_prefill_size", "max_mamba_cache_size", "mamba_ssm_dtype", "disable_radix_cache",
        "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
        "cuda_graph_max_bs", "disable_cuda_graph", "disable_custom_all_reduce", "nnodes", "node_rank", "dist_init_addr",
        "host", "port", "api_key")
    assert su.render_flags({"reasoning_parser": "qwen3", "port": 1, "tp_size": 2, "pp_size": 2})[:4] == ["--tp-size", "2", "--pp-size", "2"]
