# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: pct
short_description: Run tasks in a Proxmox VE LXC container through C(pct) on its host, over one multiplexed OpenSSH connection
version_added: "0.1.0"
description:
  - Connects with the OpenSSH client to the Proxmox VE host that runs the container and enters the container with
    C(pct exec <vmid> -- /bin/sh -c <command>), so the container needs no SSH server, no address reachable from the
    controller and no key of its own.
  - One SSH connection per Proxmox host is opened and reused by every task (OpenSSH C(ControlMaster=auto) with
    C(ControlPersist), its socket under O(pct_control_path_dir), as the C(ansible.builtin.ssh) connection does), so a
    task costs one C(pct exec), not a new SSH connection and authentication.
  - Files are streamed over the same connection into the container (C(pct exec <vmid> -- /bin/sh -c 'cat > FILE')) and
    out of it (C(cat FILE)); nothing is staged on the host.
  - Host keys are verified (C(StrictHostKeyChecking=yes)) against O(pct_known_hosts_file) and
    C(/etc/ssh/ssh_known_hosts); an unknown or changed host key is refused unless O(pct_host_key_checking=false).
  - The command's standard output and standard error stay separate (no terminal is allocated) and its exit status is
    returned. The command runs as root in the container (C(pct exec) always does); C(become) without a password works,
    a become password prompt is not supported.
  - Pipelining is on by default (one C(pct exec) per module instead of several).
  - The standard connection variables (C(ansible_user), C(ansible_port), C(ansible_password), C(ansible_private_key_file),
    C(ansible_host_key_checking), C(ansible_ssh_common_args), ...) apply to the SSH connection to the Proxmox host, as
    with C(community.proxmox.proxmox_pct_remote). Each option also has its own C(pct_*) name. Of the variables listed
    for an option, the last one set wins, so the C(pct_*) names win over the C(ansible_*) ones, for example
    C(pct_user) over C(ansible_user). Variables win over C(ansible.cfg) and the environment.
  - C(ansible_host) is B(not) read (unlike C(community.proxmox.proxmox_pct_remote), where it names the Proxmox host).
    In this collection's inventories a container's C(ansible_host) is the container's own address, used when it is
    reached with C(ansible_connection=ssh) instead; the Proxmox host is always O(pct_host).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
requirements:
  - the OpenSSH client (C(ssh)) on the controller; OpenSSH 8.4 or later for O(pct_password)
  - C(pct) on the Proxmox host; C(/bin/sh) and C(cat) in the container
options:
  pct_host:
    description:
      - Address (or name) of the Proxmox VE host that runs the container. Required. C(ansible_host) is not read (see above).
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
      - name: ansible_port
      - name: ansible_ssh_port
      - name: pct_port
      - name: ansible_pct_port
    env:
      - name: ANSIBLE_REMOTE_PORT
      - name: ANSIBLE_PCT_PORT
    ini:
      - section: defaults
        key: remote_port
      - section: pct_connection
        key: port
    keyword:
      - name: port
  pct_user:
    description:
      - SSH user on the Proxmox host. C(pct) needs root; with another user set O(pct_sudo=true).
      - Also C(ansible_user), the play's C(remote_user) and C(-u) (a variable wins over the keyword and C(-u)).
    type: str
    default: root
    vars:
      - name: ansible_user
      - name: ansible_ssh_user
      - name: pct_user
      - name: ansible_pct_user
    env:
      - name: ANSIBLE_REMOTE_USER
      - name: ANSIBLE_PCT_USER
    ini:
      - section: defaults
        key: remote_user
      - section: pct_connection
        key: user
    keyword:
      - name: remote_user
  pct_password:
    description:
      - Password of O(pct_user) on the Proxmox host (prefer a key). Keep it in a vault. Also C(ansible_password) and
        C(--ask-pass).
      - It never appears on a command line. C(ssh) reads it through C(SSH_ASKPASS) (with C(SSH_ASKPASS_REQUIRE=force),
        OpenSSH 8.4 or later) from a variable in its own environment, which only the same user and root can read
        (C(/proc/PID/environ) is mode 0400), as C(sshpass -e) does. No C(sshpass) is needed.
    type: str
    vars:
      - name: ansible_password
      - name: ansible_ssh_pass
      - name: ansible_ssh_password
      - name: pct_password
      - name: ansible_pct_password
    env:
      - name: ANSIBLE_PCT_PASSWORD
    keyword:
      - name: password
  pct_private_key_file:
    description:
      - Private key for O(pct_user) (C(IdentitiesOnly=yes)). Without it the SSH agent and the default keys
        (C(~/.ssh/id_*)) are tried.
    type: path
    vars:
      - name: ansible_private_key_file
      - name: ansible_ssh_private_key_file
      - name: pct_private_key_file
      - name: ansible_pct_private_key_file
    env:
      - name: ANSIBLE_PRIVATE_KEY_FILE
      - name: ANSIBLE_PCT_PRIVATE_KEY_FILE
    ini:
      - section: defaults
        key: private_key_file
      - section: pct_connection
        key: private_key_file
  pct_known_hosts_file:
    description:
      - known_hosts file holding the Proxmox host's key (C(UserKnownHostsFile); C(/etc/ssh/ssh_known_hosts) is read too).
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
      - Refuse a Proxmox host whose key is not in the known_hosts files (C(StrictHostKeyChecking=yes)).
      - C(false) accepts an unknown key and records it in O(pct_known_hosts_file) (C(StrictHostKeyChecking=accept-new),
        a warning is shown); a changed key is always refused.
      - Also C(ansible_host_key_checking), C(ANSIBLE_HOST_KEY_CHECKING) and C(host_key_checking) in C(ansible.cfg).
    type: bool
    default: true
    vars:
      - name: ansible_host_key_checking
      - name: ansible_ssh_host_key_checking
      - name: pct_host_key_checking
      - name: ansible_pct_host_key_checking
    env:
      - name: ANSIBLE_HOST_KEY_CHECKING
      - name: ANSIBLE_SSH_HOST_KEY_CHECKING
      - name: ANSIBLE_PCT_HOST_KEY_CHECKING
    ini:
      - section: defaults
        key: host_key_checking
      - section: pct_connection
        key: host_key_checking
  pct_ssh_common_args:
    version_added: "0.2.0"
    description:
      - Extra arguments for C(ssh) to the Proxmox host (for example C(-o ProxyJump=bastion)), split like a shell would.
      - They come before the plugin's own C(-o) options, and C(ssh) takes the first value of an option, so they win.
    type: str
    default: ""
    vars:
      - name: ansible_ssh_common_args
      - name: pct_ssh_common_args
    env:
      - name: ANSIBLE_SSH_COMMON_ARGS
    ini:
      - section: ssh_connection
        key: ssh_common_args
  pct_ssh_executable:
    version_added: "0.2.0"
    description: The OpenSSH client.
    type: str
    default: ssh
    vars:
      - name: ansible_ssh_executable
      - name: pct_ssh_executable
    env:
      - name: ANSIBLE_SSH_EXECUTABLE
    ini:
      - section: ssh_connection
        key: ssh_executable
  pct_control_persist:
    version_added: "0.2.0"
    description:
      - How long the shared SSH connection to the Proxmox host stays open after its last use (C(ControlPersist), for
        example C(60s) or C(10m)).
      - C(no) opens a new SSH connection for every command (slower, about 0.4 s more per task).
    type: str
    default: 60s
    vars:
      - name: pct_control_persist
    env:
      - name: ANSIBLE_PCT_CONTROL_PERSIST
    ini:
      - section: pct_connection
        key: control_persist
  pct_control_path_dir:
    version_added: "0.2.0"
    description:
      - Directory of the shared connections' sockets (created with mode 0700). One socket per Proxmox host, user, port
        and authentication settings, named C(pct-) and a hash.
    type: path
    default: ~/.ansible/cp
    vars:
      - name: ansible_control_path_dir
      - name: pct_control_path_dir
    env:
      - name: ANSIBLE_SSH_CONTROL_PATH_DIR
    ini:
      - section: ssh_connection
        key: control_path_dir
  pct_keepalive:
    version_added: "0.2.0"
    description:
      - Seconds between SSH keepalive messages to the Proxmox host (C(ServerAliveInterval), with C(ServerAliveCountMax=4)),
        so a long quiet task (a model download, a server starting) keeps its connection through firewalls that drop idle
        ones, and a dead host is noticed. C(0) turns them off.
    type: int
    default: 15
    vars:
      - name: pct_keepalive
    ini:
      - section: pct_connection
        key: keepalive
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
    description: Seconds allowed for the TCP connection to the Proxmox host (C(ConnectTimeout)).
    type: int
    default: 10
    vars:
      - name: ansible_ssh_timeout
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
    fails (container not running, no such container, C(pct) missing) or C(ssh) cannot reach or log in to the host, the
    task fails as unreachable with C(pct)'s or C(ssh)'s message.
  - The shared connection is authenticated once, when it is opened, with the settings of the first task that opens it;
    the socket's name covers the host, port, user, key, known_hosts file (and its version) and host key checking, so
    different settings get different connections. The C(reset_connection) meta task closes it.
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
#       ansible_user: root                          # or pct_user (wins)
#       ansible_private_key_file: ~/.ssh/id_ed25519  # or pct_private_key_file (wins)
"""

import hashlib
import os
import re
import shlex
import subprocess

from ansible.errors import AnsibleAuthenticationFailure, AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_native, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()

CONTAINER_SHELL = "/bin/sh"
# Printed by the host's shell just before pct runs. bash reads root's .bashrc for an ssh command too (Debian builds it
# with SSH_SOURCE_BASHRC, and root's .bashrc has no "not interactive: return"), so whatever it prints comes first on
# stdout; everything up to and including this line is dropped, for a module's JSON, a raw task's lines and a fetched file.
START = b"--- kpro.gpu_serving.pct start ---\n"
# ssh's SSH_ASKPASS program for pct_password: it answers from ssh's own environment (printf is a shell
# builtin, so the password is in no argv). The script holds no secret; it lives in the control path dir.
ASKPASS_VAR = "_KPRO_PCT_PASSWORD"
ASKPASS_NAME = "pct-askpass"
ASKPASS_SCRIPT = '#!/bin/sh\n# kpro.gpu_serving.pct: SSH_ASKPASS for pct_password (from ssh\'s environment)\nprintf \'%s\\n\' "$' + ASKPASS_VAR + '"\n'

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
# ssh's own failures (it exits 255), as opposed to a command that exits 255, in OpenSSH's words
# (openssh-portable sshconnect.c: check_host_key "No %s host key is known for %.200s and you have requested
# strict checking." / "Host key verification failed.", the "REMOTE HOST IDENTIFICATION HAS CHANGED" banner;
# sshconnect2.c "Permission denied (%s)."; ssh.c / sshconnect.c "ssh: connect to host ...", "ssh: Could not resolve").
_SSH_KEY_CHANGED_RE = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for \S+ has changed")
_SSH_KEY_UNKNOWN_RE = re.compile(r"No \S+ host key is known for|Host key verification failed")
_SSH_AUTH_RE = re.compile(r"Permission denied \(|Too many authentication failures")
_SSH_ERROR_RE = re.compile(
    r"^(ssh: |kex_exchange_identification|ssh_exchange_identification|Connection (closed|reset|timed out)|"
    r"Timeout, server \S+ not responding|Control ?(socket|Path|Master)|mux_client|command-line line \d+:|"
    r"Bad configuration option|.*[Cc]ould not resolve hostname|Received disconnect from|Load key )",
    re.MULTILINE,
)


def _ssh_quote(value):
    """A path as one value of ``ssh -o Key=value``: ssh splits the value and expands %-tokens and ~."""
    return '"%s"' % to_text(value).replace("%", "%%")


def after_start(stdout):
    """``stdout`` after the START line (what the host's login shell printed before it is dropped); as is without one."""
    i = stdout.find(START)
    return stdout[i + len(START):] if i >= 0 else stdout


def drop_before_start(path, head=1 << 16):
    """A fetched file without what precedes START, which is within its first ``head`` bytes: the rest is copied in
    chunks (a fetched file can be large), and a file without START is left as it is."""
    with open(path, "rb") as f:
        i = f.read(head).find(START)
    if i < 0:
        return
    tmp = path + b".kpro-start"
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        src.seek(i + len(START))
        for chunk in iter(lambda: src.read(1 << 20), b""):
            dst.write(chunk)
    os.replace(tmp, path)


class Connection(ConnectionBase):
    """Commands and files into an LXC container through ``pct`` on its Proxmox VE host, over OpenSSH."""

    transport = "kpro.gpu_serving.pct"
    has_pipelining = True
    has_tty = False
    default_user = "root"

    # ------------------------------------------------------------------ settings
    def _host(self):
        host = self.get_option("pct_host")
        if not host:
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: pct_host is not set: give the address of the Proxmox host that runs the container "
                "(inventory variable pct_host; ansible_host is not read, it is the container's own address)")
        return host

    def _vmid(self):
        vmid = self.get_option("pct_vmid")
        if vmid is None:
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: pct_vmid is not set: give the container's ID (inventory variable pct_vmid or pve_vmid)")
        return int(vmid)

    def _key_file(self):
        key = self.get_option("pct_private_key_file")
        return os.path.expanduser(key) if key else None

    def _known_hosts(self):
        return os.path.expanduser(self.get_option("pct_known_hosts_file") or "~/.ssh/known_hosts")

    def _multiplexed(self):
        persist = to_text(self.get_option("pct_control_persist") or "no").strip().lower()
        return persist not in ("no", "false", "off", "")

    def _control_dir(self):
        path = os.path.expanduser(self.get_option("pct_control_path_dir") or "~/.ansible/cp")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise AnsibleError("kpro.gpu_serving.pct: cannot create the control path directory %s: %s" % (path, to_native(e)))
        return path

    def _control_path(self):
        """One shared connection per host, port, user and authentication settings (a different key or known_hosts
        file must not reuse a connection opened with other settings). The known_hosts file's identity is part of it:
        a connection whose host key was checked against an earlier version of the file (a rebuilt host, a lab
        brought up again) is not reused."""
        try:
            st = os.stat(self._known_hosts())
            known_hosts_id = "%d:%d:%d" % (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            known_hosts_id = "-"
        ident = "\0".join(to_text(v) for v in (
            self._host(), self.get_option("pct_port"), self.get_option("pct_user"), self._key_file() or "",
            self._known_hosts(), known_hosts_id, self.get_option("pct_host_key_checking"),
            self.get_option("pct_ssh_common_args") or "", self.get_option("pct_password") is not None,
            self.get_option("pct_ssh_executable")))
        return os.path.join(self._control_dir(), "pct-" + hashlib.sha256(to_bytes(ident)).hexdigest()[:16])

    def _ssh_base(self):
        """The ssh command line up to (not including) the destination."""
        argv = [self.get_option("pct_ssh_executable") or "ssh"] + shlex.split(self.get_option("pct_ssh_common_args") or "")
        argv += ["-T", "-o", "LogLevel=ERROR"]
        if self.get_option("pct_password") is None:
            argv += ["-o", "BatchMode=yes"]
        else:
            argv += ["-o", "NumberOfPasswordPrompts=1"]
        argv += ["-o", "StrictHostKeyChecking=%s" % ("yes" if self.get_option("pct_host_key_checking") else "accept-new"),
                 "-o", "UserKnownHostsFile=%s" % _ssh_quote(self._known_hosts()),
                 "-o", "ConnectTimeout=%d" % self.get_option("pct_timeout")]
        keepalive = self.get_option("pct_keepalive")
        if keepalive:
            argv += ["-o", "ServerAliveInterval=%d" % keepalive, "-o", "ServerAliveCountMax=4"]
        key = self._key_file()
        if key:
            argv += ["-o", "IdentitiesOnly=yes", "-i", key]
        if self._multiplexed():
            argv += ["-o", "ControlMaster=auto", "-o", "ControlPersist=%s" % self.get_option("pct_control_persist"),
                     "-o", "ControlPath=%s" % _ssh_quote(self._control_path())]
        argv += ["-p", str(self.get_option("pct_port")), "-l", self.get_option("pct_user")]
        return argv

    def _ssh_env(self):
        env = dict(os.environ)
        env.pop(ASKPASS_VAR, None)
        password = self.get_option("pct_password")
        if password is None:
            return env
        askpass = os.path.join(self._control_dir(), ASKPASS_NAME)
        try:
            with open(askpass, "r") as f:
                current = f.read()
        except (IOError, OSError):
            current = None
        if current != ASKPASS_SCRIPT:
            tmp = "%s.%d" % (askpass, os.getpid())
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700), "w") as f:
                f.write(ASKPASS_SCRIPT)
            os.replace(tmp, askpass)
        env.update({ASKPASS_VAR: to_text(password), "SSH_ASKPASS": askpass, "SSH_ASKPASS_REQUIRE": "force"})
        env.setdefault("DISPLAY", "-")
        return env

    # ------------------------------------------------------------------ connection
    def _connect(self):
        if self._connected:
            return self
        host, vmid = self._host(), self._vmid()
        display.vvv("ESTABLISH OPENSSH CONNECTION FOR USER %s TO %s:%s (pct, CT %s%s)" % (
            self.get_option("pct_user"), host, self.get_option("pct_port"), vmid,
            ", shared: %s" % self._control_path() if self._multiplexed() else ""), host=host)
        if not self.get_option("pct_host_key_checking"):
            display.warning("kpro.gpu_serving.pct: host key checking is off for %s: an unknown host key is accepted "
                            "and recorded in %s." % (host, self._known_hosts()))
        self._connected = True
        return self

    def close(self):
        # the shared connection outlives this task on purpose (ControlPersist); reset() closes it
        self._connected = False

    def reset(self):
        if not self._multiplexed():
            return
        path = self._control_path()
        if os.path.exists(path):
            argv = self._ssh_base() + ["-O", "exit", "--", self._host()]
            display.vvv("RESET %s" % shlex.join(argv), host=self._host())
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=self._ssh_env(), check=False)
        self._connected = False

    # ------------------------------------------------------------------ helpers
    def _pct_argv(self, *args):
        argv = [self.get_option("pct_command")] + [str(a) for a in args]
        if self.get_option("pct_sudo"):
            argv = ["sudo", "-n", "--"] + argv
        return argv

    def _host_run(self, command, in_data=None, stdin_file=None, stdout_file=None):
        """Run a command line on the Proxmox host (its login shell parses it); return (rc, stdout, stderr) as bytes.

        The input is ``in_data`` (bytes) or the open file ``stdin_file``; without either the command reads EOF.
        With ``stdout_file`` the output goes there (and b"" is returned); the caller drops what precedes START."""
        command = "printf '%s' " + shlex.quote(to_text(START)) + "; " + command
        argv = self._ssh_base() + ["--", self._host(), command]
        display.vvvv("SSH %s" % shlex.join(argv), host=self._host())
        password = self.get_option("pct_password") is not None
        if stdin_file is not None:
            stdin = stdin_file
        else:
            stdin = subprocess.PIPE if in_data else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout_file if stdout_file is not None else subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=self._ssh_env(), start_new_session=password)
        except OSError as e:
            raise AnsibleConnectionFailure("kpro.gpu_serving.pct: cannot run %s (the OpenSSH client is needed on the "
                                           "controller): %s" % (argv[0], to_native(e)))
        stdout, stderr = proc.communicate(in_data if stdin is subprocess.PIPE else None)
        return proc.returncode, after_start(stdout or b""), stderr or b""

    def _check_failure(self, rc, stderr):
        """Raise when pct or ssh failed (as opposed to the command in the container)."""
        if rc == 0:
            return
        text = to_text(stderr, errors="surrogate_or_replace").strip()
        host, vmid, port = self._host(), self.get_option("pct_vmid"), self.get_option("pct_port")
        if _PCT_NOT_RUNNING_RE.search(text):
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: container %s is not running on %s (pct: %s); start it (pct start %s) and retry"
                % (vmid, host, text, vmid))
        if _PCT_FAILURE_RE.search(text):
            raise AnsibleConnectionFailure("kpro.gpu_serving.pct: pct on %s cannot reach CT %s: %s" % (host, vmid, text))
        if rc != 255:
            return
        if _SSH_KEY_CHANGED_RE.search(text):
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: the host key of %s changed: refusing to connect. If the host was rebuilt, check the "
                "new key on its console and replace the entry in %s. ssh: %s" % (host, self._known_hosts(), text))
        if _SSH_KEY_UNKNOWN_RE.search(text):
            raise AnsibleConnectionFailure(
                "kpro.gpu_serving.pct: the host key of %s is unknown (ssh: %s). Add it (after checking the fingerprint on "
                "the host's console) with `ssh-keyscan -p %s %s >> %s`, or set pct_known_hosts_file." % (
                    host, text, port, host, self._known_hosts()))
        if _SSH_AUTH_RE.search(text):
            raise AnsibleAuthenticationFailure("kpro.gpu_serving.pct: authentication as %s on %s:%s failed: %s" % (
                self.get_option("pct_user"), host, port, text))
        # ssh always says why it failed (LogLevel=ERROR keeps its errors); a bare 255 is the command's own status
        if _SSH_ERROR_RE.search(text):
            raise AnsibleConnectionFailure("kpro.gpu_serving.pct: SSH to %s:%s failed: %s" % (host, port, text))

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
        display.vvv("EXEC %s" % command, host=self._host())
        rc, stdout, stderr = self._host_run(command, in_data=in_data)
        self._check_failure(rc, stderr)
        return rc, self._strip_become_success(stdout), stderr

    def put_file(self, in_path, out_path):
        super(Connection, self).put_file(in_path, out_path)
        display.vvv("PUT %s TO %s (CT %s)" % (in_path, out_path, self.get_option("pct_vmid")), host=self._host())
        b_in = to_bytes(in_path, errors="surrogate_or_strict")
        if not os.path.exists(b_in):
            raise AnsibleFileNotFound("file or module does not exist: %s" % to_native(in_path))
        # streamed over the shared connection into the container: no staging copy on the host
        command = shlex.join(self._pct_argv("exec", self._vmid(), "--", CONTAINER_SHELL, "-c", 'cat > "$1"', "sh", out_path))
        with open(b_in, "rb") as f:
            rc, stdout, stderr = self._host_run(command, stdin_file=f)
        self._check_failure(rc, stderr)
        if rc != 0:
            raise AnsibleError("kpro.gpu_serving.pct: copying %s to CT %s:%s failed (rc=%d): %s" % (
                in_path, self.get_option("pct_vmid"), out_path, rc, to_text(stderr or stdout).strip()))

    def fetch_file(self, in_path, out_path):
        super(Connection, self).fetch_file(in_path, out_path)
        display.vvv("FETCH %s (CT %s) TO %s" % (in_path, self.get_option("pct_vmid"), out_path), host=self._host())
        command = shlex.join(self._pct_argv("exec", self._vmid(), "--", CONTAINER_SHELL, "-c", 'exec cat -- "$1"', "sh", in_path))
        b_out = to_bytes(out_path, errors="surrogate_or_strict")
        try:
            with open(b_out, "wb") as f:
                rc, dummy, stderr = self._host_run(command, stdout_file=f)
            drop_before_start(b_out)
            self._check_failure(rc, stderr)
            if rc != 0:
                raise AnsibleError("kpro.gpu_serving.pct: fetching CT %s:%s failed (rc=%d): %s" % (
                    self.get_option("pct_vmid"), in_path, rc, to_text(stderr).strip()))
        except Exception:
            if os.path.exists(b_out):
                os.unlink(b_out)
            raise
