# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kpro.gpu_serving.pct against a fake ``ssh`` executable.

The fake ssh records its argv (and whether it was given an askpass) and runs the remote command
line with bash, the way sshd hands it to root's login shell; a stub ``pct`` (exec/push/pull on the
local filesystem) stands for the container. So the command lines are asserted exactly, and
quoting, streaming and exit statuses are proven end to end, not only compared with a string.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml

from ansible import constants as C
from ansible.errors import AnsibleAuthenticationFailure, AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import become_loader

from ansible_collections.kpro.gpu_serving.plugins.connection import pct as pct_mod

NAME = "kpro.gpu_serving.pct"

FAKE_SSH = r"""#!%s
# stand-in for ssh: log argv, answer -O, fail as told, else run the remote command with bash
import json, os, subprocess, sys
argv = sys.argv[1:]
rec = {"argv": argv, "askpass": None, "askpass_require": os.environ.get("SSH_ASKPASS_REQUIRE")}
if os.environ.get("SSH_ASKPASS"):
    rec["askpass"] = subprocess.run([os.environ["SSH_ASKPASS"], "root@host's password: "], capture_output=True, text=True).stdout
with open(os.environ["FAKE_SSH_LOG"], "a") as f:
    f.write(json.dumps(rec) + "\n")
if "-O" in argv:
    sys.exit(0)
if os.environ.get("FAKE_SSH_RC"):
    sys.stderr.write(os.environ.get("FAKE_SSH_STDERR", ""))
    sys.exit(int(os.environ["FAKE_SSH_RC"]))
i = argv.index("--")
# root's .bashrc, which bash reads for an ssh command too, may print before the command runs
sys.stdout.write(os.environ.get("FAKE_SSH_BANNER", ""))
sys.stdout.flush()
os.execv("/bin/bash", ["bash", "-c", argv[i + 2]])
""" % sys.executable

PCT_STUB = r"""#!/bin/sh
# stand-in for pct: exec runs in "the container" (here: the same machine)
cmd=$1; shift
case "$cmd" in
  exec) vmid=$1; shift; [ "$vmid" = 129 ] || { echo "Configuration file 'nodes/kpro5/lxc/$vmid.conf' does not exist" >&2; exit 2; }
        [ "$1" = "--" ] && shift; exec "$@" ;;
  *) echo "unknown command 'pct $cmd'" >&2; exit 255 ;;
esac
"""


@pytest.fixture
def ssh(tmp_path, monkeypatch):
    """The fake ssh; ``ssh.calls()`` returns what it was run with."""
    exe = tmp_path / "ssh"
    exe.write_text(FAKE_SSH)
    exe.chmod(0o755)
    stub = tmp_path / "pct"
    stub.write_text(PCT_STUB)
    stub.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    for var in ("FAKE_SSH_RC", "FAKE_SSH_STDERR", "FAKE_SSH_BANNER", "ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_REMOTE_USER", "ANSIBLE_REMOTE_PORT",
                "ANSIBLE_PRIVATE_KEY_FILE", "ANSIBLE_SSH_COMMON_ARGS", "ANSIBLE_PCT_HOST_KEY_CHECKING"):
        monkeypatch.delenv(var, raising=False)

    class Ssh(object):
        path = str(exe)
        pct = str(stub)

        @staticmethod
        def calls():
            if not log.exists():
                return []
            return [json.loads(line) for line in log.read_text().splitlines()]

        @staticmethod
        def fail(rc, stderr):
            monkeypatch.setenv("FAKE_SSH_RC", str(rc))
            monkeypatch.setenv("FAKE_SSH_STDERR", stderr)
    return Ssh


def make_conn(tmp_path, ssh, **options):
    doc = yaml.safe_load(pct_mod.DOCUMENTATION)
    C.config.initialize_plugin_configuration_definitions("connection", NAME, doc["options"])
    conn = pct_mod.Connection(PlayContext())
    conn._load_name = NAME
    variables = {"pct_host": "10.213.5.2", "pve_vmid": 129, "pct_known_hosts_file": str(tmp_path / "known_hosts"),
                 "pct_control_path_dir": str(tmp_path / "cp"), "pct_ssh_executable": ssh.path, "pct_command": ssh.pct}
    variables.update(options)
    conn.set_options(var_options={k: v for k, v in variables.items() if v is not None})
    return conn


def split(argv):
    """(options before '--', destination, remote command or None)"""
    i = argv.index("--")
    return argv[:i], argv[i + 1], (argv[i + 2] if len(argv) > i + 2 else None)


def opts(argv):
    """The -o options as a dict (first value wins, as in ssh)."""
    out = {}
    for i, a in enumerate(argv):
        if a == "-o":
            k, v = argv[i + 1].split("=", 1)
            out.setdefault(k, v)
    return out


START = "printf '%s' " + shlex.quote(pct_mod.START.decode()) + "; "


def pct_exec_line(inner, vmid=129, pct="/usr/sbin/pct"):
    """The host's command line: the START line (see test_a_login_banner_...), then pct exec."""
    return START + shlex.join([pct, "exec", str(vmid), "--", "/bin/sh", "-c", 'export HOME="${HOME:-/root}"; ' + inner])


# ---------------------------------------------------------------------------------------------- the ssh command line
def test_defaults_strict_host_keys_batch_mode_and_one_shared_connection(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh, pct_private_key_file=str(tmp_path / "id_ed25519"))
    assert conn.exec_command("true")[0] == 0
    before, dest, command = split(ssh.calls()[0]["argv"])
    o = opts(before)
    assert dest == "10.213.5.2" and command == pct_exec_line("true", pct=ssh.pct)
    assert o["StrictHostKeyChecking"] == "yes" and o["BatchMode"] == "yes"
    assert o["UserKnownHostsFile"] == '"%s"' % (tmp_path / "known_hosts")
    assert o["ControlMaster"] == "auto" and o["ControlPersist"] == "60s"
    cp = o["ControlPath"].strip('"')
    assert os.path.dirname(cp) == str(tmp_path / "cp") and os.path.basename(cp).startswith("pct-")
    assert oct(os.stat(str(tmp_path / "cp")).st_mode & 0o777) == "0o700"
    assert o["ServerAliveInterval"] == "15" and o["ConnectTimeout"] == "10" and o["IdentitiesOnly"] == "yes"
    assert before[before.index("-i") + 1] == str(tmp_path / "id_ed25519")
    assert before[before.index("-p") + 1] == "22" and before[before.index("-l") + 1] == "root"
    assert "-T" in before and "-t" not in before


def test_standard_connection_variables(ssh, tmp_path):
    """ansible_user/port/private_key_file/host_key_checking/ssh_common_args, as community.proxmox.proxmox_pct_remote."""
    conn = make_conn(tmp_path, ssh, ansible_user="admin", ansible_port=2222, ansible_private_key_file="/k/id",
                     ansible_host_key_checking=False, ansible_ssh_common_args="-o ProxyJump=bastion -o 'SendEnv=A B'")
    conn.exec_command("true")
    argv = ssh.calls()[0]["argv"]
    before, dest, dummy = split(argv)
    assert before[before.index("-p") + 1] == "2222" and before[before.index("-l") + 1] == "admin"
    assert before[before.index("-i") + 1] == "/k/id"
    assert opts(before)["StrictHostKeyChecking"] == "accept-new"
    # the user's extra arguments come first: ssh takes the first value of an option
    assert argv[0:4] == ["-o", "ProxyJump=bastion", "-o", "SendEnv=A B"]


def test_pct_names_win_over_the_standard_ones(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh, ansible_user="admin", pct_user="root", ansible_port=2222, pct_port=22,
                     ansible_private_key_file="/k/a", pct_private_key_file="/k/b",
                     ansible_host_key_checking=False, pct_host_key_checking=True)
    conn.exec_command("true")
    before, dummy, dummy2 = split(ssh.calls()[0]["argv"])
    assert before[before.index("-l") + 1] == "root" and before[before.index("-p") + 1] == "22"
    assert before[before.index("-i") + 1] == "/k/b" and opts(before)["StrictHostKeyChecking"] == "yes"


def test_ansible_host_is_not_the_proxmox_host(ssh, tmp_path):
    """In the inventories a container's ansible_host is its own address (for ansible_connection=ssh); 192.0.2.0/24 is
    RFC 5737 documentation space, never a real host."""
    with pytest.raises(AnsibleConnectionFailure, match="pct_host is not set.*ansible_host is not read"):
        make_conn(tmp_path, ssh, pct_host=None, ansible_host="192.0.2.129")._connect()
    conn = make_conn(tmp_path, ssh, ansible_host="192.0.2.129")
    conn.exec_command("true")
    assert split(ssh.calls()[0]["argv"])[1] == "10.213.5.2"


def test_host_key_checking_from_the_environment_warns(ssh, tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(pct_mod.display, "warning", lambda msg, *a, **k: warnings.append(msg))
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    conn = make_conn(tmp_path, ssh)
    conn.exec_command("true")
    assert opts(ssh.calls()[0]["argv"])["StrictHostKeyChecking"] == "accept-new"
    assert warnings and "host key checking is off" in warnings[0]


def test_shared_connection_per_host_and_settings(ssh, tmp_path):
    def control_path(**kw):
        return make_conn(tmp_path, ssh, **kw)._control_path()
    base = control_path()
    assert control_path(pve_vmid=130) == base  # every container of a host shares the host's connection
    assert control_path(pct_private_key_file="/other") != base
    assert control_path(pct_known_hosts_file=str(tmp_path / "empty")) != base
    assert control_path(pct_host_key_checking=False) != base
    assert control_path(pct_user="admin") != base and control_path(pct_host="10.213.5.3") != base
    # a new version of the known_hosts file (a rebuilt host, the lab brought up again): a new connection
    (tmp_path / "known_hosts").write_text("10.213.5.2 ssh-ed25519 AAAA\n")
    written = control_path()
    assert written != base and control_path() == written


def test_control_persist_no_is_a_connection_per_command(ssh, tmp_path):
    make_conn(tmp_path, ssh, pct_control_persist="no").exec_command("true")
    o = opts(ssh.calls()[0]["argv"])
    assert "ControlMaster" not in o and "ControlPath" not in o


def test_paths_are_quoted_for_ssh(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh, pct_known_hosts_file="/a b/100%/known_hosts")
    conn.exec_command("true")
    assert opts(ssh.calls()[0]["argv"])["UserKnownHostsFile"] == '"/a b/100%%/known_hosts"'


def test_missing_host_or_vmid(ssh, tmp_path):
    with pytest.raises(AnsibleConnectionFailure, match="pct_host is not set"):
        make_conn(tmp_path, ssh, pct_host=None)._connect()
    with pytest.raises(AnsibleConnectionFailure, match="pct_vmid is not set"):
        make_conn(tmp_path, ssh, pve_vmid=None)._connect()


def test_vmid_from_pct_vmid_wins_over_pve_vmid(ssh, tmp_path):
    with pytest.raises(AnsibleConnectionFailure, match="cannot reach CT 130"):
        make_conn(tmp_path, ssh, pct_vmid=130).exec_command("true")
    assert split(ssh.calls()[0]["argv"])[2] == pct_exec_line("true", vmid=130, pct=ssh.pct)


def test_no_ssh_client(ssh, tmp_path):
    with pytest.raises(AnsibleConnectionFailure, match="OpenSSH client is needed"):
        make_conn(tmp_path, ssh, pct_ssh_executable=str(tmp_path / "no-ssh")).exec_command("true")


# ---------------------------------------------------------------------------------------------- password
def test_password_is_in_no_argv_and_reaches_ssh_through_askpass(ssh, tmp_path):
    secret = "s3cr'et $(pw) \"x\""
    conn = make_conn(tmp_path, ssh, ansible_password=secret)
    assert conn.exec_command("true")[0] == 0
    call = ssh.calls()[0]
    assert not [a for a in call["argv"] if "s3cr" in a]
    assert call["askpass"] == secret + "\n" and call["askpass_require"] == "force"
    o = opts(call["argv"])
    assert "BatchMode" not in o and o["NumberOfPasswordPrompts"] == "1"
    askpass = tmp_path / "cp" / pct_mod.ASKPASS_NAME
    assert "s3cr" not in askpass.read_text() and askpass.stat().st_mode & 0o777 == 0o700
    # not passed on to a later connection without a password
    make_conn(tmp_path, ssh).exec_command("true")
    assert ssh.calls()[1]["askpass"] is None


# ---------------------------------------------------------------------------------------------- exec
TRICKY = [
    "/bin/sh -c 'echo ~ && echo \"$HOME\"'",
    "echo 'single '\"'\"' quote' \"double \\\" quote\" $((1+2)) `echo backtick` ; echo semi",
    "printf '%s\\n' 'a  b' \"c\\td\" && echo $'x'",
    "echo 'new\nline' | cat",
    "echo ünïcödé ✓",
]


def test_exec_sudo_on_host(ssh, tmp_path):
    make_conn(tmp_path, ssh, pct_sudo=True, pct_command="/usr/local/sbin/pct").exec_command("id -u")
    assert split(ssh.calls()[0]["argv"])[2] == START + "sudo -n -- " + pct_exec_line("id -u", pct="/usr/local/sbin/pct")[len(START):]


def test_pipelining_sends_stdin(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh)
    assert conn.is_pipelining_enabled() is True
    data = b"print('hi')\n" * 100000
    rc, out, err = conn.exec_command("cat; echo done >&2", in_data=data)
    assert (rc, out, err) == (0, data, b"done\n")


def test_pipelining_can_be_turned_off(ssh, tmp_path):
    assert make_conn(tmp_path, ssh, ansible_pipelining=False).is_pipelining_enabled() is False


@pytest.mark.parametrize("cmd", TRICKY)
def test_tricky_commands_survive_two_shells(ssh, tmp_path, cmd):
    """The host's bash parses the line, pct runs /bin/sh -c in 'the container': same result as running cmd locally."""
    rc, out, err = make_conn(tmp_path, ssh).exec_command(cmd)
    expect = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, env=dict(os.environ, HOME=os.environ.get("HOME", "/root")))
    assert (rc, out, err) == (expect.returncode, expect.stdout, expect.stderr)


def test_exit_status_and_separate_stderr(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh)
    assert conn.exec_command("echo out; echo oops >&2; exit 3") == (3, b"out\n", b"oops\n")
    assert conn.exec_command("cat", in_data=b"piped\n") == (0, b"piped\n", b"")
    assert conn.exec_command("cat") == (0, b"", b"")  # no input: EOF, no hang
    assert conn.exec_command("exit 255") == (255, b"", b"")  # the command's own 255 is not ssh's


def test_home_is_set_when_pct_clears_the_environment(ssh, tmp_path):
    stub = tmp_path / "pct-env"
    stub.write_text(PCT_STUB.replace('exec "$@"', 'exec env -i PATH=/usr/bin:/bin "$@"'))
    stub.chmod(0o755)
    assert make_conn(tmp_path, ssh, pct_command=str(stub)).exec_command("echo ~/.ansible/tmp")[1] == b"/root/.ansible/tmp\n"


# pve-container src/PVE/CLI/pct.pm: exec/enter (244, 204), push (752), pull (664: no "\n", Perl adds where)
PCT_NOT_RUNNING = [
    "container '129' not running!\n",
    "can only push files to a running CT\n",
    "can only pull files from a running VM at /usr/share/perl5/PVE/CLI/pct.pm line 664.\n",
]


@pytest.mark.parametrize("stderr", PCT_NOT_RUNNING)
def test_stopped_container_is_unreachable_in_pcts_real_words(ssh, tmp_path, stderr):
    ssh.fail(255, stderr)
    with pytest.raises(AnsibleConnectionFailure, match=r"container 129 is not running on 10\.213\.5\.2") as e:
        make_conn(tmp_path, ssh).exec_command("true")
    assert stderr.strip() in str(e.value) and "pct start 129" in str(e.value)


def test_pct_failure_is_unreachable(ssh, tmp_path):
    with pytest.raises(AnsibleConnectionFailure, match="nodes/kpro5/lxc/999.conf' does not exist"):
        make_conn(tmp_path, ssh, pve_vmid=999).exec_command("true")
    with pytest.raises(AnsibleConnectionFailure, match="No such file"):
        make_conn(tmp_path, ssh, pct_command="/nonexistent/pct").exec_command("true")
    # the command's own failure is not the connection's
    assert make_conn(tmp_path, ssh).exec_command("echo 'grep: CT 129 missing' >&2; exit 1")[0] == 1


# OpenSSH's own words (openssh-portable sshconnect.c, sshconnect2.c, ssh.c)
SSH_FAILURES = [
    ("No ED25519 host key is known for 10.213.5.2 and you have requested strict checking.\nHost key verification failed.\n",
     AnsibleConnectionFailure, r"(?s)host key of 10\.213\.5\.2 is unknown.*ssh-keyscan -p 22 10\.213\.5\.2 >>"),
    ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
     "Host key for 10.213.5.2 has changed and you have requested strict checking.\nHost key verification failed.\n",
     AnsibleConnectionFailure, r"host key of 10\.213\.5\.2 changed"),
    ("root@10.213.5.2: Permission denied (publickey,password).\n", AnsibleAuthenticationFailure, "authentication as root"),
    ("ssh: connect to host 10.213.5.2 port 22: Connection refused\n", AnsibleConnectionFailure, "Connection refused"),
    ("Timeout, server 10.213.5.2 not responding.\n", AnsibleConnectionFailure, "not responding"),
]


@pytest.mark.parametrize("stderr,exc,match", SSH_FAILURES)
def test_ssh_failures_are_unreachable_with_the_fix(ssh, tmp_path, stderr, exc, match):
    ssh.fail(255, stderr)
    with pytest.raises(exc, match=match):
        make_conn(tmp_path, ssh).exec_command("true")


def test_become_success_line_is_stripped(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh)
    become = become_loader.get("sudo")
    become.set_options(direct={"become_user": "nobody"})
    conn.set_become_plugin(become)
    become.build_become_command("/bin/sh -c 'echo {}'", conn._shell)  # sets the success marker
    rc, out, err = conn.exec_command("echo BECOME-SUCCESS-%s; echo '{}'" % become.success)
    assert out == b"{}\n"


def test_become_password_prompt_is_refused(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh)
    become = become_loader.get("sudo")
    become.set_options(direct={"become_user": "nobody", "become_pass": "secret"})
    conn.set_become_plugin(become)
    cmd = become.build_become_command("true", conn._shell)
    with pytest.raises(AnsibleError, match="password prompt is not supported"):
        conn.exec_command(cmd)
    assert ssh.calls() == []


# ---------------------------------------------------------------------------------------------- files
def test_put_file_streams_into_the_container(ssh, tmp_path):
    src = tmp_path / "module.py"
    src.write_bytes(b"payload")
    dest = tmp_path / "ct" / "AnsiballZ_ping.py"
    dest.parent.mkdir()
    make_conn(tmp_path, ssh).put_file(str(src), str(dest))
    assert dest.read_bytes() == b"payload"
    assert split(ssh.calls()[0]["argv"])[2] == START + shlex.join([ssh.pct, "exec", "129", "--", "/bin/sh", "-c", 'cat > "$1"', "sh", str(dest)])


def test_put_and_fetch_round_trip_with_odd_names(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh)
    src = tmp_path / "in file's name"
    src.write_bytes(os.urandom(3 * 2 ** 20) + b"\x00binary\xff")
    ct = tmp_path / "container dir"
    ct.mkdir()
    conn.put_file(str(src), str(ct / "dest $x `y`"))
    assert (ct / "dest $x `y`").read_bytes() == src.read_bytes()
    conn.fetch_file(str(ct / "dest $x `y`"), str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    assert split(ssh.calls()[1]["argv"])[2] == START + shlex.join(
        [ssh.pct, "exec", "129", "--", "/bin/sh", "-c", 'exec cat -- "$1"', "sh", str(ct / "dest $x `y`")])


def test_put_missing_local_file(ssh, tmp_path):
    with pytest.raises(AnsibleFileNotFound):
        make_conn(tmp_path, ssh).put_file(str(tmp_path / "nope"), "/tmp/x")


def test_put_failure_is_reported(ssh, tmp_path):
    src = tmp_path / "f"
    src.write_text("x")
    with pytest.raises(AnsibleError, match=r"copying .* to CT 129:/nonexistent/x failed \(rc=\d+\): .*nonexistent"):
        make_conn(tmp_path, ssh).put_file(str(src), "/nonexistent/x")


def test_fetch_failure_leaves_no_file(ssh, tmp_path):
    with pytest.raises(AnsibleError, match="fetching CT 129:/nope failed"):
        make_conn(tmp_path, ssh).fetch_file("/nope", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_put_to_a_stopped_container(ssh, tmp_path):
    src = tmp_path / "f"
    src.write_text("x")
    ssh.fail(255, "container '129' not running!\n")
    with pytest.raises(AnsibleConnectionFailure, match="not running"):
        make_conn(tmp_path, ssh).put_file(str(src), "/tmp/x")


# ---------------------------------------------------------------------------------------------- reset
def test_reset_closes_the_shared_connection(ssh, tmp_path):
    conn = make_conn(tmp_path, ssh)
    conn.reset()
    assert ssh.calls() == []  # no socket, nothing to close
    path = conn._control_path()
    open(path, "w").close()
    conn.reset()
    before, dest, command = split(ssh.calls()[0]["argv"])
    assert before[-2:] == ["-O", "exit"] and dest == "10.213.5.2" and command is None
    assert opts(before)["ControlPath"] == '"%s"' % path


def test_a_login_banner_on_the_host_reaches_neither_a_command_nor_a_fetched_file(ssh, tmp_path, monkeypatch):
    """What the host's login shell prints before the command (root's .bashrc runs for an ssh command on Debian) is
    dropped up to the START line: a raw task's lines, a module's JSON and a fetched file are the container's own."""
    monkeypatch.setenv("FAKE_SSH_BANNER", "Welcome to kpro5\n--- not the start ---\n{\"json\": \"from the banner\"}\n")
    conn = make_conn(tmp_path, ssh)
    rc, out, err = conn.exec_command("printf 'present\\n6.8.12-9-pve\\n'")
    assert (rc, out, err) == (0, b"present\n6.8.12-9-pve\n", b"")
    src = tmp_path / "big"
    src.write_bytes(b"x" * (3 * 2 ** 20) + b"end")
    conn.fetch_file(str(src), str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    # a file that itself holds the START line keeps it: only the first one, before the file's bytes, is dropped
    twice = tmp_path / "twice"
    twice.write_bytes(pct_mod.START + b"data")
    conn.fetch_file(str(twice), str(tmp_path / "twice-back"))
    assert (tmp_path / "twice-back").read_bytes() == pct_mod.START + b"data"
