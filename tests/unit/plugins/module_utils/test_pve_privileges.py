# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's check of the API token's privileges (module_utils/controller/pve_privileges.py, filters pve_token_*), the
pve_api lookup's query strings, and the README's pveum commands against the one table."""

from __future__ import annotations

import os
import re

import pytest

from ansible_collections.kpro.gpu_serving.plugins.filter import pve_privileges as filters
from ansible_collections.kpro.gpu_serving.plugins.lookup import pve_api
from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import pve_privileges as pp

README = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "README.md")
ALL = {p: 1 for p in ("Permissions.Modify", "Sys.Modify", "VM.Audit", "VM.PowerMgmt", "VM.Allocate")}


def answer(path, privs, status=200):
    """What the lookup returns for GET /access/permissions?path=<path> (PVE: {"data": {path: {priv: propagate}}})."""
    if status != 200:
        return dict(status=status, msg="HTTP Error %d: boom" % status, json={}, url="u")
    return dict(status=200, msg="OK", json={"data": {path: dict(privs)}}, url="u")


def test_terms_ask_each_container_then_root():
    assert pp.terms([129]) == ["access/permissions?path=/vms/129", "access/permissions?path=/"]
    assert pp.paths(["129", 131]) == ["/vms/129", "/vms/131", "/"]
    assert pp.paths([]) == ["/"]
    assert filters.FilterModule().filters()["pve_token_permission_terms"]([129]) == pp.terms([129])


def test_missing_powermgmt_is_one_line_with_privilege_path_and_fix():
    got = pp.check([answer("/vms/129", {"VM.Audit": 1}), answer("/", {})], [129], "root@pam!weak")
    assert got["full_rights"] == ""
    assert len(got["problems"]) == 1
    line = got["problems"][0]
    assert line.startswith("The API token root@pam!weak lacks VM.PowerMgmt on /vms/129 (to shut down and start CT 129)")
    assert "pveum acl modify /vms/129 --tokens 'root@pam!weak' --roles KproGpuServing" in line
    assert "pveum role add KproGpuServing --privs 'VM.Audit VM.PowerMgmt'" in line


def test_no_privileges_two_lines_and_a_user_that_is_not_root_gets_the_acl_too():
    got = pp.check([answer("/vms/129", {}), answer("/", {})], [129], "ops@pve!kpro")
    assert [re.match(r"The API token ops@pve!kpro lacks (\S+) on (\S+)", l).groups() for l in got["problems"]] == [
        ("VM.Audit", "/vms/129"), ("VM.PowerMgmt", "/vms/129")]
    assert "pveum acl modify /vms/129 --tokens 'ops@pve!kpro' --users ops@pve --roles KproGpuServing" in got["problems"][0]


def test_enough_privileges_pass_and_the_propagate_flag_does_not_matter():
    got = pp.check([answer("/vms/129", {"VM.Audit": 0, "VM.PowerMgmt": 0}), answer("/vms/131", {"VM.Audit": 1,
                   "VM.PowerMgmt": 1}), answer("/", {"VM.Audit": 1})], [129, 131], "root@pam!kpro")
    assert got == dict(problems=[], full_rights="")


def test_a_token_with_full_rights_passes_and_is_named():
    got = filters.pve_token_privileges([answer("/vms/129", ALL), answer("/", ALL)], [129], "root@pam!ansible")
    assert got["problems"] == []
    assert got["full_rights"].startswith("The API token root@pam!ansible has every privilege (Permissions.Modify on /): "
                                         "a root@pam token without privilege separation (--privsep 0)")
    assert "needs only VM.Audit and VM.PowerMgmt on /vms/129" in got["full_rights"]
    other = pp.check([answer("/vms/129", ALL), answer("/", ALL)], [129], "ops@pve!t")["full_rights"]
    assert "or it has Administrator on /" in other


def test_a_failed_read_is_a_problem_not_a_pass():
    got = pp.check([answer("/vms/129", {}, status=-1), answer("/", {})], [129], "root@pam!x")
    assert got["problems"] == ["GET /access/permissions?path=/vms/129 as token root@pam!x failed: HTTP -1 HTTP Error -1: boom"]
    got = pp.check([dict(status=200, json={"data": None}), answer("/", {})], [129], "root@pam!x")
    assert "failed: HTTP 200" in got["problems"][0]
    with pytest.raises(ValueError):
        pp.check([answer("/", {})], [129], "root@pam!x")


def test_lookup_terms_with_a_query_string_are_encoded():
    assert pve_api.api_path("access/permissions?path=/vms/129") == "access/permissions?path=%2Fvms%2F129"
    assert pve_api.api_path("/version") == "version"
    assert pve_api.api_path("nodes/pve1/status") == "nodes/pve1/status"
    for bad in ("?path=/", "", "/", 5):
        with pytest.raises(Exception, match="a term must be an API path"):
            pve_api.api_path(bad)


def test_readme_commands_grant_exactly_the_table():
    """The README's role has the table's privileges, on each path the table names for CT 129, for a privsep token."""
    with open(README) as f:
        text = f.read()
    block = text.split("**The API token.**", 1)[1].split("\n\n")[1]
    cmds = [line.strip() for line in block.splitlines()]
    assert len(cmds) == 3 and all(c.startswith("pveum ") for c in cmds)
    role = re.match(r'pveum role add (\S+) --privs "([^"]+)"$', cmds[0])
    assert role.group(1) == pp.ROLE and sorted(role.group(2).split()) == pp.role_privileges()
    assert re.match(r"pveum user token add root@pam (\S+) --privsep 1$", cmds[1])
    paths = sorted(set(p.format(vmid=129) for p, _priv, _why in pp.REQUIRED))
    assert cmds[2] == pp.acl_command(paths[0], "root@pam!ansible") and len(paths) == 1
