# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kpro.gpu_serving.pct against a fake paramiko client.

Two kinds of fake host: a recorder (asserts the exact command lines sent over SSH) and a
"real shell" host that runs each command line with bash, the way sshd hands it to root's
login shell, with a stub ``pct`` (exec/push/pull on the local filesystem) — so quoting is
proven end to end, not only compared with a string.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import threading

import paramiko
import pytest
import yaml

from ansible import constants as C
from ansible.errors import AnsibleAuthenticationFailure, AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import become_loader

from ansible_collections.kpro.gpu_serving.plugins.connection import pct as pct_mod

NAME = "kpro.gpu_serving.pct"


# ---------------------------------------------------------------------------------------------- fakes
class FakeChannel(object):
    def __init__(self, host):
        self.host = host
        self.command = None
        self.stdin = b""
        self.stdin_closed = False
        self._done = threading.Event()
        self._result = (0, b"", b"")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        pass

    def exec_command(self, command):
        self.command = command.decode() if isinstance(command, bytes) else command
        self.host.commands.append(self)

    def sendall(self, data):
        assert not self.stdin_closed
        self.stdin += data

    def shutdown_write(self):
        self.stdin_closed = True
        self._result = self.host.respond(self.command, self.stdin)
        self._done.set()

    def makefile(self, mode, bufsize=-1):
        self._done.wait(10)
        return io.BytesIO(self._result[1])

    def makefile_stderr(self, mode, bufsize=-1):
        self._done.wait(10)
        return io.BytesIO(self._result[2])

    def recv_exit_status(self):
        self._done.wait(10)
        return self._result[0]


class FakeTransport(object):
    def __init__(self, host):
        self.host = host

    def open_session(self):
        return FakeChannel(self.host)


class FakeSFTP(object):
    """SFTP on the local filesystem, remembering each operation."""

    def __init__(self, host):
        self.host = host

    def mkdir(self, path, mode=0o777):
        self.host.sftp_ops.append(("mkdir", path, mode))
        os.mkdir(path, mode)

    def put(self, local, remote):
        self.host.sftp_ops.append(("put", local, remote))
        with open(local, "rb") as src, open(remote, "wb") as dst:
            dst.write(src.read())

    def get(self, remote, local):
        self.host.sftp_ops.append(("get", remote, local))
        with open(remote, "rb") as src, open(local, "wb") as dst:
            dst.write(src.read())

    def close(self):
        self.host.sftp_ops.append(("close",))


class FakeHost(object):
    """The Proxmox host as the plugin sees it through paramiko."""

    def __init__(self, responder=None):
        self.responder = responder or (lambda cmd, stdin: (0, b"", b""))
        self.commands = []
        self.sftp_ops = []
        self.client = None

    def respond(self, command, stdin):
        return self.responder(command, stdin)


class FakeSSHClient(object):
    host = None  # set by the fixture

    def __init__(self):
        self.known_hosts_loaded = []
        self.policy = None
        self.connect_kwargs = None
        self.closed = False
        FakeSSHClient.host.client = self

    def load_system_host_keys(self, filename=None):
        self.known_hosts_loaded.append(filename)

    def set_missing_host_key_policy(self, policy):
        self.policy = policy

    def connect(self, hostname, **kwargs):
        self.connect_kwargs = dict(kwargs, hostname=hostname)
        exc = getattr(FakeSSHClient.host, "connect_error", None)
        if exc is not None:
            raise exc

    def get_transport(self):
        return FakeTransport(FakeSSHClient.host)

    def open_sftp(self):
        return FakeSFTP(FakeSSHClient.host)

    def close(self):
        self.closed = True


def real_shell_responder(tmp_path, container_root=None):
    """Run the command line with bash (as root's login shell would) with a stub pct on PATH position."""
    def respond(command, stdin):
        p = subprocess.run(["/bin/bash", "-c", command], input=stdin, capture_output=True, timeout=30)
        return p.returncode, p.stdout, p.stderr
    return respond


PCT_STUB = r"""#!/bin/sh
# stand-in for pct: exec runs in "the container" (here: the same machine), push/pull copy files
cmd=$1; shift
case "$cmd" in
  exec) vmid=$1; shift; [ "$vmid" = 129 ] || { echo "Configuration file 'nodes/kpro5/lxc/$vmid.conf' does not exist" >&2; exit 2; }
        [ "$1" = "--" ] && shift; exec "$@" ;;
  push) [ "$1" = 129 ] || exit 2; cp "$2" "$3" ;;
  pull) [ "$1" = 129 ] || exit 2; cp "$2" "$3" ;;
  *) echo "unknown command 'pct $cmd'" >&2; exit 255 ;;
esac
"""


@pytest.fixture
def host(monkeypatch):
    h = FakeHost()
    FakeSSHClient.host = h
    monkeypatch.setattr(pct_mod.paramiko, "SSHClient", FakeSSHClient)
    return h


def make_conn(tmp_path, **options):
    doc = yaml.safe_load(pct_mod.DOCUMENTATION)
    C.config.initialize_plugin_configuration_definitions("connection", NAME, doc["options"])
    conn = pct_mod.Connection(PlayContext())
    conn._load_name = NAME
    variables = {"pct_host": "10.213.5.2", "pve_vmid": 129, "pct_known_hosts_file": str(tmp_path / "known_hosts"),
                 "pct_host_tmpdir": str(tmp_path)}
    variables.update(options)
    conn.set_options(var_options=variables)
    return conn


def pct_exec_line(inner, vmid=129, pct="/usr/sbin/pct"):
    return shlex.join([pct, "exec", str(vmid), "--", "/bin/sh", "-c", 'export HOME="${HOME:-/root}"; ' + inner])


# ---------------------------------------------------------------------------------------------- connect
def test_connect_rejects_unknown_host_keys_by_default(host, tmp_path):
    (tmp_path / "known_hosts").write_text("10.213.5.2 ssh-ed25519 AAAA\n")
    conn = make_conn(tmp_path, pct_private_key_file=str(tmp_path / "id_ed25519"))
    conn._connect()
    c = host.client
    assert isinstance(c.policy, paramiko.RejectPolicy)
    assert c.known_hosts_loaded == [str(tmp_path / "known_hosts")] + (
        [pct_mod.SYSTEM_KNOWN_HOSTS] if os.path.exists(pct_mod.SYSTEM_KNOWN_HOSTS) else [])
    kw = c.connect_kwargs
    assert kw["hostname"] == "10.213.5.2" and kw["port"] == 22 and kw["username"] == "root"
    assert kw["key_filename"] == str(tmp_path / "id_ed25519") and kw["look_for_keys"] is False
    assert kw["timeout"] == 10 and kw["banner_timeout"] == 10 and kw["auth_timeout"] == 10
    assert conn.connected


def test_host_key_checking_off_is_explicit_and_warns(host, tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(pct_mod.display, "warning", lambda msg, *a, **k: warnings.append(msg))
    conn = make_conn(tmp_path, pct_host_key_checking=False, pct_port=2222, pct_user="ansible", pct_timeout=3)
    conn._connect()
    assert isinstance(host.client.policy, paramiko.AutoAddPolicy)
    assert warnings and "host key checking is off" in warnings[0]
    assert host.client.connect_kwargs["port"] == 2222 and host.client.connect_kwargs["username"] == "ansible"
    assert host.client.connect_kwargs["look_for_keys"] is True


def test_unknown_host_key_names_the_fix(host, tmp_path):
    host.connect_error = paramiko.SSHException("Server '10.213.5.2' not found in known_hosts")
    conn = make_conn(tmp_path)
    with pytest.raises(AnsibleConnectionFailure) as e:
        conn._connect()
    assert "ssh-keyscan -p 22 10.213.5.2 >>" in str(e.value) and "unknown" in str(e.value)


def test_changed_host_key_is_refused(host, tmp_path):
    key = paramiko.RSAKey.generate(1024)
    host.connect_error = paramiko.BadHostKeyException("10.213.5.2", key, key)
    with pytest.raises(AnsibleConnectionFailure) as e:
        make_conn(tmp_path)._connect()
    assert "host key of 10.213.5.2 changed" in str(e.value)


def test_authentication_failure(host, tmp_path):
    host.connect_error = paramiko.AuthenticationException("Authentication failed.")
    with pytest.raises(AnsibleAuthenticationFailure):
        make_conn(tmp_path)._connect()


def test_missing_host_or_vmid(host, tmp_path):
    with pytest.raises(AnsibleConnectionFailure, match="pct_host is not set"):
        make_conn(tmp_path, pct_host=None)._connect()
    conn = make_conn(tmp_path)
    conn.set_options(var_options={"pct_host": "10.213.5.2"})
    with pytest.raises(AnsibleConnectionFailure, match="pct_vmid is not set"):
        conn._connect()


def test_vmid_from_pct_vmid_wins_over_pve_vmid(host, tmp_path):
    conn = make_conn(tmp_path, pct_vmid=130)
    conn.exec_command("true")
    assert host.commands[0].command == pct_exec_line("true", vmid=130)


# ---------------------------------------------------------------------------------------------- exec
TRICKY = [
    "/bin/sh -c 'echo ~ && echo \"$HOME\"'",
    "echo 'single '\"'\"' quote' \"double \\\" quote\" $((1+2)) `echo backtick` ; echo semi",
    "printf '%s\\n' 'a  b' \"c\\td\" && echo $'x'",
    "echo 'new\nline' | cat",
    "echo ünïcödé ✓",
]


def test_exec_command_line_is_exact(host, tmp_path):
    host.responder = lambda cmd, stdin: (0, b"out", b"err")
    conn = make_conn(tmp_path)
    cmd = "/bin/sh -c '( umask 77 && mkdir -p \"` echo ~/.ansible/tmp `\" ) && sleep 0'"
    rc, out, err = conn.exec_command(cmd)
    assert (rc, out, err) == (0, b"out", b"err")
    sent = host.commands[0]
    assert sent.command == pct_exec_line(cmd)
    assert sent.command.startswith("/usr/sbin/pct exec 129 -- /bin/sh -c ")
    assert sent.stdin == b"" and sent.stdin_closed


def test_exec_sudo_on_host_and_custom_pct(host, tmp_path):
    conn = make_conn(tmp_path, pct_sudo=True, pct_command="/usr/local/sbin/pct")
    conn.exec_command("id -u")
    assert host.commands[0].command == "sudo -n -- " + pct_exec_line("id -u", pct="/usr/local/sbin/pct")


def test_pipelining_sends_stdin(host, tmp_path):
    host.responder = lambda cmd, stdin: (0, stdin[::-1], b"")
    conn = make_conn(tmp_path)
    assert conn.is_pipelining_enabled() is True
    rc, out, err = conn.exec_command("/usr/bin/python3", in_data=b"print('hi')" * 10000)
    assert host.commands[0].stdin == b"print('hi')" * 10000 and out == (b"print('hi')" * 10000)[::-1]


def test_pipelining_can_be_turned_off(host, tmp_path):
    assert make_conn(tmp_path, ansible_pipelining=False).is_pipelining_enabled() is False


@pytest.mark.parametrize("cmd", TRICKY)
def test_tricky_commands_survive_two_shells(host, tmp_path, cmd):
    """The host's bash parses the line, pct runs /bin/sh -c in 'the container': same result as running cmd locally."""
    stub = tmp_path / "pct"
    stub.write_text(PCT_STUB)
    stub.chmod(0o755)
    host.responder = real_shell_responder(tmp_path)
    conn = make_conn(tmp_path, pct_command=str(stub))
    rc, out, err = conn.exec_command(cmd)
    expect = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, env=dict(os.environ, HOME=os.environ.get("HOME", "/root")))
    assert (rc, out, err) == (expect.returncode, expect.stdout, expect.stderr)


def test_exit_status_and_stderr_of_the_command(host, tmp_path):
    stub = tmp_path / "pct"
    stub.write_text(PCT_STUB)
    stub.chmod(0o755)
    host.responder = real_shell_responder(tmp_path)
    conn = make_conn(tmp_path, pct_command=str(stub))
    assert conn.exec_command("echo oops >&2; exit 3") == (3, b"", b"oops\n")
    assert conn.exec_command("cat", in_data=b"piped\n") == (0, b"piped\n", b"")
    assert conn.exec_command("cat") == (0, b"", b"")  # stdin is closed: no hang


def test_home_is_set_when_pct_clears_the_environment(host, tmp_path):
    stub = tmp_path / "pct"
    stub.write_text(PCT_STUB.replace('exec "$@"', 'exec env -i PATH=/usr/bin:/bin "$@"'))
    stub.chmod(0o755)
    host.responder = real_shell_responder(tmp_path)
    conn = make_conn(tmp_path, pct_command=str(stub))
    assert conn.exec_command("echo ~/.ansible/tmp")[1] == b"/root/.ansible/tmp\n"


# pve-container src/PVE/CLI/pct.pm: exec/enter (244, 204), push (752), pull (664: no "\n", Perl adds where)
PCT_NOT_RUNNING = [
    b"container '129' not running!\n",
    b"can only push files to a running CT\n",
    b"can only pull files from a running VM at /usr/share/perl5/PVE/CLI/pct.pm line 664.\n",
]


@pytest.mark.parametrize("stderr", PCT_NOT_RUNNING)
def test_stopped_container_is_unreachable_in_pcts_real_words(host, tmp_path, stderr):
    host.responder = lambda cmd, stdin: (255, b"", stderr)
    with pytest.raises(AnsibleConnectionFailure, match=r"container 129 is not running on 10\.213\.5\.2") as e:
        make_conn(tmp_path).exec_command("true")
    assert stderr.decode().strip() in str(e.value) and "pct start 129" in str(e.value)


def test_pct_failure_is_unreachable(host, tmp_path):
    host.responder = lambda cmd, stdin: (2, b"", b"Configuration file 'nodes/kpro5/lxc/129.conf' does not exist\n")
    with pytest.raises(AnsibleConnectionFailure, match="does not exist"):
        make_conn(tmp_path).exec_command("true")
    host.responder = lambda cmd, stdin: (127, b"", b"bash: line 1: /usr/sbin/pct: No such file or directory\n")
    with pytest.raises(AnsibleConnectionFailure, match="No such file"):
        make_conn(tmp_path).exec_command("true")
    # the command's own failure is not the connection's
    host.responder = lambda cmd, stdin: (1, b"", b"grep: CT 129 missing\n")
    assert make_conn(tmp_path).exec_command("grep x y")[0] == 1


def test_become_success_line_is_stripped(host, tmp_path):
    conn = make_conn(tmp_path)
    become = become_loader.get("sudo")
    become.set_options(direct={"become_user": "nobody"})
    conn.set_become_plugin(become)
    cmd = become.build_become_command("/bin/sh -c 'echo {}'", conn._shell)
    host.responder = lambda c, stdin: (0, ("BECOME-SUCCESS-%s\n{}\n" % become.success).encode(), b"")
    rc, out, err = conn.exec_command(cmd)
    assert out == b"{}\n"
    assert host.commands[0].command == pct_exec_line(cmd)


def test_become_password_prompt_is_refused(host, tmp_path):
    conn = make_conn(tmp_path)
    become = become_loader.get("sudo")
    become.set_options(direct={"become_user": "nobody", "become_pass": "secret"})
    conn.set_become_plugin(become)
    cmd = become.build_become_command("true", conn._shell)
    with pytest.raises(AnsibleError, match="password prompt is not supported"):
        conn.exec_command(cmd)
    assert host.commands == []


# ---------------------------------------------------------------------------------------------- files
def test_put_file_sequence(host, tmp_path):
    src = tmp_path / "module.py"
    src.write_bytes(b"payload")
    conn = make_conn(tmp_path)
    conn.put_file(str(src), "/root/.ansible/tmp/x/AnsiballZ_ping.py")
    mkdir, put = host.sftp_ops[0], host.sftp_ops[1]
    assert mkdir[0] == "mkdir" and mkdir[2] == 0o700 and os.path.dirname(mkdir[1]) == str(tmp_path)
    assert os.path.basename(mkdir[1]).startswith(".kpro-pct-")
    staged = mkdir[1] + "/file"
    assert put == ("put", str(src), staged)
    assert len(host.commands) == 1
    assert host.commands[0].command == "%s; rc=$?; rm -rf -- %s; exit $rc" % (
        shlex.join(["/usr/sbin/pct", "push", "129", staged, "/root/.ansible/tmp/x/AnsiballZ_ping.py"]), shlex.quote(mkdir[1]))


def test_put_and_fetch_round_trip_with_spaces(host, tmp_path):
    stub = tmp_path / "pct"
    stub.write_text(PCT_STUB)
    stub.chmod(0o755)
    host.responder = real_shell_responder(tmp_path)
    conn = make_conn(tmp_path, pct_command=str(stub))
    src = tmp_path / "in file's name"
    src.write_bytes(b"\x00binary\xff" * 1000)
    ct = tmp_path / "container dir"
    ct.mkdir()
    conn.put_file(str(src), str(ct / "dest $x"))
    assert (ct / "dest $x").read_bytes() == src.read_bytes()
    conn.fetch_file(str(ct / "dest $x"), str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    # every staging directory is gone
    assert not [p for p in os.listdir(str(tmp_path)) if p.startswith(".kpro-pct-")]


def test_fetch_file_sequence(host, tmp_path):
    def respond(cmd, stdin):
        argv = shlex.split(cmd)
        if argv[1] == "pull":
            with open(argv[4], "wb") as f:
                f.write(b"remote content")
        return 0, b"", b""
    host.responder = respond
    conn = make_conn(tmp_path)
    conn.fetch_file("/etc/os-release", str(tmp_path / "out"))
    tmpdir = host.sftp_ops[0][1]
    assert [c.command for c in host.commands] == [
        shlex.join(["/usr/sbin/pct", "pull", "129", "/etc/os-release", tmpdir + "/file"]),
        shlex.join(["rm", "-rf", "--", tmpdir]),
    ]
    assert host.sftp_ops[1] == ("get", tmpdir + "/file", str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == b"remote content"


def test_put_missing_local_file(host, tmp_path):
    with pytest.raises(AnsibleFileNotFound):
        make_conn(tmp_path).put_file(str(tmp_path / "nope"), "/tmp/x")


def test_push_failure_is_reported_and_cleaned(host, tmp_path):
    src = tmp_path / "f"
    src.write_text("x")
    host.responder = lambda cmd, stdin: (2, b"", b"unable to open file '/nonexistent/x' - No such file or directory\n")
    with pytest.raises(AnsibleError, match="pct push .* failed .*No such file"):
        make_conn(tmp_path).put_file(str(src), "/nonexistent/x")
    assert "rm -rf --" in host.commands[0].command


def test_pull_failure_cleans_up(host, tmp_path):
    host.responder = lambda cmd, stdin: (2, b"", b"unable to open file - No such file\n") if " pull " in cmd else (0, b"", b"")
    with pytest.raises(AnsibleError, match="pct pull"):
        make_conn(tmp_path).fetch_file("/nope", str(tmp_path / "out"))
    assert host.commands[-1].command.startswith("rm -rf -- ")


def test_close(host, tmp_path):
    conn = make_conn(tmp_path)
    conn.exec_command("true")
    client = host.client
    conn._sftp_client()
    conn.close()
    assert client.closed and not conn.connected and host.sftp_ops[-1] == ("close",)
