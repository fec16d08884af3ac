# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: pct
short_description: Run tasks in a Proxmox VE LXC container through C(pct) on its host, over SSH (paramiko)
version_added: "0.1.0"
description:
  - Connects with SSH (paramiko) to the Proxmox VE host that runs the container and enters the container with
    C(pct exec <vmid> -- /bin/sh -c <command>), so the container needs no SSH server, no address reachable from the
    controller and no key of its own. Modelled on C(community.proxmox.proxmox_pct_remote), which is not a
    dependency of this collection.
  - Files are sent with SFTP to a private temporary directory on the host and moved into the container with
    C(pct push); fetched with C(pct pull) and then SFTP. The temporary directory is removed each time.
  - Host keys are verified against O(pct_known_hosts_file) (and C(/etc/ssh/ssh_known_hosts)); an unknown or changed
    host key is refused unless O(pct_host_key_checking=false).
  - The command runs as root in the container (C(pct exec) always does); C(become) without a password works, a
    become password prompt is not supported.
  - Pipelining is on by default (one C(pct exec) per module instead of several).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
requirements:
  - paramiko (on the controller)
  - C(pct) on the Proxmox host and C(/bin/sh) in the container
options:
  pct_host:
    description:
      - Address (or name) of the Proxmox VE host that runs the container. Required.
    type: str
    vars:
      - name: pct_host
      - name: ansible_pct_host
    env:
      - name: ANSIBLE_PCT_HOST
  pct_port:
    description: SSH port of the Proxmox host.
    type: int
    default: 22
    vars:
      - name: pct_port
      - name: ansible_pct_port
    env:
      - name: ANSIBLE_PCT_PORT
    ini:
      - section: pct_connection
        key: port
  pct_user:
    description:
      - SSH user on the Proxmox host. C(pct) needs root; with another user set O(pct_sudo=true).
    type: str
    default: root
    vars:
      - name: pct_user
      - name: ansible_pct_user
    env:
      - name: ANSIBLE_PCT_USER
    ini:
      - section: pct_connection
        key: user
  pct_password:
    description:
      - Password of O(pct_user) (prefer a key). Keep it in a vault.
    type: str
    vars:
      - name: pct_password
      - name: ansible_pct_password
    env:
      - name: ANSIBLE_PCT_PASSWORD
  pct_private_key_file:
    description:
      - Private key for O(pct_user). Without it the SSH agent and the default keys (C(~/.ssh/id_*)) are tried.
    type: path
    vars:
      - name: pct_private_key_file
      - name: ansible_pct_private_key_file
    env:
      - name: ANSIBLE_PCT_PRIVATE_KEY_FILE
    ini:
      - section: pct_connection
        key: private_key_file
  pct_known_hosts_file:
    description:
      - known_hosts file holding the Proxmox host's key (C(/etc/ssh/ssh_known_hosts) is read too).
      - Add the key with C(ssh-keyscan -p PORT HOST >> FILE), after checking its fingerprint on the host's console.
    type: path
    default: ~/.ssh/known_hosts
    vars:
      - name: pct_known_hosts_file
      - name: ansible_pct_known_hosts_file
    env:
      - name: ANSIBLE_PCT_KNOWN_HOSTS_FILE
    ini:
      - section: pct_connection
        key: known_hosts_file
  pct_host_key_checking:
    description:
      - Refuse a host whose key is not in the known_hosts files (paramiko C(RejectPolicy)).
      - C(false) accepts and does not record an unknown key (a warning is shown); a changed key is always refused.
    type: bool
    default: true
    vars:
      - name: pct_host_key_checking
      - name: ansible_pct_host_key_checking
    env:
      - name: ANSIBLE_PCT_HOST_KEY_CHECKING
    ini:
      - section: pct_connection
        key: host_key_checking
  pct_vmid:
    description:
      - ID of the container on the host. Required.
      - Of the variables, the last one set in this list wins (C(pve_vmid) is the inventory's general name).
    type: int
    vars:
      - name: pve_vmid
      - name: pct_vmid
      - name: ansible_pct_vmid
    env:
      - name: ANSIBLE_PCT_VMID
  pct_timeout:
    description: Seconds allowed for the TCP connection, the SSH banner and the authentication.
    type: int
    default: 10
    vars:
      - name: pct_timeout
      - name: ansible_pct_timeout
    env:
      - name: ANSIBLE_PCT_TIMEOUT
    ini:
      - section: pct_connection
        key: timeout
  pct_command:
    description: Path of C(pct) on the host.
    type: str
    default: /usr/sbin/pct
    vars:
      - name: pct_command
      - name: ansible_pct_command
    ini:
      - section: pct_connection
        key: command
  pct_sudo:
    description:
      - Run C(pct) through C(sudo -n) on the host, for a non-root O(pct_user).
      - "sudoers line for that user, for example: C(ansible ALL = (root) NOPASSWD: /usr/sbin/pct)."
    type: bool
    default: false
    vars:
      - name: pct_sudo
      - name: ansible_pct_sudo
    ini:
      - section: pct_connection
        key: sudo
  pct_host_tmpdir:
    description: Directory on the host where transferred files wait between SFTP and C(pct push)/C(pct pull).
    type: str
    default: /tmp
    vars:
      - name: pct_host_tmpdir
      - name: ansible_pct_host_tmpdir
    ini:
      - section: pct_connection
        key: host_tmpdir
  pipelining:
    description:
      - Send modules on the standard input of C(pct exec) instead of copying them into the container first.
    type: bool
    default: true
    vars:
      - name: ansible_pipelining
      - name: ansible_pct_pipelining
    env:
      - name: ANSIBLE_PCT_PIPELINING
    ini:
      - section: pct_connection
        key: pipelining
notes:
  - The exit status, standard output and standard error are those of the command in the container. When C(pct) itself
    fails (container not running, no such container, C(pct) missing) the task fails as unreachable with C(pct)'s message.
  - To reach the container directly instead (its own SSH server), set C(ansible_connection=ssh) and its address as
    C(ansible_host); nothing else changes.
"""

EXAMPLES = r"""
# inventory: container 129 on the Proxmox host 192.0.2.5
# gpu_containers:
#   hosts:
#     ct129:
#       ansible_connection: kpro.gpu_serving.pct
#       pct_host: 192.0.2.5
#       pct_vmid: 129
#       pct_private_key_file: ~/.ssh/id_ed25519
"""

import os
import re
import secrets
import shlex
import threading
import traceback

from ansible.errors import AnsibleAuthenticationFailure, AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_native, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

try:
    import paramiko

    PARAMIKO_IMPORT_ERR = None
except ImportError:  # pragma: no cover - reported at connect time
    paramiko = None
    PARAMIKO_IMPORT_ERR = traceback.format_exc()

display = Display()

BUFSIZE = 65536
CONTAINER_SHELL = "/bin/sh"
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"

# pct's own failures (as opposed to the command's): the task is unreachable, with pct's words.
_PCT_FAILURE_RE = re.compile(
    r"^(Configuration file '[^']*' does not exist|CT \d+ is locked|"
    r"unable to find configuration file|.*pct: (command )?not found|.*pct: No such file or directory|"
    r"sudo: a password is required)",
    re.MULTILINE,
)
# A stopped container, in pct's real words (pve-container@94f5585 src/PVE/CLI/pct.pm): exec and enter
# `die "container '$vmid' not running!\n"` (lines 244, 204); push `die "can only push files to a
# running CT\n"` (752); pull `die "can only pull files from a running VM"` (664, no newline, so Perl
# appends " at ... line N.").
_PCT_NOT_RUNNING_RE = re.compile(
    r"^(container '\d+' not running!|can only push files to a running CT|can only pull files from a running VM)",
    re.MULTILINE,
)


class Connection(ConnectionBase):
    """Commands and files into an LXC container through ``pct`` on its Proxmox VE host."""

    transport = "kpro.gpu_serving.pct"
    has_pipelining = True
    has_tty = False
    default_user = "root"

    def __init__(self, *args, **kwargs):
        super(Connection, self).__init__(*args, **kwargs)
        self.ssh = None
        self._sftp = None

    # ------------------------------------------------------------------ connection
    def _host(self):
        host = self.get_option("pct_host")
        if not host:
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: pct_host is not set: give the address of the Proxmox host that runs the container "
                "(inventory variable pct_host)")
        return host

    def _vmid(self):
        vmid = self.get_option("pct_vmid")
        if vmid is None:
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: pct_vmid is not set: give the container's ID (inventory variable pct_vmid or pve_vmid)")
        return int(vmid)

    def _load_known_hosts(self, client):
        files = [os.path.expanduser(self.get_option("pct_known_hosts_file") or "~/.ssh/known_hosts"), SYSTEM_KNOWN_HOSTS]
        for path in files:
            if not os.path.exists(path):
                continue
            try:
                client.load_system_host_keys(path)
            except (IOError, OSError) as e:
                raise AnsibleConnectionFailure("kpro.gpu_serving.pct: cannot read known_hosts %s: %s" % (path, to_native(e)))
            except paramiko.hostkeys.InvalidHostKey as e:
                raise AnsibleConnectionFailure("kpro.gpu_serving.pct: invalid line in %s: %s" % (path, to_text(e.line)))

    def _connect(self):
        if self._connected:
            return self
        if paramiko is None:
            raise AnsibleError("kpro.gpu_serving.pct needs paramiko on the controller: %s" % to_native(PARAMIKO_IMPORT_ERR))
        host, port, user = self._host(), self.get_option("pct_port"), self.get_option("pct_user")
        self._vmid()
        display.vvv("ESTABLISH PARAMIKO SSH CONNECTION FOR USER %s TO %s:%s (pct, CT %s)" % (
            user, host, port, self.get_option("pct_vmid")), host=host)
        client = paramiko.SSHClient()
        self._load_known_hosts(client)
        if self.get_option("pct_host_key_checking"):
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            display.warning("kpro.gpu_serving.pct: host key checking is off for %s: an unknown host key is accepted." % host)
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        key_file = self.get_option("pct_private_key_file")
        key_file = os.path.expanduser(key_file) if key_file else None
        password = self.get_option("pct_password")
        timeout = self.get_option("pct_timeout")
        try:
            client.connect(
                host, port=port, username=user, password=password, key_filename=key_file,
                look_for_keys=key_file is None and password is None, allow_agent=password is None,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
            )
        except paramiko.BadHostKeyException as e:
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: the host key of %s changed (got %s %s): refusing to connect. If the host was "
                "rebuilt, check the new key on its console and replace the entry in %s." % (
                    host, e.key.get_name(), to_text(e.key.get_base64())[:24] + "...", self.get_option("pct_known_hosts_file")))
        except paramiko.AuthenticationException as e:
            raise AnsibleAuthenticationFailure("kpro.gpu_serving.pct: authentication as %s on %s:%s failed: %s" % (
                user, host, port, to_native(e)))
        except paramiko.SSHException as e:
            msg = to_native(e)
            if "not found in known_hosts" in msg:
                raise AnsibleConnectionFailure(
                    "kpro.gpu_serving.pct: the host key of %s is unknown: %s. Add it (after checking the fingerprint on the "
                    "host's console) with `ssh-keyscan -p %s %s >> %s`, or set pct_known_hosts_file." % (
                        host, msg, port, host, self.get_option("pct_known_hosts_file")))
            raise AnsibleConnectionFailure("kpro.gpu_serving.pct: SSH to %s:%s failed: %s" % (host, port, msg))
        except (OSError, EOFError) as e:
            raise AnsibleConnectionFailure("kpro.gpu_serving.pct: cannot connect to %s:%s: %s" % (host, port, to_native(e)))
        self.ssh = client
        self._connected = True
        return self

    def close(self):
        if self._sftp is not None:
            try:
                self._sftp.close()
            finally:
                self._sftp = None
        if self.ssh is not None:
            try:
                self.ssh.close()
            finally:
                self.ssh = None
        self._connected = False

    def reset(self):
        self.close()

    # ------------------------------------------------------------------ helpers
    def _pct_argv(self, *args):
        argv = [self.get_option("pct_command")] + [str(a) for a in args]
        if self.get_option("pct_sudo"):
            argv = ["sudo", "-n", "--"] + argv
        return argv

    def _host_run(self, command, in_data=None):
        """Run a command line on the Proxmox host (its login shell parses it); return (rc, stdout, stderr) as bytes."""
        display.vvvv("PCT HOST EXEC %s" % command, host=self.get_option("pct_host"))
        try:
            chan = self.ssh.get_transport().open_session()
        except Exception as e:
            raise AnsibleConnectionFailure("kpro.gpu_serving.pct: cannot open an SSH session on %s: %s" % (
                self.get_option("pct_host"), to_native(e)))
        with chan:
            chan.exec_command(to_bytes(command, errors="surrogate_or_strict"))
            err = []
            reader = threading.Thread(target=lambda: err.append(chan.makefile_stderr("rb", BUFSIZE).read()))
            reader.daemon = True
            reader.start()
            if in_data:
                chan.sendall(in_data)
            # no terminal and no more input: a command that reads stdin sees EOF instead of hanging
            chan.shutdown_write()
            out = chan.makefile("rb", BUFSIZE).read()
            reader.join()
            rc = chan.recv_exit_status()
        return rc, out, b"".join(err)

    def _check_pct_failure(self, rc, stderr):
        if rc == 0:
            return
        text = to_text(stderr, errors="surrogate_or_replace").strip()
        host, vmid = self.get_option("pct_host"), self.get_option("pct_vmid")
        if _PCT_NOT_RUNNING_RE.search(text):
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: container %s is not running on %s (pct: %s); start it (pct start %s) and retry"
                % (vmid, host, text, vmid))
        if _PCT_FAILURE_RE.search(text):
            raise AnsibleConnectionFailure("kpro.gpu_serving.pct: pct on %s cannot reach CT %s: %s" % (host, vmid, text))

    def _sftp_client(self):
        if self._sftp is None:
            try:
                self._sftp = self.ssh.open_sftp()
            except Exception as e:
                raise AnsibleConnectionFailure("kpro.gpu_serving.pct: SFTP to %s failed (is the sftp subsystem enabled?): %s" % (
                    self.get_option("pct_host"), to_native(e)))
        return self._sftp

    def _make_host_tmpdir(self):
        path = "%s/.kpro-pct-%s" % (self.get_option("pct_host_tmpdir").rstrip("/") or "", secrets.token_hex(8))
        try:
            self._sftp_client().mkdir(path, 0o700)
        except (IOError, OSError) as e:
            raise AnsibleError("kpro.gpu_serving.pct: cannot create %s on %s: %s" % (path, self.get_option("pct_host"), to_native(e)))
        return path

    def _strip_become_success(self, stdout):
        if not self.become or not self.become.success:
            return stdout
        lines = stdout.splitlines(True)
        for i, line in enumerate(lines):
            if self.become.check_success(line):
                return b"".join(lines[:i] + lines[i + 1:])
        return stdout

    # ------------------------------------------------------------------ the API
    def exec_command(self, cmd, in_data=None, sudoable=True):
        super(Connection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
        if sudoable and self.become and self.become.expect_prompt():
            raise AnsibleError(
                "kpro.gpu_serving.pct: become with a password prompt is not supported: pct exec already runs as root in "
                "the container; drop become (or the become password) for this host.")
        # pct exec may clear the environment (PVE 9: keep-env defaults to 0); root's HOME keeps ~ usable.
        inner = 'export HOME="${HOME:-/root}"; ' + to_text(cmd, errors="surrogate_or_strict")
        command = shlex.join(self._pct_argv("exec", self._vmid(), "--", CONTAINER_SHELL, "-c", inner))
        display.vvv("EXEC %s" % command, host=self.get_option("pct_host"))
        rc, stdout, stderr = self._host_run(command, in_data=in_data)
        self._check_pct_failure(rc, stderr)
        return rc, self._strip_become_success(stdout), stderr

    def put_file(self, in_path, out_path):
        super(Connection, self).put_file(in_path, out_path)
        display.vvv("PUT %s TO %s (CT %s)" % (in_path, out_path, self.get_option("pct_vmid")), host=self.get_option("pct_host"))
        if not os.path.exists(to_bytes(in_path, errors="surrogate_or_strict")):
            raise AnsibleFileNotFound("file or module does not exist: %s" % to_native(in_path))
        tmpdir = self._make_host_tmpdir()
        staged = tmpdir + "/file"
        try:
            self._sftp_client().put(to_native(in_path), staged)
        except Exception as e:
            self._host_run(shlex.join(["rm", "-rf", "--", tmpdir]))
            raise AnsibleError("kpro.gpu_serving.pct: SFTP of %s to %s:%s failed: %s" % (
                in_path, self.get_option("pct_host"), staged, to_native(e)))
        command = "%s; rc=$?; rm -rf -- %s; exit $rc" % (
            shlex.join(self._pct_argv("push", self._vmid(), staged, out_path)), shlex.quote(tmpdir))
        rc, stdout, stderr = self._host_run(command)
        self._check_pct_failure(rc, stderr)
        if rc != 0:
            raise AnsibleError("kpro.gpu_serving.pct: pct push of %s to CT %s:%s failed (rc=%d): %s" % (
                in_path, self.get_option("pct_vmid"), out_path, rc, to_text(stderr or stdout).strip()))

    def fetch_file(self, in_path, out_path):
        super(Connection, self).fetch_file(in_path, out_path)
        display.vvv("FETCH %s (CT %s) TO %s" % (in_path, self.get_option("pct_vmid"), out_path), host=self.get_option("pct_host"))
        tmpdir = self._make_host_tmpdir()
        staged = tmpdir + "/file"
        try:
            rc, stdout, stderr = self._host_run(shlex.join(self._pct_argv("pull", self._vmid(), in_path, staged)))
            self._check_pct_failure(rc, stderr)
            if rc != 0:
                raise AnsibleError("kpro.gpu_serving.pct: pct pull of CT %s:%s failed (rc=%d): %s" % (
                    self.get_option("pct_vmid"), in_path, rc, to_text(stderr or stdout).strip()))
            try:
                self._sftp_client().get(staged, to_native(out_path))
            except Exception as e:
                raise AnsibleError("kpro.gpu_serving.pct: SFTP of %s:%s to %s failed: %s" % (
                    self.get_option("pct_host"), staged, out_path, to_native(e)))
        finally:
            self._host_run(shlex.join(["rm", "-rf", "--", tmpdir]))
