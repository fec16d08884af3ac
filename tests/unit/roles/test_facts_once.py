# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each fact once (issue 13): what the stages' modules would be given, resolved by Ansible itself from the roles'
defaults and a small inventory, without a lab and without running a module.

Each stage is a play of its own, as in playbooks/migrate-kpro6-to-kpro5.yml: the play imports its role with
`when: false` (so the role's defaults and vars load, nothing runs) and templates the very arguments the role's tasks
file passes to the module (read from roles/*/tasks/*.yml), so the test follows the tasks as they are written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.dirname(sys.executable)
PLAYBOOK = os.path.join(BIN, "ansible-playbook")

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason="needs the checkout's .venv (ansible-playbook)")

# (play's host group, role, tasks file, module, the module arguments to resolve)
STAGES = [
    ("gpu_containers", "model", "main.yml", "kpro.gpu_serving.hf_model", ("local_dir", "revision")),
    ("gpu_containers", "sglang_install", "main.yml", "kpro.gpu_serving.sglang_compat", ("tp",)),
    ("gpu_containers", "preflight", "container.yml", "kpro.gpu_serving.sglang_compat", ("tp",)),
    ("gpu_containers", "sglang_server", "main.yml", "kpro.gpu_serving.sglang_service", ("venv", "options", "model_dir")),
    ("gpu_containers", "sglang_server", "main.yml", "kpro.gpu_serving.sglang_gate", ("base_url", "served_model_name", "tp_size", "model_dir")),
    ("proxmox_hosts", "lxc_gpu", "main.yml", "kpro.gpu_serving.lxc_gpu_passthrough", ("vmid",)),
    ("gpu_containers", "sglang_server", "main.yml", "kpro.gpu_serving.sglang_deployment", ("model_revision",)),
]


def _task(role, tasks_file, module):
    """The first task of the role's tasks file that calls the module (blocks included)."""
    with open(os.path.join(TOP, "roles", role, "tasks", tasks_file)) as f:
        todo = list(yaml.safe_load(f))
    while todo:
        t = todo.pop(0)
        if module in t or any(module + "(" in str(v) for v in (t.get("vars") or {}).values()):
            return t   # the module, or its filter in one of the task's vars (the compatibility table's)
        todo[:0] = t.get("block", []) + t.get("rescue", []) + t.get("always", [])
    raise AssertionError("no %s task in roles/%s/tasks/%s" % (module, role, tasks_file))


def _playbook():
    plays = []
    for i, (hosts, role, tasks_file, module, args) in enumerate(STAGES):
        task = _task(role, tasks_file, module)
        given = task.get(module) or {}
        filtered = [v for v in (task.get("vars") or {}).values() if module + "(" in str(v)]
        if filtered:
            # the filter's result names the arguments it was given
            given = dict((a, "{{ (%s)[%r] }}" % (filtered[0].strip()[2:-2].strip(), a)) for a in args)
        wanted = dict((a, given[a]) for a in args if a in given)
        if isinstance(task.get("args"), str):
            # arguments from one templated dict (args: "{{ ... }}"), under the module's own ones (those win, as in Ansible)
            wanted["__args__"] = task["args"]
        if "ansible_python_interpreter" in task.get("vars", {}):
            wanted["python"] = task["vars"]["ansible_python_interpreter"]
        plays.append({
            "name": "stage %d" % i, "hosts": hosts, "gather_facts": False,
            "tasks": [
                {"name": "load %s" % role, "ansible.builtin.import_role": {"name": "kpro.gpu_serving." + role}, "when": False},
                {"name": "resolve", "ansible.builtin.debug": {"msg": "FACT %d {{ resolved | to_json }}" % i},
                 "vars": {"resolved": wanted}},
            ]})
    return plays


# scenario -> the container's inventory variables (each scenario is a container host of its own, on a node of its own,
# so that one ansible-playbook run resolves them all)
SCENARIOS = {
    "defaults": {},
    "model_dir": {"model_dir": "/data/models/q"},
    "venv": {"sglang_install_venv": "/opt/other/venv"},
    "tp": {"sglang_install_tp": 1},
    "context_length": {"sglang_server_options": {"context_length": 32768}},
    "port_name": {"sglang_server_options": {"port": 30001, "served_model_name": "q"}},
    "served_name": {"sglang_server_served_model_name": "r"},
    "extra": {"sglang_server_options": {"disable_custom_all_reduce": True, "extra": ["--enable-metrics"], "max_running_requests": None}},
    "vmid": {"pve_vmid": 131},
    "revision": {"model_revision": "0123456789abcdef0123456789abcdef01234567"},
}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """{scenario: {(role, module): {argument: value}}} as the stages would pass them."""
    tmp = tmp_path_factory.mktemp("facts")
    inv = {"all": {"vars": {"ansible_connection": "local"}, "children": {
        "proxmox_hosts": {"hosts": dict(("node_" + name, {}) for name in SCENARIOS)},
        "gpu_containers": {"hosts": dict(("ct_" + name, dict({"pve_node_host": "node_" + name, "pve_vmid": 129}, **ct_vars))
                                         for name, ct_vars in SCENARIOS.items())},
    }}}
    (tmp / "inventory.json").write_text(json.dumps(inv))
    (tmp / "play.json").write_text(json.dumps(_playbook()))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"))
    p = subprocess.run([PLAYBOOK, "-i", str(tmp / "inventory.json"), str(tmp / "play.json")],
                       cwd=TOP, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    out = dict((name, {}) for name in SCENARIOS)
    for m in re.finditer(r'^ok: \[(?:ct|node)_(\w+)\] => \{\s*"msg": "FACT (\d+) (.*)"$', p.stdout, re.M):
        _hosts, role, _f, module, args = STAGES[int(m.group(2))]
        got = json.loads(json.loads('"%s"' % m.group(3)))
        layer = got.pop("__args__", {})
        out[m.group(1)][(role, module.rsplit(".", 1)[1])] = dict(dict((k, v) for k, v in layer.items() if k in args), **got)
    assert all(len(got) == len(STAGES) for got in out.values()), p.stdout[-4000:]
    return out


@pytest.fixture(scope="module")
def defaults(resolved):
    return resolved["defaults"]


def test_defaults_agree(defaults):
    model, serve, gate = defaults[("model", "hf_model")], defaults[("sglang_server", "sglang_service")], defaults[("sglang_server", "sglang_gate")]
    # (the gate may be given the plan instead of the model directory and the TP size)
    assert model["local_dir"] == serve["model_dir"] == serve["options"]["model_path"] == gate.get("model_dir", model["local_dir"])
    assert model["local_dir"] == "/srv/models/Qwen3.6-27B"
    assert model["python"] == serve["venv"] + "/bin/python"
    tp = defaults[("sglang_install", "sglang_compat")]["tp"]
    assert tp == defaults[("preflight", "sglang_compat")]["tp"] == serve["options"]["tp_size"] == int(gate.get("tp_size", tp)) == 2
    assert gate["served_model_name"] == serve["options"]["served_model_name"] == "qwen3.6-27b"
    assert gate["base_url"] == "http://127.0.0.1:%d" % serve["options"]["port"]
    assert int(defaults[("lxc_gpu", "lxc_gpu_passthrough")]["vmid"]) == 129


def test_the_deployment_record_names_the_downloaded_revision_without_the_model_stage(resolved):
    """The serve stage's play loads only its own role (as a run with --skip-tags model does since the stages are
    included): the record still names the model stage's revision, by default and when the inventory pins one."""
    for name, want in (("defaults", "main"), ("revision", "0123456789abcdef0123456789abcdef01234567")):
        got = resolved[name]
        assert got[("model", "hf_model")]["revision"] == got[("sglang_server", "sglang_deployment")]["model_revision"] == want


def test_model_dir_alone_moves_the_download_and_the_server(resolved):
    """The bug of issue 13: model_dir alone downloaded to the new place and served from the old one."""
    got = resolved["model_dir"]
    serve = got[("sglang_server", "sglang_service")]
    assert got[("model", "hf_model")]["local_dir"] == "/data/models/q"
    assert serve["options"]["model_path"] == "/data/models/q"
    assert serve["model_dir"] == "/data/models/q"
    assert got[("sglang_server", "sglang_gate")].get("model_dir", "/data/models/q") == "/data/models/q"


def test_venv_alone_moves_every_user(resolved):
    got = resolved["venv"]
    assert got[("sglang_server", "sglang_service")]["venv"] == "/opt/other/venv"
    assert got[("model", "hf_model")]["python"] == "/opt/other/venv/bin/python"


def test_tp_alone_reaches_the_table_and_the_server(resolved):
    got = resolved["tp"]
    assert got[("sglang_install", "sglang_compat")]["tp"] == got[("preflight", "sglang_compat")]["tp"] == 1
    assert got[("sglang_server", "sglang_service")]["options"]["tp_size"] == 1
    assert int(got[("sglang_server", "sglang_gate")].get("tp_size", 1)) == 1


def test_one_server_option_keeps_every_other_default(resolved, defaults):
    got = resolved["context_length"]
    options = got[("sglang_server", "sglang_service")]["options"]
    assert options == dict(defaults[("sglang_server", "sglang_service")]["options"], context_length=32768)


def test_port_and_name_reach_the_gate(resolved):
    got = resolved["port_name"]
    gate = got[("sglang_server", "sglang_gate")]
    assert gate["base_url"] == "http://127.0.0.1:30001" and gate["served_model_name"] == "q"
    got = resolved["served_name"]
    assert got[("sglang_server", "sglang_service")]["options"]["served_model_name"] == got[("sglang_server", "sglang_gate")]["served_model_name"] == "r"


def test_extra_flags_pass_through_and_null_drops_a_default(resolved):
    got = resolved["extra"]
    options = got[("sglang_server", "sglang_service")]["options"]
    assert options["disable_custom_all_reduce"] is True and options["extra"] == ["--enable-metrics"]
    assert options["max_running_requests"] is None and options["context_length"] == 65536


def test_container_id_from_pve_vmid(resolved):
    got = resolved["vmid"]
    assert int(got[("lxc_gpu", "lxc_gpu_passthrough")]["vmid"]) == 131
