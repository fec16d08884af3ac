"""The Proxmox conventions of community.proxmox: API options falling back to PROXMOX_* variables, an action group for
module_defaults, and the pve_api lookup taking the modules' option names."""
from __future__ import annotations

import ast
import os

import pytest
import yaml
from ansible import constants as C
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.kpro.gpu_serving.plugins.lookup import pve_api as lookup_mod
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.proxmox_api import api_argument_spec

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FRAGMENT = "kpro.gpu_serving.proxmox_api"
# community.proxmox plugins/module_utils/proxmox.py proxmox_auth_argument_spec: the names users already export
ENV = dict(api_host="PROXMOX_HOST", api_user="PROXMOX_USER", api_token_id="PROXMOX_TOKEN_ID",
           api_token_secret="PROXMOX_TOKEN_SECRET")


@pytest.fixture(name="clean_env")
def fixture_clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("PROXMOX_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _validate(params):
    result = ArgumentSpecValidator(api_argument_spec()).validate(params)
    assert not result.error_messages, result.error_messages
    return result.validated_parameters


def test_module_options_fall_back_to_the_environment(clean_env):
    clean_env.setenv("PROXMOX_HOST", "pve1.example.com")
    clean_env.setenv("PROXMOX_USER", "automation@pve")
    clean_env.setenv("PROXMOX_TOKEN_ID", "ansible")
    clean_env.setenv("PROXMOX_TOKEN_SECRET", "s3cret-uuid")
    got = _validate({})
    assert [got[k] for k in ENV] == ["pve1.example.com", "automation@pve", "ansible", "s3cret-uuid"]
    assert "s3cret-uuid" in ArgumentSpecValidator(api_argument_spec()).validate({})._no_log_values  # still masked
    # a task's own value wins over the environment
    assert _validate(dict(api_host="pve2.example.com"))["api_host"] == "pve2.example.com"


def test_without_the_environment_the_defaults_hold(clean_env):
    got = _validate({})
    assert got["api_host"] is None and got["api_user"] == "root@pam" and got["api_token_id"] is None


def _module_docs():
    """{module: its DOCUMENTATION} for every module of the collection."""
    folder = os.path.join(TOP, "plugins", "modules")
    out = {}
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".py") and not n.startswith("_")):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        docs = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "DOCUMENTATION" for t in n.targets)]
        out[name[:-3]] = yaml.safe_load(docs[0])
    return out


def test_the_action_group_lists_exactly_the_modules_with_the_api_options():
    with open(os.path.join(TOP, "meta", "runtime.yml"), encoding="utf-8") as f:
        group = yaml.safe_load(f)["action_groups"]["proxmox"]
    with_fragment = [m for m, doc in _module_docs().items() if FRAGMENT in doc.get("extends_documentation_fragment", [])]
    assert with_fragment, "no module takes the API options?"
    assert sorted(group) == with_fragment


def test_the_fragment_names_the_group_and_the_environment():
    from ansible_collections.kpro.gpu_serving.plugins.doc_fragments.proxmox_api import ModuleDocFragment
    doc = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)
    assert doc["attributes"]["action_group"]["membership"] == ["kpro.gpu_serving.proxmox"]
    assert set(doc["options"]) == set(api_argument_spec())
    for option, spec in api_argument_spec().items():
        env = spec.get("fallback", (None, []))[1]
        text = " ".join(doc["options"][option]["description"])
        assert all("E(%s)" % name in text for name in env), (option, env)
        assert ("E(%s)" % ENV[option] in text) if option in ENV else True


def _lookup_options():
    return yaml.safe_load(lookup_mod.DOCUMENTATION)["options"]


def test_the_lookup_takes_the_module_option_names_and_their_variables():
    options, spec = _lookup_options(), api_argument_spec()
    shared = sorted(set(options) - {"_terms"})
    assert shared == ["api_host", "api_port", "api_timeout", "api_token_id", "api_token_secret", "api_user", "ca_path",
                      "validate_certs"]
    for name in shared:  # each option of the lookup is a module option of that name, from the same variable
        assert name in spec, name
        assert [e["name"] for e in options[name]["env"]] == spec[name]["fallback"][1], name
    # the former names still work (roles/preflight and older playbooks use them)
    aliases = {a: name for name in shared for a in options[name].get("aliases", [])}
    assert aliases == dict(host="api_host", port="api_port", token_user="api_user", token_id="api_token_id",
                           token_secret="api_token_secret", timeout="api_timeout")


def _resolved_lookup_options(**direct):
    name = "kpro.gpu_serving.pve_api"
    C.config.initialize_plugin_configuration_definitions("lookup", name, _lookup_options())
    plugin = lookup_mod.LookupModule()
    plugin._load_name = name  # pylint: disable=protected-access
    return plugin._read_options({}, direct)  # pylint: disable=protected-access


def test_the_lookup_reads_the_environment_and_the_old_names(clean_env):
    clean_env.setenv("PROXMOX_HOST", "pve1.example.com")
    clean_env.setenv("PROXMOX_TOKEN_ID", "automation@pve!ansible")
    clean_env.setenv("PROXMOX_TOKEN_SECRET", "s3cret-uuid")
    opts = _resolved_lookup_options()
    assert (opts["api_host"], opts["api_token_id"], opts["api_token_secret"]) == (
        "pve1.example.com", "automation@pve!ansible", "s3cret-uuid")
    old = _resolved_lookup_options(host="pve2", token_user="root@pam", token_id="t", token_secret="x", timeout=3)
    assert (old["api_host"], old["api_user"], old["api_token_id"], old["api_timeout"]) == ("pve2", "root@pam", "t", 3)


def test_a_typo_in_the_environments_validate_certs_raises(clean_env):
    clean_env.setenv("PROXMOX_VALIDATE_CERTS", "ture")
    with pytest.raises(Exception, match="validate_certs"):
        _resolved_lookup_options(api_host="pve1", api_token_id="t", api_token_secret="x")
