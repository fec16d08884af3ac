# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""proxmox_api with the proxmoxer a Proxmox VE 8 host has (Debian 12: python3-proxmoxer 1.2.0-2) and with 2.x.

The same scenarios (proxmox_api_scenarios.py) run in a child interpreter against the lab's PVE API stand-in
(tests/lab/rootfs/usr/lib/kpro-lab/pve: pveproxy over HTTPS on 127.0.0.1, pvesh for api_backend=local), once per
stack:

* ``debian12``: proxmoxer 1.2.0 with bookworm's requests 2.28.1 / urllib3 1.26.12, installed once from PyPI with
  pinned hashes into a cache under the temp dir (the PyPI sdist holds the same proxmoxer/ files as Debian's
  python3-proxmoxer_1.2.0-2_all.deb), run by python3.11 (the host's version) when there is one, with ``-S`` so
  that nothing else on that interpreter is seen;
* ``proxmoxer-2``: the dev venv (proxmoxer 2.3.0, requirements/dev.lock).

No address but 127.0.0.1 is contacted, apart from the package index for the one-time install.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
COLLECTIONS = os.path.join(REPO, ".collections")
LAB = os.path.join(REPO, "tests", "lab")
ROOTFS = os.path.join(LAB, "rootfs")
NODE_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SCENARIOS = os.path.join(HERE, "proxmox_api_scenarios.py")

# Debian 12 bookworm: python3-proxmoxer 1.2.0-2, python3-requests 2.28.1+dfsg-1, python3-urllib3 1.26.12-1,
# python3-idna 3.3-1, python3-certifi 2022.9.24-1; charset-normalizer 2.1.1, as Debian's 3.0.1 goes with a patched
# requests and PyPI's 2.28.1 wants < 3.
DEBIAN12_REQUIREMENTS = """\
proxmoxer==1.2.0 --hash=sha256:d1261c1cefd4d4faa6c654922c8db72cfee51e811e5ede4eb38a48cc62dac80e
requests==2.28.1 --hash=sha256:8fefa2a1a1365bf5520aac41836fbee479da67864514bdb821f31ce07ce65349
urllib3==1.26.12 --hash=sha256:b930dd878d5a8afb066a637fbb35144fe7901e3b209d1cd4f524bd0e9deee997
idna==3.3 --hash=sha256:84d9dd047ffa80596e0f246e2eab0b391788b0503584e8945f2368256d2735ff
charset-normalizer==2.1.1 --hash=sha256:83e9a75d1911279afd89352c68b45348559d1fc0506b054b346651b5e7fee29f
certifi==2022.9.24 --hash=sha256:90c1a32f1d68f940488354e36370f6cca89f0f106db09518524c88d6ed83f382
"""
NETWORK_ERRORS = ("dns error", "failed to fetch", "error sending request", "connection refused", "timed out",
                  "network is unreachable", "could not connect", "name or service not known", "failed to download")


class Stack(object):
    """An interpreter and the paths in front of the collection; ``version``: the proxmoxer it must import,
    ``pyversion``: the Python it must be."""

    def __init__(self, name, python, paths, isolated, version=None, pyversion=None):
        self.name, self.python, self.paths, self.isolated = name, python, paths, isolated
        self.version, self.pyversion = version, pyversion

    def run(self, scenario, env, timeout=120, **spec):
        spec = dict(spec, scenario=scenario, paths=self.paths + [COLLECTIONS])
        cmd = [self.python] + (["-S"] if self.isolated else []) + [SCENARIOS, json.dumps(spec)]
        env = dict(env)
        env.pop("PYTHONPATH", None)
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail("%s scenario %s did not finish within %ss (a call without a timeout?)" % (
                self.name, scenario, timeout))
        assert r.returncode == 0, "%s scenario %s failed:\n%s%s" % (self.name, scenario, r.stdout, r.stderr)
        seen = json.loads(r.stdout.strip().splitlines()[-1])
        if self.version:  # the proxmoxer meant, not another one on the interpreter's path
            assert (seen["proxmoxer"] or "").startswith(self.version), (self.name, seen)
        assert seen["python"] == (self.pyversion or seen["python"]), (self.name, seen)
        return seen


def _debian12_python():
    return shutil.which("python3.11") or sys.executable


def _install_debian12():
    """The pinned Debian 12 set, installed once (atomically) into a cache keyed by the pins and the interpreter."""
    python = _debian12_python()
    key = hashlib.sha256((DEBIAN12_REQUIREMENTS + python).encode()).hexdigest()[:12]
    dest = os.path.join(tempfile.gettempdir(), "kpgs-test-stacks", "debian12-" + key)
    if os.path.exists(os.path.join(dest, ".complete")):
        return python, dest
    uv = shutil.which("uv")
    if not uv:
        pytest.skip("uv is needed to install proxmoxer 1.2.0 for this test (make setup installs it)")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    work = tempfile.mkdtemp(prefix="debian12-", dir=os.path.dirname(dest))
    req = os.path.join(work, "requirements.txt")
    with open(req, "w") as f:
        f.write(DEBIAN12_REQUIREMENTS)
    r = subprocess.run([uv, "pip", "install", "--quiet", "--no-deps", "--require-hashes", "--python", python,
                        "--target", os.path.join(work, "site"), "-r", req], capture_output=True, text=True,
                       timeout=600, check=False)
    if r.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        if any(m in r.stderr.lower() for m in NETWORK_ERRORS):
            pytest.skip("cannot reach the package index to install proxmoxer 1.2.0: %s" % r.stderr.strip()[-300:])
        pytest.fail("installing the Debian 12 proxmoxer stack failed:\n%s" % r.stderr)
    open(os.path.join(work, "site", ".complete"), "w").close()
    try:
        os.rename(os.path.join(work, "site"), dest)
    except OSError:  # another run got there first
        pass
    shutil.rmtree(work, ignore_errors=True)
    return python, dest


@pytest.fixture(scope="session")
def debian12():
    python, site = _install_debian12()
    return Stack("debian12", python, [site], isolated=True, version="1.2.0",
                 pyversion="3.11" if python != sys.executable else None)


@pytest.fixture(scope="session", params=["debian12", "proxmoxer-2"])
def stack(request):
    if request.param == "debian12":
        return request.getfixturevalue("debian12")
    pytest.importorskip("proxmoxer")
    return Stack("proxmoxer-2", sys.executable, [], isolated=False, version="2.")


@pytest.fixture(scope="session", params=["debian12", "proxmoxer-2"])
def ssh_stack(request):
    """As ``stack``, with paramiko: the dev venv's interpreter (Debian's python3-paramiko 2.12 has the same
    SSHClient/Channel calls), Debian 12's proxmoxer and requests in front for ``debian12``."""
    pytest.importorskip("paramiko")
    if request.param == "debian12":
        return Stack("debian12+venv-paramiko", sys.executable, request.getfixturevalue("debian12").paths,
                     isolated=False, version="1.2.0")
    pytest.importorskip("proxmoxer")
    return Stack("proxmoxer-2", sys.executable, [], isolated=False, version="2.")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node(object):
    """A temp node root for the lab's PVE stand-in: PKI and credentials (build.d/20-pve-pki.sh), CTs 129/130
    from the unit fixtures, /dev markers, pveproxy on a free port, and pvesh on PATH."""

    def __init__(self, base):
        self.root, run = str(base / "root"), str(base / "run")
        for rel in ("var/lib/kpro-lab", "dev", "bin"):
            os.makedirs(self.p(rel), exist_ok=True)
        with open(self.p("var/lib/kpro-lab/state.json"), "w") as f:
            json.dump({"guests": {}}, f)
        subprocess.run(["sh", os.path.join(LAB, "build.d", "20-pve-pki.sh")], check=True,
                       env=dict(os.environ, KPGS_RUN=run, KPGS_NODE_ROOT=self.root, KPGS_NODE_ADDR="127.0.0.1"))
        with open(os.path.join(run, "pve-credentials.json")) as f:
            self.cred = json.load(f)
        for vmid in (129, 130):
            shutil.copy(os.path.join(REPO, "tests", "unit", "fixtures", "lxc", "%d.conf" % vmid),
                        self.p("etc/pve/lxc/%d.conf" % vmid))
        for name, minor in (("nvidia0", 0), ("nvidiactl", 255)):
            with open(self.p("dev/" + name), "w") as f:  # the lab's marker for a device node
                f.write("c 195:%d\n" % minor)
        with open(self.p("bin/pvesh"), "w") as f:
            f.write('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (NODE_PY, os.path.join(ROOTFS, "usr", "bin", "pvesh")))
        os.chmod(self.p("bin/pvesh"), 0o755)
        self.env = dict(os.environ, KPRO_LAB_ROOT=self.root, KPRO_LAB_CT_START_DELAY="0.3", KPRO_LAB_PVE_AUTH_DELAY="0",
                        PYTHONDONTWRITEBYTECODE="1", PATH=self.p("bin") + os.pathsep + os.environ.get("PATH", ""))
        self.port = _free_port()
        self.proc = subprocess.Popen([NODE_PY, os.path.join(ROOTFS, "usr", "lib", "kpro-lab", "services.d", "pveproxy"),
                                      "--host", "127.0.0.1", "--port", str(self.port)], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc)

    def p(self, rel):
        return os.path.join(self.root, rel)

    def https(self, **kw):
        params = dict(api_backend="https", api_host="127.0.0.1", api_port=self.port, ca_path=self.cred["ca_path"],
                      api_timeout=30, api_token_id=self.cred["token_id"], api_token_secret=self.cred["token_secret"])
        params.update(kw)
        return dict((k, v) for k, v in params.items() if v is not None)

    def password(self, **kw):
        kw.setdefault("api_password", self.cred["password"])
        return self.https(api_token_id=None, api_token_secret=None, **kw)

    def conf(self, vmid):
        with open(self.p("etc/pve/lxc/%d.conf" % vmid)) as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_port(port, proc):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert proc.poll() is None, "pveproxy stand-in exited with %s" % proc.returncode
            time.sleep(0.05)
    raise AssertionError("pveproxy stand-in did not listen on %d" % port)


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.stop()


LOCAL = dict(api_backend="local", api_timeout=60)


# ---------------------------------------------------------------- the same power/task scenarios on each stack


@pytest.mark.parametrize("how", ["https-token", "https-password", "local"])
def test_power_cycle_waits_on_tasks(stack, node, how):
    params = {"https-token": node.https(), "https-password": node.password(), "local": LOCAL}[how]
    seen = stack.run("power", node.env, params=params, vmid=129)
    assert seen["node"] == "kpro5" and seen["before"] == "stopped"
    assert seen["start"] == "OK" and seen["after_start"] == "running"
    assert seen["restart"] == ["OK", "OK"] and seen["after_restart"] == "running"
    assert seen["start_again"].startswith("ProxmoxApiError: start CT 129 failed: HTTP 500")
    assert "CT 129 already running" in seen["start_again"]
    assert seen["digest_len"] == 40 and seen["stop"] == "OK"
    assert seen["authuser"] == {"https-token": "root@pam!ansible"}.get(how, "root@pam")


@pytest.mark.parametrize("how", ["https-token", "local"])
def test_failed_start_task_reports_exit_status_and_log(stack, node, how):
    conf = node.conf(130)
    head, sep, tail = conf.partition("\n[")
    with open(node.p("etc/pve/lxc/130.conf"), "w") as f:
        f.write(head.rstrip("\n") + "\ndev0: /dev/nvidia-uvm,mode=0666\n" + sep + tail)
    params = node.https() if how == "https-token" else LOCAL
    seen = stack.run("start_fails", node.env, params=params, vmid=130)
    assert seen["error"].startswith("ProxmoxTaskError: task UPID:kpro5:"), seen
    assert "failed: Device /dev/nvidia-uvm does not exist" in seen["error"]
    assert "TASK ERROR: Device /dev/nvidia-uvm does not exist" in seen["error"]  # the task log's tail


@pytest.mark.parametrize("how", ["https-password", "local"])
def test_devn_as_root_and_per_parameter_errors(stack, node, how):
    params = node.password() if how == "https-password" else LOCAL
    seen = stack.run("devn", node.env, params=params, vmid=130)
    assert seen["dev0"] == "/dev/nvidia0,mode=0666" and "dev0: /dev/nvidia0,mode=0666\n" in node.conf(130)
    # PVE's answer to a bad value names the parameter (HTTPS: the body's "errors"; pvesh: its stderr lines)
    assert seen["bad"].startswith("ProxmoxApiError: setting dev1 on CT 130 failed: HTTP 400"), seen
    assert "dev1" in seen["bad"].split("HTTP 400", 1)[1] and "/tmp/not-a-device is not a valid device path" in seen["bad"]
    assert "devN can only be changed by root@pam" in seen["token_refused"]
    assert "dev1" not in node.conf(130)


def test_wrong_password_names_the_credentials(stack, node):
    seen = stack.run("connect_error", node.env, params=node.password(api_password="wrong"), vmid=129)
    assert seen["error"].startswith("ProxmoxApiError: connecting to the PVE API (https backend, 127.0.0.1) failed")
    assert "check the credentials" in seen["error"]


class Stall(object):
    """TLS on 127.0.0.1 that completes the handshake, reads the request and never answers."""

    def __init__(self, cert, key):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.sock = ctx.wrap_socket(socket.socket(), server_side=True)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _addr = self.sock.accept()
                conn.recv(65536)
            except OSError:
                return
            self.conns.append(conn)

    def close(self):
        for c in self.conns + [self.sock]:
            c.close()


def test_every_request_has_the_api_timeout(stack, node):
    stall = Stall(node.p("etc/pve/local/pve-ssl.pem"), node.p("etc/pve/local/pve-ssl.key"))
    try:
        seen = stack.run("connect_error", node.env, timeout=40, params=node.https(api_port=stall.port, api_timeout=2),
                         vmid=129)
    finally:
        stall.close()
    assert seen["error"].startswith("ProxmoxApiError: reading the status of CT 129 failed"), seen
    assert "raise api_timeout" in seen["error"] and seen["seconds"] < 15


class Sshd(object):
    """A paramiko SSH server on 127.0.0.1 that runs each exec request with ``sh -c`` in the node's environment
    (so ``pvesh`` is the lab's), for one client key; known_hosts holds its host key."""

    def __init__(self, tmp_path, env):
        import paramiko
        self.paramiko, self.env = paramiko, env
        self.host_key = paramiko.RSAKey.generate(2048)
        client_key = paramiko.RSAKey.generate(2048)
        self.key_file = str(tmp_path / "id_rsa")
        client_key.write_private_key_file(self.key_file)
        self.client_pub = client_key.get_base64()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.known_hosts = str(tmp_path / "known_hosts")
        with open(self.known_hosts, "w") as f:
            f.write("[127.0.0.1]:%d ssh-rsa %s\n" % (self.port, self.host_key.get_base64()))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            t = self.paramiko.Transport(conn)
            t.add_server_key(self.host_key)
            t.start_server(server=self._interface())

    def _interface(self):
        pm, sshd = self.paramiko, self

        class Interface(pm.ServerInterface):
            def get_allowed_auths(self, username):
                return "publickey"

            def check_auth_publickey(self, username, key):
                ok = username == "root" and key.get_base64() == sshd.client_pub
                return pm.AUTH_SUCCESSFUL if ok else pm.AUTH_FAILED

            def check_channel_request(self, kind, chanid):
                return pm.OPEN_SUCCEEDED if kind == "session" else pm.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

            def check_channel_exec_request(self, channel, command):
                threading.Thread(target=sshd._exec, args=(channel, command), daemon=True).start()
                return True
        return Interface()

    def _exec(self, channel, command):
        r = subprocess.run(["sh", "-c", command.decode()], env=self.env, capture_output=True, timeout=120, check=False)
        channel.sendall(r.stdout)
        channel.sendall_stderr(r.stderr)
        channel.send_exit_status(r.returncode)
        channel.close()

    def params(self, **kw):
        params = dict(api_backend="ssh_paramiko", api_host="127.0.0.1", ssh_port=self.port, ssh_user="root",
                      ssh_private_key_file=self.key_file, ssh_known_hosts=self.known_hosts, api_timeout=60)
        params.update(kw)
        return params


@pytest.fixture
def sshd(tmp_path, node):
    server = Sshd(tmp_path, node.env)
    yield server
    server.sock.close()


def test_ssh_paramiko_power_cycle(ssh_stack, node, sshd):
    seen = ssh_stack.run("power", node.env, params=sshd.params(), vmid=129)
    assert seen["before"] == "stopped" and seen["start"] == "OK" and seen["after_start"] == "running"
    assert seen["restart"] == ["OK", "OK"] and "CT 129 already running" in seen["start_again"]
    assert seen["stop"] == "OK" and seen["authuser"] == "root@pam"


def test_ssh_paramiko_refuses_an_unknown_host_key(ssh_stack, node, sshd, tmp_path):
    other = tmp_path / "other_known_hosts"
    other.write_text("[127.0.0.1]:%d ssh-rsa %s\n" % (sshd.port + 1, sshd.host_key.get_base64()))
    seen = ssh_stack.run("connect_error", node.env, params=sshd.params(ssh_known_hosts=str(other)), vmid=129)
    assert "the ssh host key of 127.0.0.1 is not in %s" % other in seen["error"]
    seen = ssh_stack.run("connect_error", node.env, params=sshd.params(ssh_known_hosts=str(tmp_path / "none")), vmid=129)
    assert "ssh host key checking is on but %s does not exist" % (tmp_path / "none") in seen["error"]


# ---------------------------------------------------------------- what the host lacks, said before connecting


def test_missing_proxmoxer_names_the_package(tmp_path):
    seen = Stack("bare", _debian12_python(), [str(tmp_path)], isolated=True).run("problem", os.environ,
                                                                                 params=dict(api_backend="local"), vmid=129)
    assert seen["proxmoxer"] is None
    assert "proxmoxer" in seen["problem"] and "apt-get install python3-proxmoxer python3-requests" in seen["problem"]
    assert seen["connect"] == "ProxmoxApiError: " + seen["problem"]


def test_missing_requests_is_an_error_not_an_exit(debian12, tmp_path):
    only = tmp_path / "site"
    only.mkdir()
    os.symlink(os.path.join(debian12.paths[0], "proxmoxer"), str(only / "proxmoxer"))
    seen = Stack("no-requests", debian12.python, [str(only)], isolated=True).run(
        "problem", os.environ, params=dict(api_backend="https", api_host="127.0.0.1", api_password="x"), vmid=129)
    # proxmoxer's https backend would sys.exit(1) on the import (1.2.0 backends/https.py:26): no JSON for Ansible
    assert seen["proxmoxer"] == "1.2.0" and "python3-requests" in seen["problem"]
    assert seen["connect"] == "ProxmoxApiError: " + seen["problem"]


def test_module_fails_before_writing_and_names_the_packages(tmp_path, monkeypatch):
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
    from ansible_collections.kpro.gpu_serving.plugins.modules import lxc_gpu_passthrough as mod
    from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleFailJson, run_module
    monkeypatch.setattr(pa, "HAS_PROXMOXER", False)
    monkeypatch.setattr(pa, "PROXMOXER_IMPORT_ERROR", ImportError("No module named 'proxmoxer'"))
    (tmp_path / "lxc").mkdir()
    conf = tmp_path / "lxc" / "129.conf"
    shutil.copy(os.path.join(REPO, "tests", "unit", "fixtures", "lxc", "129.conf"), str(conf))
    before = conf.read_bytes()
    with pytest.raises(AnsibleFailJson) as e:
        run_module(mod, dict(vmid=129, config_dir=str(tmp_path / "lxc"), devices=["/dev/nvidia0"], restart=True,
                             api_host="127.0.0.1", api_token_id="ansible", api_token_secret="x",
                             backup_dir=str(tmp_path / "bk"), lock_dir=str(tmp_path / "lock")))
    msg = e.value.result["msg"]
    assert msg.startswith("library_missing: the proxmoxer Python library is missing or unusable on the target")
    assert "No module named 'proxmoxer'" in msg and "`apt-get install python3-proxmoxer python3-requests`" in msg
    assert conf.read_bytes() == before and not (tmp_path / "bk").exists()
