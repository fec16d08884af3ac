"""The lab's simulated PVE management plane (tests/lab/rootfs/usr/lib/kpro-lab/pve) on a temp root.

No lab and no root needed: the API server runs as a subprocess on 127.0.0.1 with
KPRO_LAB_ROOT pointing at a temp node root prepared by build.d/20-pve-pki.sh; proxmoxer
(https and local backends) talks to it exactly as it would to the lab node.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import LAB, LABLIB, REPO, lablib

FIX = os.path.join(REPO, "tests", "unit", "fixtures", "lxc")
ROOTFS = os.path.join(LAB, "rootfs")
NODE_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

ctconf = lablib("pve.ctconf")


# ---- config grammar (pure) -------------------------------------------------------------

MESSY = """\
# first comment: with colon 100%
hostname: ct1
arch: amd64
lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
memory: 2048
#second comment
lxc.cgroup2.devices.allow: c 195:* rwm
onboot: yes
cores: 2
lxc.environment.runtime: FOO=bar
description: inline part

[pve:pending]
cores: 4

[snap1]
#snapshot comment
memory: 1024
snaptime: 1700000000
lxc.idmap: u 0 100000 65536
arch: amd64
"""

MESSY_PVE = """\
# first comment%3A with colon 100%25
#second comment
#inline part
arch: amd64
cores: 2
hostname: ct1
memory: 2048
onboot: 1
lxc.environment.runtime: FOO=bar
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.cgroup2.devices.allow: c 195:* rwm

[pve:pending]
cores: 4

[snap1]
#snapshot comment
arch: amd64
memory: 1024
snaptime: 1700000000
lxc.idmap: u 0 100000 65536
"""


def test_rewrite_is_pve_style():
    conf = ctconf.parse(MESSY, 131)
    assert conf["description"] == " first comment: with colon 100%\nsecond comment\ninline part"
    assert conf["onboot"] == 1 and conf["memory"] == 2048
    assert conf["lxc"][0] == ["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"]
    assert conf["env"] == "FOO=bar"
    assert conf["pending"] == {"cores": 4}
    assert ctconf.render(conf) == MESSY_PVE
    again = ctconf.parse(MESSY_PVE, 131)
    assert ctconf.render(again) == MESSY_PVE


def test_fixture_129_rewrite_sorts_snapshots_only():
    with open(os.path.join(FIX, "129.conf")) as f:
        raw = f.read()
    out = ctconf.render(ctconf.parse(raw, 129))
    main, _sep, snaps = raw.partition("\n[pre-sglang]\n")
    pre, _sep, fresh = snaps.partition("\n[fresh]\n")
    assert out == main + "\n[fresh]\n" + fresh + "\n[pre-sglang]\n" + pre
    assert ctconf.render(ctconf.parse(out, 129)) == out


def test_encode_text_like_pve():
    assert ctconf.encode_text("a:b%c d\u00e9\t") == "a%3Ab%25c d%C3%A9%09"
    assert ctconf.decode_text("a%3Ab%25c d%C3%A9%09") == "a:b%c d\u00e9\t"


def test_invalid_lxc_keys_warn_and_drop(capsys):
    conf = ctconf.parse("arch: amd64\nlxc.rootfs.path: /x\nlxc.bogus: 1\ndelete: swap\n", 132)
    err = capsys.readouterr().err
    assert "vm 132 - lxc.rootfs.path: lxc.rootfs.path is auto generated from rootfs" in err
    assert "vm 132 - unable to parse config: lxc.bogus: 1" in err
    assert "vm 132 - property 'delete' is only allowed in [pve:pending]" in err
    assert "lxc" not in conf


def test_device_string_validation():
    assert ctconf.parse_device("/dev/nvidia0,mode=0666,gid=44") == {"path": "/dev/nvidia0", "mode": "0666", "gid": "44"}
    with pytest.raises(Exception, match="not a valid device path"):
        ctconf.parse_device("/tmp/x")
    with pytest.raises(Exception, match="regex pattern"):
        ctconf.parse_device("/dev/nvidia0,mode=666")


# ---- a node root with the PVE files, and the server ------------------------------------------

class PveRoot(object):
    def __init__(self, base):
        self.path = str(base / "root")
        self.run_dir = str(base / "run")
        for rel in ("var/lib/kpro-lab", "dev", "etc"):
            os.makedirs(os.path.join(self.path, rel), exist_ok=True)
        with open(os.path.join(self.path, "var/lib/kpro-lab/state.json"), "w") as f:
            json.dump({"guests": {}}, f)
        env = dict(os.environ, KPGS_RUN=self.run_dir, KPGS_NODE_ROOT=self.path, KPGS_NODE_ADDR="127.0.0.1",
                   PYTHONDONTWRITEBYTECODE="1")
        subprocess.run(["sh", os.path.join(LAB, "build.d", "20-pve-pki.sh")], env=env, check=True)
        with open(os.path.join(self.run_dir, "pve-credentials.json")) as f:
            self.cred = json.load(f)
        for name in ("129.conf", "130.conf"):
            shutil.copy(os.path.join(FIX, name), self.p("etc/pve/lxc/" + name))
        os.makedirs(self.p("etc/pve/qemu-server"), exist_ok=True)
        with open(self.p("etc/pve/qemu-server/101.conf"), "w") as f:
            f.write("boot: order=scsi0\ncores: 8\nhostpci0: 0000:01:00,pcie=1\nmemory: 65536\nname: gpu-vm\nonboot: 1\n")
        with open(self.p("etc/pve/mapping/pci.cfg"), "w") as f:
            f.write("pci: a6000\n\tmap id=10de:2230,iommugroup=1,node=kpro5,path=0000:01:00.0,subsystem-id=10de:1459\n"
                    "\tdescription RTX A6000%3A 0\n")
        self.dev("nvidia0", 195, 0)
        self.dev("nvidiactl", 195, 255)

    def p(self, rel):
        return os.path.join(self.path, rel.lstrip("/"))

    def dev(self, name, major, minor):
        with open(self.p("dev/" + name), "w") as f:  # the lab's marker for an unprivileged device node
            f.write("c %d:%d\n" % (major, minor))

    def env(self, **extra):
        env = dict(os.environ, KPRO_LAB_ROOT=self.path, KPRO_LAB_CT_START_DELAY="0.3", KPRO_LAB_PVE_AUTH_DELAY="0",
                   PYTHONDONTWRITEBYTECODE="1",
                   PATH=os.pathsep.join([os.path.join(ROOTFS, "usr", "bin"), os.path.join(ROOTFS, "usr", "sbin"),
                                         os.environ.get("PATH", "")]))
        env.update(extra)
        return env

    def conf(self, vmid=129):
        with open(self.p("etc/pve/lxc/%d.conf" % vmid)) as f:
            return f.read()

    def tool(self, name, *args):
        rel = {"pct": "usr/sbin/pct", "qm": "usr/sbin/qm", "pvesh": "usr/bin/pvesh"}[name]
        return subprocess.run([NODE_PY, os.path.join(ROOTFS, rel)] + list(args), env=self.env(), capture_output=True,
                              text=True, timeout=60, check=False)

    def state(self):
        with open(self.p("var/lib/kpro-lab/state.json")) as f:
            return json.load(f)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pveroot(tmp_path, monkeypatch):
    r = PveRoot(tmp_path)
    for k, v in r.env().items():
        if k.startswith("KPRO_LAB") or k == "PATH":
            monkeypatch.setenv(k, v)
    return r


@pytest.fixture
def server(pveroot):
    port = _free_port()
    proc = subprocess.Popen([NODE_PY, os.path.join(LABLIB, "services.d", "pveproxy"), "--host", "127.0.0.1", "--port",
                             str(port)], env=pveroot.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read().decode())
            time.sleep(0.05)
    yield "127.0.0.1:%d" % port
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _token_api(host, cred, **kw):
    proxmoxer = pytest.importorskip("proxmoxer")
    return proxmoxer.ProxmoxAPI(host, user="root@pam", token_name="ansible", token_value=cred["token_secret"],
                                verify_ssl=cred["ca_path"], timeout=30, **kw)


def _ticket_api(host, cred):
    proxmoxer = pytest.importorskip("proxmoxer")
    return proxmoxer.ProxmoxAPI(host, user="root@pam", password=cred["password"], verify_ssl=cred["ca_path"], timeout=30)


# ---- HTTPS API with proxmoxer -----------------------------------------------------------------------

def test_https_token_read_endpoints(server, pveroot):
    px = _token_api(server, pveroot.cred)
    assert px.version.get()["release"] == "8.4"
    assert [n["node"] for n in px.nodes.get()] == ["kpro5"]
    cts = {c["vmid"]: c for c in px.nodes("kpro5").lxc.get()}
    assert set(cts) == {129, 130} and cts[129]["status"] == "stopped" and cts[129]["name"] == "llm129"
    st = px.nodes("kpro5").lxc(129).status.current.get()
    assert st["status"] == "stopped" and st["vmid"] == 129 and st["ha"] == {"managed": 0}
    conf = px.nodes("kpro5").lxc(129).config.get()
    assert len(conf["digest"]) == 40 and conf["memory"] == 196608  # pending value, as PVE (current=0)
    assert conf["swap"] == 0  # PVE quirk: a pending delete hides only truthy values (load_current_config)
    assert conf["lxc"][0] == ["lxc.idmap", "u 0 100000 1000"]
    assert conf["description"].startswith("SGLang server: Qwen3.6-27B")
    assert px.nodes("kpro5").lxc(129).config.get(current=1)["memory"] == 131072
    vms = px.nodes("kpro5").qemu.get()
    assert vms[0]["vmid"] == 101 and vms[0]["status"] == "stopped"
    assert px.nodes("kpro5").qemu(101).config.get()["hostpci0"] == "0000:01:00,pcie=1"
    mapping = px.cluster.mapping.pci.get()
    assert mapping[0]["id"] == "a6000" and mapping[0]["map"][0].startswith("id=10de:2230")
    assert mapping[0]["description"] == "RTX A6000: 0"


def test_https_errors_as_pve(server, pveroot):
    from proxmoxer.core import ResourceException
    px = _token_api(server, pveroot.cred)
    with pytest.raises(ResourceException) as e:
        px.nodes("kpro5").lxc(999).config.get()
    assert e.value.status_code == 500
    assert "Configuration file 'nodes/kpro5/lxc/999.conf' does not exist" in str(e.value)
    with pytest.raises(ResourceException) as e:
        px.nodes("kpro5").lxc(129).config.put(**{"lxc.cgroup2.devices.allow": "c 195:* rwm"})
    assert e.value.status_code == 400
    assert e.value.errors == {"lxc.cgroup2.devices.allow": ctconf.NOT_IN_SCHEMA}
    with pytest.raises(ResourceException) as e:
        px.nodes("kpro6").lxc.get()
    assert "hostname lookup 'kpro6' failed" in str(e.value)


def test_https_bad_credentials_401(server, pveroot):
    import proxmoxer
    from proxmoxer.core import ResourceException
    cred = dict(pveroot.cred, token_secret="00000000-0000-0000-0000-000000000000")
    with pytest.raises(ResourceException) as e:
        _token_api(server, cred).version.get()
    assert e.value.status_code == 401 and "Authentication failed!" in str(e.value)
    with pytest.raises(proxmoxer.AuthenticationError):
        _ticket_api(server, dict(pveroot.cred, password="wrong"))


def test_https_put_ordinary_key_rewrites_pve_style(server, pveroot):
    px = _token_api(server, pveroot.cred)
    digest = px.nodes("kpro5").lxc(129).config.get()["digest"]
    before = ctconf.render(ctconf.parse(pveroot.conf(), 129))  # what PVE makes of the hand-written fixture
    assert px.nodes("kpro5").lxc(129).config.put(cores=16, digest=digest) is None
    after = pveroot.conf()
    assert "cores: 16\n" in after and "cores: 32\n" in after.split("[pre-sglang]")[1]
    assert after.startswith("#SGLang server%3A Qwen3.6-27B")
    assert after.replace("cores: 16\n", "cores: 32\n", 1) == before
    from proxmoxer.core import ResourceException
    with pytest.raises(ResourceException) as e:  # the digest is stale now
        px.nodes("kpro5").lxc(129).config.put(cores=8, digest=digest)
    assert "detected modified configuration - file changed by other user? Try again." in str(e.value)


def test_https_devn_token_refused_ticket_accepted(server, pveroot):
    from proxmoxer.core import ResourceException
    px = _token_api(server, pveroot.cred)
    with pytest.raises(ResourceException) as e:
        px.nodes("kpro5").lxc(130).config.put(dev0="/dev/nvidia0,mode=0666")
    assert e.value.status_code == 403
    assert "Permission check failed (configuring device passthrough is only allowed for root@pam)" in str(e.value)
    assert "dev0" not in pveroot.conf(130)
    pt = _ticket_api(server, pveroot.cred)
    pt.nodes("kpro5").lxc(130).config.put(dev0="/dev/nvidia0,mode=0666", dev1="/dev/nvidiactl,mode=0666")
    assert "dev0: /dev/nvidia0,mode=0666\ndev1: /dev/nvidiactl,mode=0666\n" in pveroot.conf(130)
    with pytest.raises(ResourceException) as e:
        pt.nodes("kpro5").lxc(130).config.put(dev2="/dev/nvidia-uvm")
    assert e.value.status_code == 500 and "Device /dev/nvidia-uvm does not exist" in str(e.value)
    pt.nodes("kpro5").lxc(130).config.put(delete="dev1")
    assert "dev1:" not in pveroot.conf(130)


def test_https_start_stop_tasks(server, pveroot):
    from proxmoxer.core import ResourceException
    from proxmoxer.tools import Tasks
    px = _token_api(server, pveroot.cred)
    ct = px.nodes("kpro5").lxc(129)
    upid = ct.status.start.post()
    d = Tasks.decode_upid(upid)
    assert d["type"] == "vzstart" and d["id"] == "129" and upid.endswith(":root@pam!ansible:")
    assert px.nodes("kpro5").tasks(upid).status.get()["status"] == "running"
    st = Tasks.blocking_status(px, upid, timeout=30, polling_interval=0.2)
    assert st["status"] == "stopped" and st["exitstatus"] == "OK", st
    assert ct.status.current.get()["status"] == "running"
    assert pveroot.state()["guests"]["129"]["status"] == "running"
    assert "memory: 196608\n" in pveroot.conf().split("[")[0]  # pending applied at start
    with pytest.raises(ResourceException) as e:
        ct.status.start.post()
    assert "CT 129 already running" in str(e.value)
    # on a running CT devN stays pending (PVE 8), hostname applies at once
    pt = _ticket_api(server, pveroot.cred)
    pt.nodes("kpro5").lxc(129).config.put(dev0="/dev/nvidia0", hostname="llm129b")
    main, pending = pveroot.conf().split("[pve:pending]")
    assert "hostname: llm129b" in main and "dev0: /dev/nvidia0" in pending.split("\n[")[0]
    st = Tasks.blocking_status(px, ct.status.stop.post(), timeout=30, polling_interval=0.2)
    assert st["exitstatus"] == "OK"
    assert ct.status.current.get()["status"] == "stopped"
    log = Tasks.decode_log(px.nodes("kpro5").tasks(upid).log.get())
    assert log.splitlines()[-1] == "TASK OK"


def test_https_start_fails_on_missing_device_and_lock(server, pveroot):
    from proxmoxer.core import ResourceException
    from proxmoxer.tools import Tasks
    px = _token_api(server, pveroot.cred)
    conf = pveroot.conf(130)
    head, sep, tail = conf.partition("\n[")
    with open(pveroot.p("etc/pve/lxc/130.conf"), "w") as f:
        f.write(head.rstrip("\n") + "\ndev0: /dev/nvidia-uvm,mode=0666\n" + sep + tail)
    st = Tasks.blocking_status(px, px.nodes("kpro5").lxc(130).status.start.post(), timeout=30, polling_interval=0.2)
    assert st["status"] == "stopped" and st["exitstatus"] == "Device /dev/nvidia-uvm does not exist"
    assert px.nodes("kpro5").lxc(130).status.current.get()["status"] == "stopped"
    px.nodes("kpro5").lxc(129).config.put(lock="backup")
    assert px.nodes("kpro5").lxc(129).status.current.get()["lock"] == "backup"
    with pytest.raises(ResourceException) as e:
        px.nodes("kpro5").lxc(129).config.put(cores=2)
    assert "CT is locked (backup)" in str(e.value)
    st = Tasks.blocking_status(px, px.nodes("kpro5").lxc(129).status.start.post(), timeout=30, polling_interval=0.2)
    assert st["exitstatus"] == "CT is locked (backup)"
    r = pveroot.tool("pct", "unlock", "129")
    assert r.returncode == 0, r.stderr
    assert "\nlock:" not in pveroot.conf()


def test_ticket_needs_csrf_on_writes(server, pveroot):
    import requests
    cred = pveroot.cred
    base = "https://%s/api2/json" % server
    r = requests.post(base + "/access/ticket", data={"username": "root@pam", "password": cred["password"]},
                      verify=cred["ca_path"], timeout=30)
    data = r.json()["data"]
    cookies = {"PVEAuthCookie": data["ticket"]}
    r = requests.put(base + "/nodes/kpro5/lxc/129/config", data={"cores": "4"}, cookies=cookies, verify=cred["ca_path"],
                     timeout=30)
    assert r.status_code == 401 and r.reason == "Permission denied - invalid csrf token"
    r = requests.put(base + "/nodes/kpro5/lxc/129/config", data={"cores": "4"}, cookies=cookies,
                     headers={"CSRFPreventionToken": data["CSRFPreventionToken"]}, verify=cred["ca_path"], timeout=30)
    assert r.status_code == 200 and r.json() == {"data": None}
    r = requests.get(base + "/version", verify=cred["ca_path"], timeout=30)
    assert r.status_code == 401 and r.reason == "No ticket"


# ---- pvesh through proxmoxer's local backend (the same command line as ssh_paramiko) ------------------

def test_pvesh_local_backend(pveroot):
    proxmoxer = pytest.importorskip("proxmoxer")
    from proxmoxer.core import ResourceException
    from proxmoxer.tools import Tasks
    px = proxmoxer.ProxmoxAPI(backend="local", timeout=60)
    assert px.version.get()["version"] == "8.4.1"
    assert px.nodes("kpro5").lxc(129).status.current.get()["status"] == "stopped"
    px.nodes("kpro5").lxc(130).config.put(dev0="/dev/nvidia0,mode=0666")  # pvesh is root@pam: allowed
    assert "dev0: /dev/nvidia0,mode=0666" in pveroot.conf(130)
    with pytest.raises(ResourceException) as e:
        px.nodes("kpro5").lxc(130).config.put(**{"lxc.mount.entry": "x"})
    assert e.value.status_code == 400
    upid = px.nodes("kpro5").lxc(130).status.start.post()
    st = Tasks.blocking_status(px, upid, timeout=30, polling_interval=0.2)
    assert st["exitstatus"] == "OK" and st["user"] == "root@pam"
    with pytest.raises(ResourceException) as e:
        px.nodes("kpro5").lxc(130).status.start.post()
    assert e.value.status_code == 500 and "CT 130 already running" in str(e.value)


# ---- pct / qm ------------------------------------------------------------------------------------------

def test_pct_cli(pveroot):
    r = pveroot.tool("pct", "list")
    assert r.returncode == 0 and r.stdout.splitlines()[0].split() == ["VMID", "Status", "Lock", "Name"]
    r = pveroot.tool("pct", "set", "130", "-dev0", "/dev/nvidia0,gid=44,mode=0666", "--dev1", "/dev/nvidiactl")
    assert r.returncode == 0, r.stderr
    assert "dev0: /dev/nvidia0,gid=44,mode=0666\ndev1: /dev/nvidiactl\n" in pveroot.conf(130)
    r = pveroot.tool("pct", "set", "130", "-delete", "dev1")
    assert r.returncode == 0 and "dev1" not in pveroot.conf(130)
    r = pveroot.tool("pct", "set", "130", "-lxc.cgroup2.devices.allow", "c 195:* rwm")
    assert r.returncode == 255 and "Unknown option: lxc.cgroup2.devices.allow" in r.stderr
    r = pveroot.tool("pct", "set", "130", "-dev2", "/dev/nvidia-uvm")
    assert r.returncode == 255 and r.stderr == "Device /dev/nvidia-uvm does not exist\n"
    r = pveroot.tool("pct", "exec", "130", "--", "true")
    assert r.returncode == 255 and "container '130' not running!" in r.stderr
    r = pveroot.tool("pct", "start", "130")
    assert r.returncode == 0, r.stderr
    assert pveroot.tool("pct", "status", "130").stdout == "status: running\n"
    r = pveroot.tool("pct", "start", "130")
    assert r.returncode == 255 and r.stderr == "CT 130 already running\n"
    r = pveroot.tool("pct", "stop", "130")
    assert r.returncode == 0, r.stderr
    r = pveroot.tool("pct", "set", "130", "-dev3", "/dev/nvidia0", "-hostname", "x")
    assert r.returncode == 0
    os.unlink(pveroot.p("dev/nvidia0"))
    r = pveroot.tool("pct", "start", "130")
    assert r.returncode == 255 and "Device /dev/nvidia0 does not exist" in r.stderr
    r = pveroot.tool("pct", "config", "129")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "arch: amd64"
    assert "description: SGLang server%3A Qwen3.6-27B" in r.stdout and "lxc.apparmor.profile: unconfined" in r.stdout
    r = pveroot.tool("qm", "list")
    assert r.returncode == 0 and "gpu-vm" in r.stdout
    r = pveroot.tool("qm", "config", "101")
    assert "hostpci0: 0000:01:00,pcie=1" in r.stdout


def test_config_lock_file_taken(pveroot):
    import fcntl
    lockfile = pveroot.p("run/lock/lxc/pve-config-130.lock")
    os.makedirs(os.path.dirname(lockfile), exist_ok=True)
    with open(lockfile, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        p = subprocess.Popen([NODE_PY, os.path.join(ROOTFS, "usr/sbin/pct"), "set", "130", "-cores", "3"],
                             env=pveroot.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        assert p.poll() is None  # waiting for the lock
        fcntl.flock(f, fcntl.LOCK_UN)
    assert p.wait(timeout=20) == 0
    assert "cores: 3\n" in pveroot.conf(130)


# ---- pve-guests.service's startall (issue 14) ------------------------------------------------------------

def test_startall_starts_onboot_guests_and_logs_a_refused_ct(pveroot):
    """pve-manager Nodes.pm startall through pvesh as pve-guests.service runs it ('localhost' is the local node):
    onboot guests by startup order then VMID; a CT whose devN node is missing is refused with PVE's message and the
    startall task says "Starting CT <vmid> failed: <status>"; CTs without onboot stay stopped."""
    conf = pveroot.conf(130)
    head, sep, tail = conf.partition("\n[")
    with open(pveroot.p("etc/pve/lxc/130.conf"), "w") as f:
        f.write(head.rstrip("\n") + "\nonboot: 1\ndev0: /dev/nvidia-uvm,mode=0666\n" + sep + tail)
    r = pveroot.tool("pvesh", "--nooutput", "create", "/nodes/localhost/startall")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Starting CT 130\nStarting CT 130 failed: Device /dev/nvidia-uvm does not exist" in out, out
    # 129 has startup order=3: before the guests without an order (pve-manager get_start_stop_list)
    assert "Starting CT 129" in out and out.index("Starting CT 129") < out.index("Starting CT 130"), out
    assert "kpro-lab: VM 101 (onboot, 0000:01:00,pcie=1) not started" in out
    guests = pveroot.state()["guests"]
    assert guests["129"]["status"] == "running" and guests.get("130", {}).get("status", "stopped") == "stopped"
    r = pveroot.tool("pvesh", "get", "/nodes/localhost/tasks", "--output-format", "json")
    assert '"type": "startall"' in r.stdout or '"startall"' in r.stdout, r.stdout[-2000:]
