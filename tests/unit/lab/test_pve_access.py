"""The lab's permission model (tests/lab/rootfs/usr/lib/kpro-lab/pve/access.py) against pve-access-control's own tests,
and the API stand-in and its pveum enforcing it per path and per token.

The expected values are pve-access-control 8.2.2's (git 25dd375): src/test/test8.cfg with perm-test8.pl (tokens,
privilege separation, NoAccess, groups), test1.cfg with perm-test1.pl (built-in roles, propagate), and cases of
src/test/parser_writer.pl (user.cfg written back byte for byte). No lab and no root needed: the API server runs on
127.0.0.1 over a temp node root (test_pve_fake's fixtures).
"""

import json
import os
import subprocess

import pytest

from conftest import LAB, lablib
from test_pve_fake import NODE_PY, pveroot, server  # noqa: F401  pylint: disable=unused-import

access = lablib("pve.access")
requests = pytest.importorskip("requests")

PVEUM = os.path.join(LAB, "rootfs", "usr", "sbin", "pveum")

# src/test/test8.cfg, verbatim
TEST8 = """user:joe@pve:1:
user:max@pve:1:
token:max@pve!token::0:
token:max@pve!token2::1:
user:alex@pve:1:
user:sue@pve:1:
user:carol@pam:1:
token:carol@pam!token:

group:testgroup1:joe@pve,max@pve,sue@pve:
group:testgroup2:alex@pve,carol@pam,sue@pve:
group:testgroup3:max@pve:

role:storage_manager:Datastore.AllocateSpace,Datastore.Audit:
role:customer:VM.Audit,VM.PowerMgmt:
role:vm_admin:VM.Audit,VM.Allocate,VM.Console:

acl:1:/vms:@testgroup1:vm_admin:
acl:0:/vms/300:max@pve:customer:
acl:1:/vms/300:max@pve:vm_admin:
acl:1:/vms/100/:alex@pve,max@pve:customer:
acl:1:/storage/nfs1:@testgroup2:storage_manager:
acl:1:/users:max@pve:Administrator:

acl:1:/vms/200:@testgroup3:storage_manager:
acl:1:/vms/200:@testgroup2:NoAccess:

acl:1:/vms/200:carol@pam!token:vm_admin
acl:1:/vms/200:max@pve!token:storage_manager
acl:1:/vms/200:max@pve!token2:customer

acl:1:/vms/300:max@pve!token2:Administrator
"""

# src/test/test1.cfg, the lines perm-test1.pl's built-in role checks read
TEST1 = """user:alex@pve:1:
acl:1:/vms/300:alex@pve:PVEVMAdmin:
acl:1:/vms/400:alex@pve:Administrator:
"""

ALL_PRIVS = ("Datastore.Allocate,Datastore.AllocateSpace,Datastore.AllocateTemplate,Datastore.Audit,Group.Allocate,"
             "Mapping.Audit,Mapping.Modify,Mapping.Use,Permissions.Modify,Pool.Allocate,Pool.Audit,Realm.Allocate,"
             "Realm.AllocateUser,SDN.Allocate,SDN.Audit,SDN.Use,Sys.AccessNetwork,Sys.Audit,Sys.Console,Sys.Incoming,"
             "Sys.Modify,Sys.PowerMgmt,Sys.Syslog,User.Modify,VM.Allocate,VM.Audit,VM.Backup,VM.Clone,VM.Config.CDROM,"
             "VM.Config.CPU,VM.Config.Cloudinit,VM.Config.Disk,VM.Config.HWType,VM.Config.Memory,VM.Config.Network,"
             "VM.Config.Options,VM.Console,VM.Migrate,VM.Monitor,VM.PowerMgmt,VM.Snapshot,VM.Snapshot.Rollback")
VM_ADMIN = ("VM.Allocate,VM.Audit,VM.Backup,VM.Clone,VM.Config.CDROM,VM.Config.CPU,VM.Config.Cloudinit,VM.Config.Disk,"
            "VM.Config.HWType,VM.Config.Memory,VM.Config.Network,VM.Config.Options,VM.Console,VM.Migrate,VM.Monitor,"
            "VM.PowerMgmt,VM.Snapshot,VM.Snapshot.Rollback")


def roles(cfg, user, path):
    return ",".join(sorted(access.roles(cfg, user, path)))


def privs(cfg, user, path):
    return ",".join(sorted(access.permissions(cfg, user, path)))


@pytest.mark.parametrize("user,path,expected", [  # perm-test8.pl check_roles
    ("max@pve", "/", ""), ("max@pve", "/vms", "vm_admin"), ("max@pve", "/vms/100", "customer"),
    ("max@pve", "/vms/101", "vm_admin"), ("max@pve", "/vms/200", "storage_manager"), ("joe@pve", "/vms/200", "vm_admin"),
    ("sue@pve", "/vms/200", "NoAccess"), ("carol@pam", "/vms/200", "NoAccess"), ("carol@pam!token", "/vms/200", "NoAccess"),
    ("max@pve!token", "/vms/200", "storage_manager"), ("max@pve!token2", "/vms/200", "customer"),
])
def test_roles_as_perm_test8(user, path, expected):
    assert roles(access.UserConfig(TEST8), user, path) == expected


@pytest.mark.parametrize("user,path,expected", [  # perm-test8.pl check_permission
    ("max@pve", "/", ""), ("max@pve", "/vms", "VM.Allocate,VM.Audit,VM.Console"),
    ("max@pve", "/vms/100", "VM.Audit,VM.PowerMgmt"), ("alex@pve", "/vms", ""), ("alex@pve", "/vms/100", "VM.Audit,VM.PowerMgmt"),
    # the token has Administrator, its user only vm_admin and customer: the intersection
    ("max@pve!token2", "/vms/300", "VM.Allocate,VM.Audit,VM.Console,VM.PowerMgmt"),
])
def test_permissions_as_perm_test8(user, path, expected):
    assert privs(access.UserConfig(TEST8), user, path) == expected


def test_builtin_roles_as_perm_test1():
    cfg = access.UserConfig(TEST1)
    assert privs(cfg, "alex@pve", "/vms/300") == VM_ADMIN
    assert privs(cfg, "alex@pve", "/vms/400") == ALL_PRIVS
    assert privs(cfg, "root@pam", "/anything") == ALL_PRIVS
    assert sorted(access.SPECIAL_ROLES["PVEAuditor"]) == [
        "Datastore.Audit", "Mapping.Audit", "Pool.Audit", "SDN.Audit", "Sys.Audit", "VM.Audit"]
    assert sorted(access.SPECIAL_ROLES["PVEVMUser"]) == [
        "VM.Audit", "VM.Backup", "VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.PowerMgmt"]


def test_pve9_privileges():
    """libpve-access-control 9.0.4 (git 3e9da0c): no VM.Monitor, the guest agent's privileges in the VM roles."""
    valid, roles_ = access._create_roles(access.PRIVGROUPS_PVE9)  # pylint: disable=protected-access
    assert "VM.Monitor" not in valid and {"VM.GuestAgent.Audit", "VM.Replicate"} <= valid
    assert sorted(roles_["PVEAuditor"]) == ["Datastore.Audit", "Mapping.Audit", "Pool.Audit", "SDN.Audit", "Sys.Audit",
                                            "VM.Audit", "VM.GuestAgent.Audit"]
    assert {"VM.Audit", "VM.PowerMgmt"} <= roles_["PVEVMUser"]


def test_root_tokens_privilege_separation():
    """A root@pam token without separation has every privilege; with it, only its own ACLs' (no intersection with
    root@pam, RPCEnvironment.pm:101-110); an ACL without propagate does not reach below its path."""
    cfg = access.UserConfig("user:root@pam:1:0::::::\ntoken:root@pam!full:0:0::\ntoken:root@pam!sep:0:1::\n\n\n\n"
                            "role:R:VM.Audit,VM.PowerMgmt:\n\nacl:0:/vms:root@pam!sep:PVEAuditor:\n"
                            "acl:1:/vms/129:root@pam!sep:R:\n")
    assert privs(cfg, "root@pam!full", "/vms/129") == ALL_PRIVS
    assert privs(cfg, "root@pam!sep", "/vms/129") == "VM.Audit,VM.PowerMgmt"
    assert access.permissions(cfg, "root@pam!sep", "/vms/129") == {"VM.Audit": 1, "VM.PowerMgmt": 1}
    assert privs(cfg, "root@pam!sep", "/vms/130") == ""  # acl:0 on /vms does not propagate
    assert "VM.Audit" in privs(cfg, "root@pam!sep", "/vms")
    assert privs(cfg, "root@pam!nosuch", "/vms/129") == ""
    with pytest.raises(Exception, match=r"^Permission check failed \(/vms, VM.PowerMgmt\)$"):  # the first one missing
        access.check(cfg, "root@pam!sep", "/vms", ["VM.Audit", "VM.PowerMgmt"])
    with pytest.raises(Exception, match=r"^Permission check failed \(/vms/130, VM.Audit\|VM.PowerMgmt\)$"):
        access.check(cfg, "root@pam!sep", "/vms/130", ["VM.Audit", "VM.PowerMgmt"], any_=True)


R = "user:root@pam:1:0::::::"
T2, T = "user:test2@pam:1:0::::::", "user:test@pam:1:0::::::"
TOKENS2 = "token:test2@pam!expired:1:0::\ntoken:test2@pam!full:0:0::\ntoken:test2@pam!privsep:0:1::"


@pytest.mark.parametrize("raw,expected", [  # parser_writer.pl: raw -> write_user_config(parse_user_config(raw))
    ("%s\n%s\n%s\n%s\ntoken:test@pam!full:0:0::\n\n\n\n\n" % (R, T2, TOKENS2, T), None),  # token_multi
    ("%s\n%s\n%s\n%s\ntoken:test@pam!full:0:0::\n\n\n\n\nacl:1:/:test@pam!full:PVEVMAdmin:\n"  # acl_complex_tokens
     "acl:1:/storage:test2@pam!expired,test@pam!full:PVEDatastoreAdmin:\nacl:1:/storage:test2@pam!privsep:PVEDatastoreUser:\n"
     % (R, T2, TOKENS2, T), None),
    ("%s\n%s\n%s\n%s\nacl:1:/:test@pam!full:PVEVMAdmin:\n"  # acl_complex_missing_token
     "acl:1:/storage:test2@pam!expired,test@pam!full:PVEDatastoreAdmin:\nacl:1:/storage:test2@pam!privsep:PVEDatastoreUser:\n"
     % (R, T2, TOKENS2, T),
     "%s\n%s\n%s\n%s\n\n\n\n\nacl:1:/storage:test2@pam!expired:PVEDatastoreAdmin:\n"
     "acl:1:/storage:test2@pam!privsep:PVEDatastoreUser:\n" % (R, T2, TOKENS2, T)),
    ("%s\n%s\n\n\n\n\nacl:1:/:test@pam:PVEVMAdmin:\nacl:1:/storage:test@pam:MissingRole:\n" % (R, T),  # acl_missing_role
     "%s\n%s\n\n\n\n\nacl:1:/:test@pam:PVEVMAdmin:\n" % (R, T)),
    ("%s\n%s\nuser:test3@pam:1:0::::::\n%s\n\ngroup:another:test3@pam::\ngroup:testgroup:test2@pam,test@pam::\n\n\n\n"
     "acl:0:/:@testgroup:PVEVMAdmin:\nacl:1:/:test@pam:PVEVMAdmin:\nacl:0:/storage:@testgroup:PVEDatastoreAdmin:\n"
     "acl:0:/storage:@another:PVEDatastoreUser:\nacl:1:/storage:test@pam:PVEDatastoreAdmin:\n"
     "acl:1:/storage:test2@pam:PVEDatastoreUser:\n" % (R, T2, T), None),  # acl_complex_mixed_prop_noprop_no_merge_...
    ("%s\n%s\nuser:test3@pam:1:0::::::\n%s\n\ngroup:another:test3@pam::\ngroup:testgroup:test2@pam,test@pam::\n\n\n\n"
     "acl:1:/:@testgroup:PVEVMAdmin:\nacl:1:/storage:@testgroup:PVEDatastoreAdmin:\nacl:1:/storage:@another:PVEDatastoreUser:\n"
     "acl:1:/:test@pam:PVEVMAdmin:\nacl:1:/storage:test@pam:PVEDatastoreAdmin:\nacl:1:/storage:test2@pam:PVEDatastoreUser:\n"
     % (R, T2, T),  # acl_complex_mixed
     "%s\n%s\nuser:test3@pam:1:0::::::\n%s\n\ngroup:another:test3@pam::\ngroup:testgroup:test2@pam,test@pam::\n\n\n\n"
     "acl:1:/:@testgroup,test@pam:PVEVMAdmin:\nacl:1:/storage:@testgroup,test@pam:PVEDatastoreAdmin:\n"
     "acl:1:/storage:@another,test2@pam:PVEDatastoreUser:\n" % (R, T2, T)),
    ("%s\nrole:testrolesingle:VM.Allocate:\n\nrole:testrole:VM.Allocate,Datastore.Audit:\n\n" % R,  # sort_roles_and_privs
     "%s\n\n\n\nrole:testrole:Datastore.Audit,VM.Allocate:\nrole:testrolesingle:VM.Allocate:\n\n" % R),
    ("%s\n\ngroup:testgroup:does_not_exist::\n\n\n\n" % R, "%s\n\ngroup:testgroup:::\n\n\n\n" % R),  # group_inexisting_member
])
def test_user_cfg_written_as_pve_writes_it(raw, expected):
    assert access.UserConfig(raw).render() == (expected or raw)


# ---- the API and pveum on a node root ------------------------------------------------------------------------------

def pveum(root, *args):
    r = subprocess.run([NODE_PY, PVEUM] + list(args), env=root.env(LANG="C.UTF-8"), capture_output=True, text=True,
                       timeout=60, check=False)
    return r


def new_token(root, name, *extra):
    r = pveum(root, "user", "token", "add", "root@pam", name, "--output-format", "json", *extra)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["full-tokenid"] == "root@pam!" + name
    return out["value"]


def api(server, root, method, url, tokenid, secret, **data):
    kw = dict(params=data) if method == "GET" else dict(data=data or None)
    return requests.request(method, "https://%s/api2/json%s" % (server, url), **kw,
                            headers={"Authorization": "PVEAPIToken=%s=%s" % (tokenid, secret)},
                            verify=root.cred["ca_path"], timeout=30)


def test_privsep_token_refused_per_path_with_pves_words(server, pveroot):  # noqa: F811
    secret = new_token(pveroot, "sep", "--privsep", "1")
    tok = "root@pam!sep"
    r = api(server, pveroot, "GET", "/nodes/kpro5/lxc/129/status/current", tok, secret)
    assert (r.status_code, r.reason) == (403, "Permission check failed (/vms/129, VM.Audit)")
    assert api(server, pveroot, "GET", "/version", tok, secret).status_code == 200  # user => 'all'
    assert api(server, pveroot, "GET", "/nodes/kpro5/lxc", tok, secret).json()["data"] == []  # filtered by VM.Audit
    assert api(server, pveroot, "GET", "/access/permissions", tok, secret, path="/vms/129").json()["data"] == {
        "/vms/129": {}}
    # a role with VM.Audit only: reads pass, a start is refused naming the privilege and the path
    assert pveum(pveroot, "role", "add", "AuditOnly", "--privs", "VM.Audit").returncode == 0
    assert pveum(pveroot, "acl", "modify", "/vms/129", "--tokens", tok, "--roles", "AuditOnly").returncode == 0
    assert api(server, pveroot, "GET", "/nodes/kpro5/lxc/129/status/current", tok, secret).json()["data"]["vmid"] == 129
    assert [c["vmid"] for c in api(server, pveroot, "GET", "/nodes/kpro5/lxc", tok, secret).json()["data"]] == [129]
    r = api(server, pveroot, "POST", "/nodes/kpro5/lxc/129/status/start", tok, secret)
    assert (r.status_code, r.reason) == (403, "Permission check failed (/vms/129, VM.PowerMgmt)")
    assert pveroot.state()["guests"].get("129", {}).get("status") != "running"
    # another token's privileges need Sys.Audit on /access (AccessControl.pm:502-507)
    r = api(server, pveroot, "GET", "/access/permissions", tok, secret, userid="root@pam!ansible")
    assert (r.status_code, r.reason) == (403, "Permission check failed (/access, Sys.Audit)")


def test_the_readme_role_lets_the_token_start_and_follow_its_task(server, pveroot):  # noqa: F811
    secret = new_token(pveroot, "kpro")
    tok = "root@pam!kpro"
    assert pveum(pveroot, "role", "add", "KproGpuServing", "--privs", "VM.Audit VM.PowerMgmt").returncode == 0
    assert pveum(pveroot, "acl", "modify", "/vms/129", "--tokens", tok, "--roles", "KproGpuServing").returncode == 0
    assert api(server, pveroot, "GET", "/access/permissions", tok, secret, path="/vms/129").json()["data"] == {
        "/vms/129": {"VM.Audit": 1, "VM.PowerMgmt": 1}}
    assert api(server, pveroot, "GET", "/access/permissions", tok, secret, path="/").json()["data"] == {"/": {}}
    upid = api(server, pveroot, "POST", "/nodes/kpro5/lxc/129/status/start", tok, secret).json()["data"]
    assert upid.endswith(":root@pam!kpro:")
    r = api(server, pveroot, "GET", "/nodes/kpro5/tasks/%s/status" % upid, tok, secret)  # its own task: no privilege
    assert r.status_code == 200 and r.json()["data"]["upid"] == upid
    r = api(server, pveroot, "GET", "/nodes/kpro5/lxc/130/status/current", tok, secret)
    assert (r.status_code, r.reason) == (403, "Permission check failed (/vms/130, VM.Audit)")
    r = api(server, pveroot, "GET", "/nodes/kpro5/status", tok, secret)
    assert (r.status_code, r.reason) == (403, "Permission check failed (/nodes/kpro5, Sys.Audit)")
    with open(pveroot.p("etc/pve/user.cfg")) as f:
        text = f.read()
    assert "token:root@pam!kpro:0:1::\n" in text and "role:KproGpuServing:VM.Audit,VM.PowerMgmt:\n" in text
    assert "acl:1:/vms/129:root@pam!kpro:KproGpuServing:\n" in text


def test_pveum_refuses_as_pve(pveroot):  # noqa: F811
    assert pveum(pveroot, "role", "add", "KproGpuServing").returncode == 0
    r = pveum(pveroot, "role", "add", "KproGpuServing")
    assert r.returncode == 255 and "role 'KproGpuServing' already exists" in r.stderr
    r = pveum(pveroot, "role", "add", "X", "--privs", "VM.Bogus")
    assert r.returncode == 255 and "privs: invalid format - invalid privilege 'VM.Bogus'" in r.stderr
    r = pveum(pveroot, "acl", "modify", "/vms/129", "--tokens", "root@pam!nosuch", "--roles", "KproGpuServing")
    assert r.returncode == 255 and "no such token 'nosuch' for user 'root@pam'" in r.stderr
    r = pveum(pveroot, "acl", "modify", "/vms/12", "--tokens", "root@pam!ansible", "--roles", "KproGpuServing")
    assert r.returncode == 255 and "path: invalid ACL path '/vms/12'" in r.stderr
    new_token(pveroot, "dup")
    r = pveum(pveroot, "user", "token", "add", "root@pam", "dup")
    assert r.returncode == 255 and "tokenid: Token already exists." in r.stderr
    r = pveum(pveroot, "user", "token", "permissions", "root@pam", "dup", "--path", "/vms/129")
    assert r.returncode == 0 and "Permissions marked with '(*)' have the 'propagate' flag set." in r.stdout


def test_token_unknown_to_user_cfg_is_refused(server, pveroot):  # noqa: F811
    """verify_token (AccessControl.pm:489-497): a secret in token.cfg is not enough without the token in user.cfg."""
    with open(pveroot.p("etc/pve/priv/token.cfg"), "a") as f:
        f.write("root@pam!ghost 11111111-2222-3333-4444-555555555555\n")
    r = api(server, pveroot, "GET", "/version", "root@pam!ghost", "11111111-2222-3333-4444-555555555555")
    assert r.status_code == 401
