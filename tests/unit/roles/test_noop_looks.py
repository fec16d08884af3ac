# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The read-only looks that spare the idempotent re-run its long waits (issue 17), read from the roles' tasks files and
resolved by Ansible itself (as test_sglang_server_rollback_role does): no lab, no module runs.

- The serve stage: a server this run did not restart is looked at once by the converge itself (sglang_service look:
  the gate's own code and options, a timeout of 1 s); the background wait, polled every sglang_server_gate_poll, runs
  only when the look did not pass, and its result is the one the rollback, the summary and the record read.
- The gpu_host stage: the installer is copied and verified unless the driver look found nothing to do and the release
  will not run; the look is the install's own arguments; the release (and its reboot) is included only when the look
  found something to release or a reboot required; after a release the driver is looked at again.
"""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from ansible_collections.kpro.gpu_serving.tests.unit.roles.resolve import resolve

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
ROLES = os.path.join(TOP, "roles")

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason="needs the checkout's .venv (ansible-playbook)")


def _tasks(role, name):
    with open(os.path.join(ROLES, role, "tasks", name)) as f:
        return list(yaml.safe_load(f))


def _named(tasks, start):
    return [t for t in tasks if t.get("name", "").startswith(start)][0]


def _expr(when):
    return "{{ (%s) | bool }}" % (" and ".join("(%s)" % w for w in when) if isinstance(when, list) else when)


def _gate_tasks():
    main = _tasks("sglang_server", "main.yml")
    converge = _named(main, "Converge the SGLang unit")
    wait = [t for t in main if "kpro.gpu_serving.sglang_gate" in t]
    keep = _named(main, "Keep the gate's result")
    assert len(wait) == 1   # the look is the converge's (sglang_service look), not a module call of its own
    return converge, wait[0], keep


def _role_vars(role):
    with open(os.path.join(ROLES, role, "vars", "main.yml")) as f:
        return yaml.safe_load(f)


def test_the_look_is_the_gates_own_options_with_a_short_timeout():
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_ready import LOOK_KEYS
    converge, wait, _keep = _gate_tasks()
    rv = _role_vars("sglang_server")
    assert converge["args"] == "{{ sglang_server__converge_args }}"
    assert "{'look': sglang_server__gate_args} if sglang_server_state == 'started'" in rv["sglang_server__converge_args"]
    # the gate's options that are not the launch's, written once: the look, the wait and the restored deployment's gate
    # all pass the one dict; the tasks add the launch's own (the restored gate: what its deployment recorded)
    shared, restored = rv["sglang_server__gate_args"], _named(_tasks("sglang_server", "rollback.yml"), "Gate the restored deployment")
    assert wait["args"] == restored["args"] == "{{ sglang_server__gate_args }}"
    assert set(shared) <= set(LOOK_KEYS), set(shared) - set(LOOK_KEYS)
    assert not set(wait["kpro.gpu_serving.sglang_gate"]) & set(shared)
    assert set(restored["kpro.gpu_serving.sglang_gate"]) & set(shared) == {"expected_probe_regex", "sglang_version", "model_dir"}
    assert wait["kpro.gpu_serving.sglang_gate"]["timeout"] == "{{ sglang_server_gate_timeout }}"
    # the background wait is polled every sglang_server_gate_poll, whether or not this run restarted the server
    assert wait["poll"] == "{{ sglang_server_gate_poll }}"


def _driver_look():
    return _named(_tasks("gpu_host", "precheck.yml"), "Check that no running VM holds the GPUs, and look at the NVIDIA driver")


def test_the_driver_look_is_the_installs_own_call():
    fetch, driver = _tasks("gpu_host", "fetch.yml"), _tasks("gpu_host", "driver.yml")
    look = _driver_look()
    relook, install = driver[0], driver[1]
    for t in (relook, install):
        assert t["args"] == "{{ gpu_host__driver_args }}" and t["kpro.gpu_serving.nvidia_driver"] is None
    # the look: the install's own arguments, with the release's read-only look (one module call for both)
    assert look["args"] == "{{ gpu_host__driver_look_args }}" and look["kpro.gpu_serving.nvidia_driver"] is None
    with open(os.path.join(ROLES, "gpu_host", "vars", "main.yml")) as f:
        look_args = yaml.safe_load(f)["gpu_host__driver_look_args"]
    assert look_args.startswith("{{ gpu_host__driver_args | combine({'release_look':")
    assert look["check_mode"] is True and relook["check_mode"] is True and "async" in install
    # only the release's refusal fails the look (a failed driver look is the install's to report)
    assert look["failed_when"] == "gpu_host__driver_look.release is not defined" and "when" not in look
    for t in fetch:
        assert "gpu_host__installer_needed" in t["when"], t["name"]
    # the release and its reboot: one include, skipped in one step when the look found nothing to release
    assert _release_include()["ansible.builtin.include_tasks"] == "release.yml"
    assert "when" not in _tasks("gpu_host", "release.yml")[0]   # included: the release runs


def _release_include():
    return _named(_tasks("gpu_host", "main.yml"), "Release the GPUs from vfio-pci")


SCENARIOS = {
    # name: (the look's result (None: skipped), restarted, check mode)
    "restarted": (None, True),
    "ready": ({"changed": False, "failed": False, "phase": "ready", "time_to_ready_s": 3.0}, False),
    "loading": ({"changed": False, "failed": False, "phase": "timeout", "msg": "did not become ready"}, False),
    "failing": ({"changed": False, "failed": False, "failed_when_result": False, "phase": "oom"}, False),
}
RELEASE = {
    # name: (driver look, release look, release ran)
    "converged": ({"would_change": False}, {"would_change": False, "reboot_required": False}, False),
    "driver": ({"would_change": True}, {"would_change": False, "reboot_required": False}, False),
    "look_failed": ({"failed": False, "msg": "no nvml"}, {"would_change": False, "reboot_required": False}, False),
    "release": ({"would_change": False}, {"would_change": True, "reboot_required": False}, True),
    "reboot": ({"would_change": False}, {"would_change": False, "reboot_required": True}, True),
    "no_driver_result": (None, {"would_change": False, "reboot_required": False}, False),
}
SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}
WAITED = {"changed": False, "failed": False, "phase": "ready", "waited_s": 40.0}


def _playbook():
    _converge, wait, keep = _gate_tasks()
    fetch, driver = _tasks("gpu_host", "fetch.yml"), _tasks("gpu_host", "driver.yml")
    relook, install = driver[0], driver[1]
    wanted = {"wait": _expr(wait["when"])}
    assert wait["register"] == "sglang_server_gate"   # a failed wait that is not ignored stays readable as the result
    tasks = [
        {"name": "load", "ansible.builtin.include_vars": {"file": os.path.join(ROLES, "gpu_host", "vars", "main.yml")}},
        {"name": "scenario", "ansible.builtin.set_fact": {
            "sglang_server_service": "{{ {'restarted': restarted} | combine({'look': look_result} if look_result is not none else {}) }}",
            "gpu_host__driver_look": "{{ (driver_look if driver_look is not none else {}) | combine({'release': release_look}) }}",
            "gpu_host__driver_relook": "{{ {'would_change': true} if release_ran else skipped }}"}},
        {"name": "resolve", "ansible.builtin.debug": {"msg": "WIRED {{ resolved | to_json }}"},
         "vars": {"resolved": dict(wanted, fetch=_expr(fetch[0]["when"].replace("gpu_host_driver_src | length > 0 and ", "")),
                                   relook=_expr(relook["when"]), install=_expr(install["when"]),
                                   release=_expr(_release_include()["when"]))}},
        {"name": "the wait", "ansible.builtin.set_fact": {"sglang_server_gate": "{{ waited if wanted_wait else skipped }}"},
         "vars": {"wanted_wait": wanted["wait"]}},
        dict(keep),   # the role's own task, its condition included
        {"name": "resolve kept", "ansible.builtin.debug": {"msg": "KEPT {{ sglang_server_gate | to_json }}"}},
    ]
    return [{"hosts": "all", "gather_facts": False, "vars": {"skipped": SKIPPED, "waited": WAITED, "sglang_server_state": "started"},
             "tasks": tasks}]


def _run(tmp, *args):
    hosts = {}
    for n, (look, restarted) in SCENARIOS.items():
        hosts["gate_" + n] = {"look_result": look, "restarted": restarted, "driver_look": None,
                              "release_look": RELEASE["converged"][1], "release_ran": False}
    for n, (dlook, rlook, ran) in RELEASE.items():
        hosts["host_" + n] = {"look_result": None, "restarted": True, "driver_look": dlook, "release_look": rlook, "release_ran": ran}
    return resolve(tmp, hosts, _playbook(), ("WIRED", "KEPT"), *args)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("run"))


def test_the_gate_waits_only_when_the_look_did_not_pass(resolved):
    assert resolved["gate_restarted"]["WIRED"]["wait"] is True       # a launch of this run: no look, the gate waits
    assert resolved["gate_ready"]["WIRED"]["wait"] is False
    for name in ("loading", "failing"):   # a loading or failing server: the wait decides and reports
        assert resolved["gate_" + name]["WIRED"]["wait"] is True
    # what the rollback, the summary and the record read: the look's result when it passed, else the wait's
    assert resolved["gate_ready"]["KEPT"]["phase"] == "ready" and resolved["gate_ready"]["KEPT"]["time_to_ready_s"] == 3.0
    for name in ("restarted", "loading", "failing"):
        assert resolved["gate_" + name]["KEPT"] == WAITED


def test_the_installer_is_fetched_unless_nothing_is_to_do(resolved):
    got = dict((n, resolved["host_" + n]["WIRED"]) for n in RELEASE)
    assert got["converged"]["fetch"] is False and got["converged"]["install"] is False and got["converged"]["relook"] is False
    for name in ("driver", "look_failed", "release", "reboot", "no_driver_result"):
        assert got[name]["fetch"] is True, name
    assert got["driver"]["install"] is True and got["look_failed"]["install"] is True
    # the release is included only when its look found something to release or a reboot required
    for name in ("converged", "driver", "look_failed", "no_driver_result"):
        assert got[name]["release"] is False and got[name]["relook"] is False, name
    assert got["release"]["release"] is True and got["reboot"]["release"] is True
    # after a release the driver is looked at again, and that look decides
    assert got["release"]["relook"] is True and got["release"]["install"] is True
    assert got["reboot"]["relook"] is True
