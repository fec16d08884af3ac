# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve stage's rollback wiring, resolved by Ansible itself (as test_facts_once does): no lab, no module runs.

Each host is a scenario; the play loads the sglang_server role with `when: false` (its defaults and vars load, nothing
runs), stands in for the registered results with set_fact (the skipped tasks registered
theirs, which beat task vars) and
templates the conditions and arguments the role's tasks files pass, read from roles/sglang_server/tasks/*.yml.
"""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from ansible_collections.kpro.gpu_serving.tests.unit.roles.resolve import resolve

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
TASKS = os.path.join(TOP, "roles", "sglang_server", "tasks")

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason="needs the checkout's .venv (ansible-playbook)")

RESTORE = {"unit": "sglang.service", "venv": "/opt/sglang/venvs/1111111111111111", "probe_regex": "(?i)lyon",
           "options": {"port": 30001, "served_model_name": "old", "model_path": "/srv/models/m"}}
SCENARIOS = {
    "restarted": {"restarted": True},
    "unchanged": {"restarted": False},
    "multinode": {"restarted": True, "sglang_server_options": {"nnodes": 2, "node_rank": 0}},
    "off": {"restarted": True, "sglang_server_rollback": False},
    "base_url": {"restarted": True,
                 "sglang_server_base_url": "http://127.0.0.2:{{ sglang_server__options.port | default(30000, true) }}"},
}


RESTORED_KEYS = ("base_url", "served_model_name", "expected_probe_regex", "node_rank")


def _tasks(name):
    with open(os.path.join(TASKS, name)) as f:
        return list(yaml.safe_load(f))


def _one(tasks, key, **match):
    return [t for t in tasks if key in t and all((t[key] or {}).get(k) == v for k, v in match.items())][0]


def _cond(when):
    return "{{ (%s) | bool }}" % (" and ".join("(%s)" % w for w in when) if isinstance(when, list) else when)


def _playbook():
    main, rollback = _tasks("main.yml"), _tasks("rollback.yml")
    gate = [t for t in main if "kpro.gpu_serving.sglang_gate" in t and "async" in t][0]   # the wait (the look before it never fails)
    record = _one(main, "kpro.gpu_serving.sglang_deployment", state="recorded")
    include = [t for t in main if t.get("ansible.builtin.include_tasks") == "rollback.yml"][0]
    restored = _one(rollback, "kpro.gpu_serving.sglang_gate")
    wanted = {"ignore_errors": "{{ (%s) | bool }}" % gate["ignore_errors"].strip()[2:-2], "rollback": _cond(include["when"]),
              "record": _cond(record["when"]), "record_unit": record["kpro.gpu_serving.sglang_deployment"].get("unit", "")}
    # the restored gate's arguments: the main gate's one dict (args), under the task's own ones (those win, as in Ansible)
    restored_args = dict((k, v) for k, v in restored["kpro.gpu_serving.sglang_gate"].items() if k in RESTORED_KEYS)
    restored_args["__args__"] = restored["args"]
    return [{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": "load", "ansible.builtin.import_role": {"name": "kpro.gpu_serving.sglang_server"}, "when": False},
        {"name": "a failed gate", "ansible.builtin.set_fact": {
            "sglang_server_service": {"restarted": "{{ restarted }}"},
            "sglang_server_gate": {"failed": True, "phase": "oom"},
            "sglang_server__failed": {"restore": RESTORE}}},
        {"name": "resolve", "ansible.builtin.debug": {"msg": "WIRED {{ resolved | to_json }}"}, "vars": {"resolved": wanted}},
        {"name": "resolve restored", "ansible.builtin.debug": {"msg": "RESTORED {{ resolved | to_json }}"},
         "vars": dict(restored.get("vars", {}), resolved=restored_args)},
        {"name": "a passed gate", "ansible.builtin.set_fact": {"sglang_server_gate": {"failed": False, "changed": False}}},
        {"name": "resolve passed", "ansible.builtin.debug": {"msg": "PASSED {{ resolved | to_json }}"},
         "vars": {"resolved": {"record": wanted["record"]}}},
    ]}]


def _run(tmp, *args):
    got = resolve(tmp, dict(("ct_" + n, v) for n, v in SCENARIOS.items()), _playbook(), ("WIRED", "PASSED", "RESTORED"), *args)
    for v in got.values():
        layer = v["RESTORED"].pop("__args__")
        v["RESTORED"] = dict(dict((k, x) for k, x in layer.items() if k in RESTORED_KEYS), **v["RESTORED"])
    return dict((h[3:], v) for h, v in got.items())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("run")), _run(tmp_path_factory.mktemp("check"), "--check")


def test_rollback_only_after_a_launch_of_this_run_and_never_in_check_mode(runs):
    real, check = runs
    assert real["restarted"]["WIRED"]["ignore_errors"] is True and real["restarted"]["WIRED"]["rollback"] is True
    for name in ("unchanged", "off"):   # a failing server this run did not restart fails as it is
        assert real[name]["WIRED"]["ignore_errors"] is False and real[name]["WIRED"]["rollback"] is False
    for got in check.values():
        assert got["WIRED"]["ignore_errors"] is False and got["WIRED"]["rollback"] is False


def test_only_a_passed_single_node_gate_is_recorded_under_the_unit(runs):
    real, _check = runs
    assert real["restarted"]["PASSED"]["record"] is True and real["restarted"]["WIRED"]["record"] is False
    assert real["multinode"]["PASSED"]["record"] is False     # its peers' gates are unknown here
    assert real["multinode"]["WIRED"]["rollback"] is True     # rollback.yml fails, saying multi-node is not rolled back
    assert real["restarted"]["WIRED"]["record_unit"] == "sglang.service"


def test_the_restored_gate_gets_the_main_gates_inputs(runs):
    real, _check = runs
    assert real["restarted"]["RESTORED"] == {"base_url": "http://127.0.0.1:30001", "served_model_name": "old",
                                             "expected_probe_regex": "(?i)lyon", "node_rank": 0}
    assert real["base_url"]["RESTORED"]["base_url"] == "http://127.0.0.2:30001"
