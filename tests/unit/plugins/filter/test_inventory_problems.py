# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The offline inventory check's decisions (module_utils/controller/inventory_check.py) through its filters
kpro.gpu_serving.inventory_problems and inventory_address_problems, one concern at a time, on inputs shaped as the
lookup kpro.gpu_serving.inventory_inputs returns them."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.filter import inventory_check as flt
from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import inventory_check as ic

SHA = "sha256:" + "ab" * 32
COMMIT = "6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5"
SECRET = "3f8c2a91-5b7e-4d0c-9a6f-1e2d3c4b5a69"
ROLE_DEFAULTS = {"gpu_host_driver_version": "580.126.09", "gpu_host_driver_url": "", "gpu_host_driver_checksum": "",
                 "gpu_host_driver_path": "", "gpu_host_driver_src": "", "gpu_container_driver_version": "auto",
                 "gpu_container_driver_url": "", "gpu_container_driver_checksum": "", "gpu_container_driver_path": "",
                 "gpu_container_driver_src": "", "sglang_install_version": "0.5.11",
                 "sglang_install_python": "/usr/bin/python3", "sglang_install_lock_file": "",
                 "model_repo_id": "Qwen/Qwen3.6-27B", "model_revision": "main",
                 "model_hf_token": "{{ hf_token | default('') }}", "sglang_server_api_key": ""}


def inputs(concern, resolved=None, unresolved=None):
    return {"concerns": [concern], "resolved": dict(resolved or {}, inventory_dir="/inv"), "unresolved": unresolved or {}}


def lines(concern, resolved=None, unresolved=None, level=None, defaults=None, lock_dir=""):
    got = flt.inventory_problems(inputs(concern, resolved, unresolved), "h1", ROLE_DEFAULTS if defaults is None else defaults,
                                 lock_dir)
    return [p["line"] for p in got if level in (None, p["level"])]


def api(**kw):
    return dict(dict(pve_api_host="192.0.2.5", pve_api_user="root@pam", pve_api_token_id="ansible",
                     pve_api_token_secret=SECRET, pve_api_validate_certs=False), **kw)


@pytest.mark.parametrize("value, is_placeholder", [
    ("00000000-0000-0000-0000-000000000000", True), ("change-me", True), ("CHANGE-ME", True),
    ("hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", True), ("<your token>", True), ("", False), (SECRET, False),
    ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", False), ("s3cr3t-key-of-the-site", False)])
def test_placeholders(value, is_placeholder):
    assert ic.placeholder(value) is is_placeholder


def test_the_groups_name_their_concerns_and_the_variables_they_read():
    assert ic.concerns(["proxmox_hosts"]) == ["api", "host_installer"]
    assert ic.concerns(["gpu_containers", "model", "nope"]) == ["container", "container_installer", "lock", "model", "server"]
    assert "pve_api_token_secret" in ic.reads(["api"]) and "inventory_dir" in ic.reads(["model"])
    assert "pve_api_token_secret" not in ic.reads(["gpu_containers"])


def test_an_undefined_vault_variable_is_named_once_with_the_file_to_add_it_to():
    un = {"pve_api_token_secret": {"kind": "undefined", "error": "'vault_pve_api_token_secret' is undefined"},
          "pve_api_user": {"kind": "undefined", "error": "'vault_pve_api_token_secret' is undefined"}}
    got = lines("api", api(pve_api_token_secret=None, pve_api_user=None), un, level="error")
    assert got == ["h1: vault_pve_api_token_secret: undefined (pve_api_user, pve_api_token_secret read it) - add it to "
                   "group_vars/all/vault.yml (ansible-vault edit /inv/group_vars/all/vault.yml)"]


def test_other_unresolved_values_omit_and_errors():
    un = {"hf_token": {"kind": "omit", "error": "A template was resolved to an Omit scalar."},
          "model_repo_id": {"kind": "error", "error": "The lookup plugin 'ansible.builtin.file' failed: no file\nmore"},
          "model_revision": {"kind": "undefined", "error": "'site_revision' is undefined"}}
    assert lines("model", {}, un) == [
        "h1: model_repo_id: cannot be resolved: The lookup plugin 'ansible.builtin.file' failed: no file - fix its value "
        "or what its template reads",
        "h1: hf_token: resolves to omit (default(omit) outside a module's argument: its readers fail on it) - default it "
        "to '' instead of omit",
        "h1: site_revision: undefined (model_revision reads it) - set site_revision in the inventory"]


def test_a_variable_the_run_reads_itself_is_reported_by_its_own_check_only():
    un = {"pct_host": {"kind": "undefined", "error": "'pve_node_host' is undefined"}}
    assert lines("container", {"pve_vmid": 129}, un) == [
        "h1: pve_node_host: missing - name the proxmox_hosts host that runs the container (hosts.yml)"]


def test_the_api_inputs():
    assert lines("api", api()) == ["h1: pve_api_validate_certs: false: the API's certificate is not verified - set it to "
                                   "true with pve_api_ca_path (the node's /etc/pve/pve-root-ca.pem)"]
    got = lines("api", api(pve_api_host="https://192.0.2.5:8006", pve_api_user="root", pve_api_token_id="root@pam!ansible",
                           pve_api_token_secret="00000000-0000-0000-0000-000000000000"), level="error")
    assert [g.split(":")[1].strip() for g in got] == ["pve_api_host", "pve_api_user", "pve_api_token_id", "pve_api_token_secret"]
    assert "is the example's placeholder" in got[3] and "0000" not in got[3]
    assert lines("api", {"pve_api_validate_certs": False}, level="error") == [
        "h1: pve_api_host: missing - derive it from hosts.yml: " + ic.DERIVE_API_HOST,
        "h1: pve_api_user: missing - set the token's user, for example root@pam",
        "h1: pve_api_token_id: missing - set the token's name only (ansible for root@pam!ansible; `pveum user token list "
        "root@pam`)",
        "h1: pve_api_token_secret: missing or empty - put the token's secret (vault_pve_api_token_secret; `pveum user "
        "token add` shows it once) in the vault (ansible-vault edit /inv/group_vars/all/vault.yml)"]


def test_a_token_secret_that_is_not_a_uuid_is_a_warning_without_its_value():
    got = flt.inventory_problems(inputs("api", api(pve_api_token_secret="hunter2-password-x")), "h1")
    assert [(p["var"], p["level"]) for p in got] == [("pve_api_token_secret", "warning"), ("pve_api_validate_certs", "warning")]
    assert not any("hunter2" in p["line"] for p in got)


def test_the_ca_file_when_certificates_are_verified(tmp_path):
    ca = tmp_path / "ca.pem"
    got = lines("api", api(pve_api_validate_certs=True, pve_api_ca_path=str(ca)))
    assert got == ["h1: pve_api_ca_path: %s does not exist on the controller - copy the node's /etc/pve/pve-root-ca.pem "
                   "there (scp root@<node>:/etc/pve/pve-root-ca.pem %s)" % (ca, ca)]
    ca.write_text("pem")
    assert lines("api", api(pve_api_validate_certs=True, pve_api_ca_path=str(ca))) == []
    assert [p.split(": ")[1] for p in lines("api", api(pve_api_validate_certs=True), level="warning")] == ["pve_api_ca_path"]


def test_a_downloaded_installer_needs_its_checksum():
    assert lines("host_installer") == [
        "h1: gpu_host_driver_checksum: missing, and the installer is downloaded from https://us.download.nvidia.com/"
        "XFree86/Linux-x86_64/580.126.09/NVIDIA-Linux-x86_64-580.126.09.run - set it to \"sha256:<64 hex digits>\" "
        "(sha256sum NVIDIA-Linux-x86_64-580.126.09.run), or copy the installer from the controller with gpu_host_driver_src"]
    assert lines("host_installer", {"gpu_host_driver_checksum": SHA}) == []
    # a URL of one's own, even with a path on the host (downloaded there when the file is missing)
    got = lines("host_installer", {"gpu_host_driver_url": "http://192.0.2.1/x.run", "gpu_host_driver_path": "/root/x.run"})
    assert "downloaded from http://192.0.2.1/x.run" in got[0] and "(sha256sum x.run)" in got[0] and len(got) == 1
    # the container's userspace follows the host's version
    got = lines("container_installer")
    assert got[0].startswith("h1: gpu_container_driver_checksum: missing, and the installer is downloaded from NVIDIA's "
                             "server (the installer of the host's driver version)")


def test_an_installer_on_the_target_or_on_the_controller(tmp_path):
    # a file already on the host: the run verifies it there
    assert lines("host_installer", {"gpu_host_driver_path": "/root/NVIDIA-Linux-x86_64-580.126.09.run"}) == []
    run = tmp_path / "NVIDIA-Linux-x86_64-580.126.09.run"
    assert lines("container_installer", {"gpu_container_driver_src": str(run)}) == [
        "h1: gpu_container_driver_src: %s does not exist on the controller - put the installer there, or point "
        "gpu_container_driver_src at it" % run]
    run.write_text("installer")
    assert lines("container_installer", {"gpu_container_driver_src": str(run)}) == []
    assert lines("host_installer", {"gpu_host_driver_src": str(run), "gpu_host_driver_checksum": "md5:0123"}) == [
        "h1: gpu_host_driver_checksum: 'md5:0123' is not a sha256 - give sha256:<64 hex digits> (sha256sum of the installer)"]


def test_an_unresolved_checksum_is_not_called_missing():
    un = {"gpu_host_driver_checksum": {"kind": "error", "error": "no file"}}
    assert lines("host_installer", {}, un) == [
        "h1: gpu_host_driver_checksum: cannot be resolved: no file - fix its value or what its template reads"]


def test_the_sglang_lock(tmp_path):
    for py in ("3.11", "3.12", "3.13"):
        (tmp_path / ("sglang-0.5.11-py%s-x86_64.txt" % py)).write_text("")
    d = str(tmp_path)
    assert lines("lock", {"sglang_install_python": "/usr/bin/python3.11"}, lock_dir=d) == []
    assert lines("lock", {"sglang_install_python": "/usr/bin/python3.10"}, lock_dir=d) == [
        "h1: sglang_install_python: the collection has no lock for SGLang 0.5.11 on Python 3.10 (it has 3.11, 3.12, 3.13) "
        "- set sglang_install_python to a Python with a lock, or make sglang-lock SGLANG_VERSION=0.5.11 PYVER=3.10"]
    got = flt.inventory_problems(inputs("lock"), "h1", ROLE_DEFAULTS, d)
    assert [(p["var"], p["level"]) for p in got] == [("sglang_install_python", "warning")]
    assert "SGLang 0.5.11 has locks for Python 3.11, 3.12, 3.13" in got[0]["what"]
    assert lines("lock", {"sglang_install_version": "0.5.9"}, lock_dir=d) == [
        "h1: sglang_install_version: the collection has no lock for SGLang 0.5.9 (it has locks for SGLang 0.5.11) - pin a "
        "version that has one, or make "
        "sglang-lock SGLANG_VERSION=0.5.9 PYVER=<X.Y>"]
    assert lines("lock", {"sglang_install_lock_file": str(tmp_path / "mine.txt")}, lock_dir=d) == [
        "h1: sglang_install_lock_file: %s does not exist on the controller - point it at a lock made by "
        "roles/sglang_install/files/locks/regenerate.sh" % (tmp_path / "mine.txt")]


def test_the_model_revision_and_repository():
    assert lines("model", {"model_revision": COMMIT}) == []
    got = flt.inventory_problems(inputs("model"), "h1", ROLE_DEFAULTS)        # the default: main
    assert [(p["var"], p["level"]) for p in got] == [("model_revision", "warning")]
    assert got[0]["fix"].startswith("pin the commit: curl -s https://huggingface.co/api/models/Qwen/Qwen3.6-27B/revision/main")
    assert lines("model", {"model_revision": "", "model_repo_id": "not a repo", "hf_token": ""}) == [
        "h1: model_repo_id: 'not a repo' is not a repository id - set the hub's owner/name, for example Qwen/Qwen3.6-27B",
        "h1: model_revision: missing - pin the commit (40 hex digits)"]


def test_the_hugging_face_token_is_optional_but_never_a_placeholder():
    assert lines("model", {"model_revision": COMMIT}, defaults={"model_repo_id": "Qwen/Qwen3.6-27B"}) == []
    assert lines("model", {"model_revision": COMMIT, "hf_token": ""}) == []
    got = lines("model", {"model_revision": COMMIT, "hf_token": "hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"})
    assert got == ["h1: hf_token: is the example's placeholder: the hub refuses it (401) even for a public model - remove "
                   "vault_hf_token (a token is needed only for gated or private repositories) or put a real one in the "
                   "vault (ansible-vault edit /inv/group_vars/all/vault.yml)"]
    # model_hf_token, when the inventory sets it, is what the model stage sends
    assert lines("model", {"model_revision": COMMIT, "hf_token": "hf_xxxx", "model_hf_token": "hf_RealLooking0123"}) == []


def test_the_server_api_key():
    assert lines("server", {"sglang_server_api_key": "a-long-key-of-the-site"}) == []
    assert lines("server", {"sglang_server_api_key": "change-me"}) == [
        "h1: sglang_server_api_key: is the example's placeholder, not a real value - put a key of your own "
        "(vault_sglang_api_key) in the vault (ansible-vault edit /inv/group_vars/all/vault.yml)"]
    got = flt.inventory_problems(inputs("server"), "h1", ROLE_DEFAULTS)
    assert [(p["var"], p["level"]) for p in got] == [("sglang_server_api_key", "warning")]


def test_the_container_id():
    assert lines("container", {"pve_node_host": "kpro5", "pve_vmid": 129}) == []
    assert lines("container", {"pve_node_host": "kpro5", "pve_vmid": "12x"}) == [
        "h1: pve_vmid: '12x' is not a container ID - set the container's ID (100-999999999) in hosts.yml"]


def test_a_failure_of_the_check_itself_is_one_problem_of_the_host():
    got = flt.inventory_problems({"concerns": ["api"], "resolved": "not a dict"}, "h1")
    assert [(p["host"], p["level"]) for p in got] == [("h1", "error")] and "the check itself failed" in got[0]["line"]


NODE = {"groups": ["proxmox_hosts"], "ansible_host": "192.0.2.5", "connection": "ssh"}
CT = {"groups": ["gpu_containers"], "ansible_host": None, "connection": "kpro.gpu_serving.pct",
      "pve_node_host": "kpro5", "pct_host": "192.0.2.5"}


def addresses(hosts):
    return [p["line"] for p in flt.inventory_address_problems(hosts)]


def test_addresses_of_a_host_and_its_container():
    assert addresses({"kpro5": NODE, "ct129": CT}) == []
    assert addresses({"kpro5": NODE, "ct129": dict(CT, pct_host="192.0.2.6")}) == [
        "ct129: pct_host: 192.0.2.6 is not kpro5's address 192.0.2.5 - derive it from the node: " + ic.DERIVE_PCT_HOST]
    assert addresses({"kpro5": NODE, "ct129": dict(CT, pct_host="")}) == [
        "ct129: pct_host: missing - derive it from the node: " + ic.DERIVE_PCT_HOST]
    assert addresses({"kpro5": NODE, "ct129": dict(CT, pct_host=None)}) == []       # unresolved: reported per host
    assert addresses({"ct129": CT}) == ["ct129: pve_node_host: kpro5 is not a proxmox_hosts host of this run - name the "
                                        "container's Proxmox host (hosts.yml), and run it with its host"]


def test_every_host_reached_over_ssh_has_its_own_address():
    assert addresses({"kpro5": dict(NODE, ansible_host=None), "ct129": dict(CT, ansible_host="192.0.2.5")}) == [
        "kpro5: ansible_host: not set (the name kpro5 would be resolved by DNS) - set the host's address in hosts.yml"]
    assert addresses({"kpro5": NODE, "kpro7": dict(NODE), "ct129": dict(CT, ansible_host="192.0.2.30")}) == [
        "kpro7: ansible_host: 192.0.2.5 is also kpro5's - give each host its own address in hosts.yml"]
    # a container over SSH needs its own address; one reached with pct does not
    assert addresses({"kpro5": NODE, "ct129": dict(CT, connection="ssh", ansible_host=None)}) == [
        "ct129: ansible_host: not set (the name ct129 would be resolved by DNS) - set the host's address in hosts.yml"]


def test_sglang_lock_pythons_lists_the_collections_locks_in_version_order():
    locks = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "sglang_install", "files", "locks")
    assert flt.sglang_lock_pythons(locks, "0.5.11", "x86_64") == ["3.11", "3.12", "3.13"]
    assert flt.sglang_lock_pythons(locks, "0.5.11") == ["3.11", "3.12", "3.13"]
    assert flt.sglang_lock_pythons(locks, "0.5.11", "aarch64") == [] and flt.sglang_lock_pythons(locks, "9.9") == []


@pytest.mark.parametrize("options, tp, expected", [
    ({"context_length": 32768}, 2, []),
    ({"tp_size": None}, 2, []),
    ({"tp_size": 2}, 2, ["h1: sglang_server_options.tp_size: repeats sglang_install_tp (2) - drop it: the role sets "
                         "tp_size from sglang_install_tp"]),
    ({"tp_size": 4}, 2, ["h1: sglang_server_options.tp_size: 4, but sglang_install_tp is 2 (the compatibility table was "
                         "asked about 2) - set sglang_install_tp: 4 and drop tp_size here"]),
])
def test_tp_size_has_one_owner_sglang_install_tp(options, tp, expected):
    got = lines("server", dict(sglang_server_options=options, sglang_install_tp=tp, sglang_server_api_key=SECRET))
    assert got == expected


def test_tp_size_left_to_the_role_default_of_sglang_install_tp():
    got = lines("server", dict(sglang_server_options={"tp_size": 8}, sglang_server_api_key=SECRET),
                defaults=dict(ROLE_DEFAULTS, sglang_install_tp=2), level="error")
    assert got == ["h1: sglang_server_options.tp_size: 8, but sglang_install_tp is 2 (the compatibility table was asked "
                   "about 2) - set sglang_install_tp: 8 and drop tp_size here"]
