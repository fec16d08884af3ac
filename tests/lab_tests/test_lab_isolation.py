"""The lab leaves the real machine alone: /etc, /dev, mounts, cmdline, PCI, processes, netns.

Also: up/up and down/down are idempotent, SSH with the lab key works, and ansible's ping
through inventories/lab answers. If the lab was up when this starts, it is brought down
with ``--keep-disk`` first and up again at the end, so the node's disk survives.
"""

import hashlib
import os
import subprocess
import time

import pytest

from conftest import REPO, RUN, SSH_DIR, NODE_IP, labctl, lab_is_up

NETNS = "kpgs-kpro5"


def etc_snapshot():
    out = {}
    for dirpath, dirnames, filenames in os.walk("/etc"):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                out[p] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                try:
                    with open(p, "rb") as f:
                        out[p] = hashlib.sha256(f.read()).hexdigest()
                except OSError:
                    out[p] = "unreadable"
            else:
                out[p] = "dir"
    return out


def dev_snapshot():
    out = {}
    for dirpath, dirnames, filenames in os.walk("/dev"):
        if dirpath.startswith(("/dev/pts", "/dev/shm", "/dev/mqueue")):
            continue
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
                out[p] = (st.st_mode, st.st_rdev)
            except OSError:
                pass
    return out


def mounts():
    with open("/proc/mounts") as f:
        # iproute2's own /run/netns bind (made once by the first `ip netns add`, kept by design) is allowed
        return sorted(line for line in f if line.split()[1] != "/run/netns")


def processes():
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    out[int(name)] = int(f.read().rsplit(")", 1)[1].split()[19])
            except (OSError, ValueError, IndexError):
                pass
    return out


def snapshot():
    return {"etc": etc_snapshot(), "dev": dev_snapshot(), "mounts": mounts(),
            "cmdline": open("/proc/cmdline").read(), "pci": sorted(os.listdir("/sys/bus/pci/devices"))
            if os.path.isdir("/sys/bus/pci/devices") else [], "netns": os.path.exists("/run/netns/" + NETNS)}


def recorded_pids():
    d = os.path.join(RUN, "pids")
    out = []
    for name in os.listdir(d):
        if name.endswith(".pid"):
            pid, st = open(os.path.join(d, name)).read().split()
            out.append((name, int(pid), int(st)))
    return out


def running(pid, st, wait=5.0):
    """True if the process we recorded still runs (a zombie waiting for its reaper has ended)."""
    end = time.time() + wait
    while True:
        try:
            fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
            alive = int(fields[19]) == st and fields[0] != "Z"
        except OSError:
            alive = False
        if not alive or time.time() > end:
            return alive
        time.sleep(0.1)


def netns_members(ino):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat("/proc/%s/ns/net" % name).st_ino == ino:
                    out.append(int(name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def lab_down_first():
    if os.geteuid() != 0:
        pytest.skip("lab tests need root")
    was_up = lab_is_up()
    if was_up:
        labctl("down", "--keep-disk")
    yield
    if was_up:
        labctl("up")
    else:
        labctl("down")


def test_up_poke_down_leaves_machine_unchanged(lab_down_first):
    before = snapshot()
    procs_before = processes()
    r = labctl("up")
    assert "kpro5 up" in r.stdout
    r2 = labctl("up")  # idempotent: a no-op while healthy
    assert "kpro5 up" in r2.stdout and "seeding" not in r2.stderr
    pids = recorded_pids()
    assert {"supervisor", "init", "fakesys", "sshd", "anchor"} <= {n[:-4] for n, _, _ in pids}
    ns_ino = os.stat("/run/netns/" + NETNS).st_ino
    # poke: write to the node's /etc and /sys over SSH, and through labctl exec
    ssh = ["ssh", "-i", os.path.join(SSH_DIR, "id_ed25519"), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
           "-o", "UserKnownHostsFile=" + os.path.join(SSH_DIR, "known_hosts"), "root@" + NODE_IP]
    script = ("echo poke > /etc/kpgs-poke && echo 'options foo bar=1' > /etc/modprobe.d/poke.conf && "
              "echo nvidia > /sys/bus/pci/devices/0000:17:00.0/driver_override && "
              "echo 0000:17:00.0 > /sys/bus/pci/drivers_probe && mount -t tmpfs poke /mnt && "
              "hostname && cat /proc/cmdline")
    out = subprocess.run(ssh + [script], check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
    assert out.startswith("kpro5\n") and "vfio-pci.ids=" in out
    assert labctl("exec", "--", "sh", "-c", "echo x > /etc/kpgs-poke2").returncode == 0
    assert not os.path.exists("/etc/kpgs-poke")
    assert labctl("down").returncode == 0
    assert labctl("down").returncode == 0  # idempotent
    for name, pid, st in pids:
        assert not running(pid, st), "%s (pid %d) survived down" % (name, pid)
    assert netns_members(ns_ino) == []
    new = {p for p, st in processes().items() if procs_before.get(p) != st}
    leftovers = []
    for p in new:
        try:
            cmd = open("/proc/%d/cmdline" % p).read().replace("\0", " ")
        except OSError:
            continue
        if "labctl.py _init" in cmd or "fakesys.py" in cmd or "sshd_config" in cmd:
            leftovers.append((p, cmd))
    assert leftovers == []
    after = snapshot()
    assert not after["netns"]
    assert subprocess.run(["ip", "link", "show", "kpgs5h"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0
    for key in ("etc", "dev", "mounts", "cmdline", "pci"):
        assert after[key] == before[key], key
    assert not os.path.exists(RUN)


def test_ssh_and_ansible_ping(lab_down_first):
    labctl("up")
    r = subprocess.run(["ssh", "-i", os.path.join(SSH_DIR, "id_ed25519"), "-o", "UserKnownHostsFile=" + os.path.join(SSH_DIR, "known_hosts"),
                        "-o", "BatchMode=yes", "root@" + NODE_IP, "true"], timeout=30)
    assert r.returncode == 0
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "kpro5", "-m", "ping"], cwd=REPO, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert r.returncode == 0 and "pong" in r.stdout, r.stdout
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "kpro5", "-m", "setup", "-a", "gather_subset=min"], cwd=REPO,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert r.returncode == 0 and '"ansible_hostname": "kpro5"' in r.stdout.replace("ansible_hostname: kpro5", '"ansible_hostname": "kpro5"'), r.stdout
