# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The AWX credential types and survey shipped under docs/awx/ (docs/awx.md) name only variables the roles or the
shipped playbooks read, inject only fields they declare, keep secrets in secret fields, and offer only SGLang versions
that have a lock: a misspelt variable fails here instead of being ignored by a job."""

from __future__ import annotations

import glob
import json
import os
import re

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
AWX = os.path.join(REPO, "docs", "awx")
# Keys whose string values are Jinja expressions without braces.
CONDITIONALS = {"when", "that", "failed_when", "changed_when", "until"}
JINJA = re.compile(r"{{(.*?)}}|{%(.*?)%}", re.S)
NAME = re.compile(r"(?<![.\w'\"])([a-z_][a-z0-9_]*)\b")
SECRET_WORDS = ("secret", "token", "key", "password")


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f) if path.endswith(".json") else yaml.safe_load(f)


def _expressions(node, key=None):
    """Every Jinja expression of a YAML tree: inside {{ }} / {% %}, or a conditional's whole string."""
    if isinstance(node, dict):
        return [e for k, v in node.items() for e in _expressions(v, k)]
    if isinstance(node, list):
        return [e for v in node for e in _expressions(v, key)]
    if isinstance(node, str):
        found = [a or b for a, b in JINJA.findall(node)]
        return found or ([node] if key in CONDITIONALS else [])
    return []


def read_variables(repo=REPO):
    """The variables the collection reads: role defaults and argument specs, and every name in the Jinja of the roles'
    defaults, vars and tasks and of the shipped playbooks (e.g. pve_api_host, read by the preflight's tasks)."""
    names = set()
    for path in glob.glob(os.path.join(repo, "roles", "*", "defaults", "main.yml")):
        names |= set(_load(path) or {})
    for path in glob.glob(os.path.join(repo, "roles", "*", "meta", "argument_specs.yml")):
        for spec in (_load(path) or {}).get("argument_specs", {}).values():
            names |= set(spec.get("options") or {})
    files = [p for d in ("defaults", "vars", "tasks") for p in glob.glob(os.path.join(repo, "roles", "*", d, "*.yml"))]
    for path in files + glob.glob(os.path.join(repo, "playbooks", "*.yml")):
        for expr in _expressions(_load(path)):
            names |= set(NAME.findall(expr))
    return names


def credential_types():
    return {os.path.basename(p): _load(p) for p in sorted(glob.glob(os.path.join(AWX, "credential_type_*.yml")))}


def survey():
    return _load(os.path.join(AWX, "survey_deploy.json"))


def injected_variables(ctype):
    return set(ctype["injectors"].get("extra_vars", {}))


def credential_problems(ctype, known):
    """What is wrong with one credential type: unknown variables, undeclared fields, secrets in plain fields."""
    fields = {f["id"]: f for f in ctype["inputs"]["fields"]}
    problems = ["injects %s, which no role or playbook reads" % v for v in sorted(injected_variables(ctype) - known)]
    for where in ("extra_vars", "env"):
        for var, tmpl in ctype["injectors"].get(where, {}).items():
            used = set(NAME.findall(" ".join(a or b for a, b in JINJA.findall(tmpl))))
            problems += ["%s %s uses undeclared field %s" % (where, var, f) for f in sorted(used - set(fields))]
    problems += ["field %s holds a secret but is not secret: true" % fid for fid, f in fields.items()
                 if any(w in fid for w in SECRET_WORDS) and fid != "token_id" and not f.get("secret")]
    problems += ["required names unknown field %s" % f for f in ctype["inputs"].get("required", []) if f not in fields]
    return problems


def survey_problems(spec, known, versions):
    """What is wrong with a survey: unknown variables, defaults outside their own bounds, versions without a lock."""
    problems = []
    for q in spec["spec"]:
        var, default = q["variable"], q.get("default")
        if var not in known:
            problems.append("asks for %s, which no role or playbook reads" % var)
        if q["type"] == "multiplechoice" and default not in q["choices"]:
            problems.append("%s: default %r is not a choice" % (var, default))
        if q["type"] == "integer" and not q["min"] <= default <= q["max"]:
            problems.append("%s: default %r outside %s..%s" % (var, default, q["min"], q["max"]))
        if var == "sglang_install_version":
            problems += ["%s: %s has no lock" % (var, v) for v in q["choices"] if v not in versions]
    return problems


def lock_versions(repo=REPO):
    locks = glob.glob(os.path.join(repo, "roles", "sglang_install", "files", "locks", "sglang-*-py*.txt"))
    return {os.path.basename(p).split("-")[1] for p in locks}


def test_the_shipped_credential_types_name_only_read_variables_and_keep_secrets_secret():
    known = read_variables()
    types = credential_types()
    assert {"credential_type_proxmox.yml", "credential_type_huggingface.yml"} <= set(types)
    for name, ctype in types.items():
        assert ctype["kind"] in ("cloud", "net"), name  # the kinds AWX allows for a custom type
        assert not credential_problems(ctype, known), (name, credential_problems(ctype, known))
    api = types["credential_type_proxmox.yml"]
    assert injected_variables(api) == {"pve_api_host", "pve_api_user", "pve_api_token_id", "pve_api_token_secret"}
    assert set(api["injectors"]["env"]) == {"PROXMOX_HOST", "PROXMOX_USER", "PROXMOX_TOKEN_ID", "PROXMOX_TOKEN_SECRET"}
    assert [f["id"] for f in api["inputs"]["fields"] if f.get("secret")] == ["token_secret"]
    assert injected_variables(types["credential_type_huggingface.yml"]) == {"hf_token"}


def test_the_shipped_survey_asks_for_read_variables_with_valid_defaults():
    spec = survey()
    assert {q["variable"] for q in spec["spec"]} == {"model_revision", "sglang_install_version", "kpro_rollout_serial"}
    assert not survey_problems(spec, read_variables(), lock_versions())
    shared = _load(os.path.join(REPO, "roles", "shared", "defaults", "main.yml"))
    defaults = {q["variable"]: q["default"] for q in spec["spec"]}
    assert defaults["sglang_install_version"] == shared["sglang_install_version"]
    assert defaults["model_revision"] == shared["model_revision"]


def test_a_misspelt_variable_a_stray_field_a_plain_secret_and_a_lockless_version_are_named():
    known = read_variables()
    assert "model_revision" in known and "pve_api_host" in known and "kpro_rollout_serial" in known
    assert "model_revison" not in known
    bad_type = {"kind": "cloud",
                "inputs": {"fields": [{"id": "token_secret", "type": "string"}], "required": ["token_secret", "host"]},
                "injectors": {"extra_vars": {"pve_api_token_secrt": "{{ token_secret }}"},
                              "env": {"PROXMOX_HOST": "{{ host }}"}}}
    assert credential_problems(bad_type, known) == [
        "injects pve_api_token_secrt, which no role or playbook reads",
        "env PROXMOX_HOST uses undeclared field host",
        "field token_secret holds a secret but is not secret: true",
        "required names unknown field host",
    ]
    spec = survey()
    spec["spec"][0]["variable"] = "model_revison"
    spec["spec"][1]["choices"] = spec["spec"][1]["choices"] + ["0.4.0"]
    spec["spec"][2]["default"] = -1
    assert survey_problems(spec, known, lock_versions()) == [
        "asks for model_revison, which no role or playbook reads",
        "sglang_install_version: 0.4.0 has no lock",
        "kpro_rollout_serial: default -1 outside 0..1000",
    ]
