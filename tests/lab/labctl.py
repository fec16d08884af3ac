#!/usr/bin/env python3
"""Start, stop and drive the lab's simulated Proxmox node kpro5 (run as root).

    labctl.py up [--nodes 2] [--release pve8|pve9] | down [--keep-disk] | status | reset [--release R] | root | release
    labctl.py exec -- CMD...
    labctl.py --node kpro7 status | root | exec -- CMD...   (the second node of ``up --nodes 2``)
    labctl.py reboot | kernel-upgrade [RELEASE] | publish-kernel RELEASE [--no-headers] | unpublish-kernel RELEASE
    labctl.py secure-boot on|off | mok-enroll CERT | mok-list

``--release`` (default: $KPGS_LAB_RELEASE, else pve8) is the Proxmox VE release of a fresh node: pve8 (Debian 12,
kernel 6.8) or pve9 (Debian 13 trixie, kernel 6.17, deb822 apt sources); it is the node's disk's, recorded in
.run/release at seeding, and an existing disk keeps its own (``reset --release R`` starts a fresh one).

See tests/lab/README.md. Everything ``up`` starts is recorded by PID (with its
/proc/PID/stat start time) under tests/lab/.run/pids/ and ended by PID at ``down``.
All mounts live in the node's private mount namespace; the node has its own network
(kpgs-kpro5), PID, UTS and IPC namespaces.

``up --nodes 2`` adds a second node, kpro7 (10.213.5.3, container 131), with its own overlay over the same
cached stock root and its own state, /sys, sshd, PVE API stand-in and container. The two nodes and the
controller side then share one lab-owned L2 segment: a bridge in the lab's own network namespace
(kpgs-lan), so no host-wide setting changes and the root namespace's netfilter never sees the nodes' traffic.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "rootfs", "usr", "lib", "kpro-lab"))

import aptrepo  # noqa: E402
import labstate  # noqa: E402
import rootfs_cache  # noqa: E402

LAB_ID = os.environ.get("KPGS_LAB_ID", "kpgs")
RUN = os.path.join(HERE, ".run")
NODE_NAME = "kpro5"
NODE = os.path.join(RUN, "kpro5")
UPPER = os.path.join(NODE, "upper")
WORK = os.path.join(NODE, "work")
MERGED = os.path.join(NODE, "root")
FUSEDIR = os.path.join(NODE, "fuse")
CTDIR = os.path.join(RUN, "ct")
PIDS = os.path.join(RUN, "pids")
SSHDIR = os.path.join(RUN, "ssh")
NETNS = "%s-kpro5" % LAB_ID
VETH_H, VETH_N = "%s5h" % LAB_ID, "%s5n" % LAB_ID
HOST_IP, NODE_IP = "10.213.5.1", "10.213.5.2"
# The lab's nodes: kpro5 is the one-node lab (the globals above); ``up --nodes 2`` adds kpro7. use_node() points
# the module's per-node globals at one of them. With two nodes the nodes' veths are ports of a bridge in the lab's
# own netns LAN_NS, and the controller side's address sits on LAN_H (its peer LAN_P is a port too).
NODES = {
    "kpro5": {"ip": "10.213.5.2", "vmid": "129", "tag": "5"},
    "kpro7": {"ip": "10.213.5.3", "vmid": "131", "tag": "7"},
}
NODE_ORDER = ("kpro5", "kpro7")
LAN_NS, LAN_BR = "%s-lan" % LAB_ID, "%sbr" % LAB_ID
LAN_H, LAN_P = "%slh" % LAB_ID, "%slp" % LAB_ID
# The controller-side services (tests/lab/services/labsvc.py) on the lab's own host address:
# file server, package index (uv + huggingface_hub from PyPI, the SGLang stand-in), mock hub.
SVC = os.path.join(RUN, "labsvc")
SVC_PORTS = {"files": 18600, "index": 18601, "hub": 18602, "hub_cdn": 18603}
WHEELS = os.path.join(RUN, "wheels")
LOCKS = os.path.join(RUN, "locks")
WHEEL_CACHE = os.path.join(os.environ.get("KPGS_LAB_CACHE", "/var/cache/kpgs-lab"), "wheels")
LAB_SGLANG_VERSIONS = ("0.5.9", "0.5.10.post1", "0.5.11", "0.5.23")  # 0.5.23: the newest in the release table (the upgrade)
RELEASE_FILE = os.path.join(RUN, "release")  # the node disk's Proxmox VE release (seeded with it)
PACKAGES = {"openssh-server": "/usr/sbin/sshd", "debootstrap": "/usr/sbin/debootstrap", "fuse3": "/usr/bin/fusermount3",
            "iproute2": "/usr/sbin/ip", "apt-utils": "/usr/bin/apt-ftparchive"}
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODE_ENV = {"PATH": NODE_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", "USER": "root", "LOGNAME": "root"}
SSHD_TEMPLATE = """# %s (kpro lab): key-only root login from the lab key
Port 22
ListenAddress %s
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
"""
SSHD_CONFIG = SSHD_TEMPLATE % ("kpro5", NODE_IP)


def use_node(name):
    """Point the per-node globals (paths, netns, veths, address, PID records) at node ``name``. kpro5 keeps the
    one-node lab's paths exactly; another node lives under .run/<name>/ (its disk, its container disks, its PIDs)."""
    global NODE_NAME, NODE, UPPER, WORK, MERGED, FUSEDIR, CTDIR, PIDS, NETNS, VETH_H, VETH_N, NODE_IP
    spec = NODES[name]
    NODE_NAME, NODE_IP = name, spec["ip"]
    NODE = os.path.join(RUN, name)
    UPPER, WORK, MERGED, FUSEDIR = (os.path.join(NODE, d) for d in ("upper", "work", "root", "fuse"))
    if name == "kpro5":
        CTDIR, PIDS = os.path.join(RUN, "ct"), os.path.join(RUN, "pids")
    else:
        CTDIR, PIDS = os.path.join(NODE, "ct"), os.path.join(NODE, "pids")
    NETNS = "%s-%s" % (LAB_ID, name)
    VETH_H, VETH_N = "%s%sh" % (LAB_ID, spec["tag"]), "%s%sn" % (LAB_ID, spec["tag"])


def multi_node():
    """True while the two-node network (the lab's bridge netns) exists."""
    return os.path.exists("/run/netns/" + LAN_NS)


def log(msg):
    print("labctl: %s" % msg, file=sys.stderr, flush=True)


def sh(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, **kw)


def quiet(cmd):
    return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode


# --------------------------------------------------------------------------------------
# PIDs (recorded with their start time, so a recycled PID is never signalled)
# --------------------------------------------------------------------------------------

def starttime(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def record(role, pid):
    os.makedirs(PIDS, exist_ok=True)
    with open(os.path.join(PIDS, role + ".pid"), "w") as f:
        f.write("%d %d\n" % (pid, starttime(pid) or 0))


def recorded():
    out = {}
    try:
        names = sorted(os.listdir(PIDS))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".pid"):
            continue
        try:
            pid, st = open(os.path.join(PIDS, name)).read().split()
            out[name[:-4]] = (int(pid), int(st))
        except (OSError, ValueError):
            continue
    return out


def alive_ours(pid, st):
    """True if ``pid`` is running and is the process we started (same start time, not a zombie)."""
    if starttime(pid) != st:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def pid_of(role):
    ent = recorded().get(role)
    if ent and alive_ours(*ent):
        return ent[0]
    return None


def children(pid):
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children(p):
            out.append(c)
            todo.append(c)
    return out


def nspid(pid):
    """The PID as seen inside its innermost PID namespace."""
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except OSError:
        pass
    return None


# --------------------------------------------------------------------------------------
# Controller preparation
# --------------------------------------------------------------------------------------

def ensure_packages():
    missing = [p for p, exe in PACKAGES.items() if not os.path.exists(exe)]
    if not missing:
        return
    log("installing %s" % " ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sh(["apt-get", "update", "-qq"], env=env)
    sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing, env=env)


def ensure_keys(nodes=1):
    os.makedirs(SSHDIR, mode=0o700, exist_ok=True)
    client = os.path.join(SSHDIR, "id_ed25519")
    host = os.path.join(SSHDIR, "ssh_host_ed25519_key")
    for path, comment in ((client, "kpgs-lab-client"), (host, "root@kpro5")):
        if not os.path.exists(path):
            sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    hostpub = open(host + ".pub").read().split()
    with open(os.path.join(SSHDIR, "known_hosts"), "w") as f:
        f.write("%s,kpro5 %s %s\n" % (NODES["kpro5"]["ip"], hostpub[0], hostpub[1]))
        if nodes > 1:  # the nodes share the lab's host key (one lab, one trust anchor)
            for name in NODE_ORDER[1:nodes]:
                f.write("%s,%s %s %s\n" % (NODES[name]["ip"], name, hostpub[0], hostpub[1]))
    cfg = os.path.join(SSHDIR, "config")
    with open(cfg, "w") as f:
        f.write("Host kpro5 %s\n  HostName %s\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n  UserKnownHostsFile %s\n"
                "  StrictHostKeyChecking yes\n  BatchMode yes\n" % (NODE_IP, NODE_IP, client, os.path.join(SSHDIR, "known_hosts")))


def ssh_args():
    return ["ssh", "-i", os.path.join(SSHDIR, "id_ed25519"), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "UserKnownHostsFile=" + os.path.join(SSHDIR, "known_hosts"), "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=3", "root@" + NODE_IP]


def fresh_upper():
    return not os.path.isdir(UPPER) or not os.listdir(UPPER)


def lab_release():
    """The Proxmox VE release the node's disk was seeded as (a disk from before releases existed is pve8)."""
    try:
        with open(RELEASE_FILE) as f:
            return f.read().strip() or "pve8"
    except OSError:
        return "pve8"


def wanted_release(args):
    """The release asked for: ``--release``, else $KPGS_LAB_RELEASE, else None (the disk's own, or pve8 if fresh)."""
    rel = getattr(args, "release", None) or os.environ.get("KPGS_LAB_RELEASE") or None
    if rel is not None and rel not in rootfs_cache.RELEASES:
        raise SystemExit("labctl: unknown release %r (one of %s)" % (rel, ", ".join(rootfs_cache.RELEASES)))
    return rel


def settle_release(args):
    """The release of this up: a fresh disk takes the one asked for (pve8 by default) and records it; an existing
    disk keeps its own, and asking for another is an error (the disk would not match its root)."""
    rel = wanted_release(args)
    if fresh_upper():
        os.makedirs(RUN, exist_ok=True)
        with open(RELEASE_FILE, "w") as f:
            f.write((rel or "pve8") + "\n")
        return rel or "pve8"
    if rel and rel != lab_release():
        raise SystemExit("labctl: the node's disk is %s, not %s: `labctl.py reset --release %s` starts a fresh one"
                         % (lab_release(), rel, rel))
    return lab_release()


def seed_upper():
    import seed
    os.makedirs(UPPER, exist_ok=True)
    shutil.copytree(os.path.join(HERE, "rootfs"), UPPER, symlinks=True, dirs_exist_ok=True)
    if NODE_NAME == "kpro5":
        seed.seed(UPPER, release=lab_release())
    else:
        seed.seed(UPPER, node=NODE_NAME, addr=NODE_IP, vmid=NODES[NODE_NAME]["vmid"], release=lab_release())


def install_access(root):
    """(Re)install the lab's keys and sshd config into the node's disk (every up: keys are per run)."""
    os.makedirs(os.path.join(root, "root/.ssh"), mode=0o700, exist_ok=True)
    shutil.copy(os.path.join(SSHDIR, "id_ed25519.pub"), os.path.join(root, "root/.ssh/authorized_keys"))
    os.chmod(os.path.join(root, "root/.ssh/authorized_keys"), 0o600)
    os.makedirs(os.path.join(root, "etc/ssh"), exist_ok=True)
    for suffix in ("", ".pub"):
        dst = os.path.join(root, "etc/ssh/ssh_host_ed25519_key" + suffix)
        shutil.copy(os.path.join(SSHDIR, "ssh_host_ed25519_key" + suffix), dst)
        os.chmod(dst, 0o600 if not suffix else 0o644)
    with open(os.path.join(root, "etc/ssh/sshd_config"), "w") as f:
        f.write(SSHD_CONFIG if NODE_NAME == "kpro5" else SSHD_TEMPLATE % (NODE_NAME, NODE_IP))


def refresh_fakes(root):
    """Fakes and their library are the lab's code, not node data: refresh them on every up."""
    shutil.copytree(os.path.join(HERE, "rootfs"), root, symlinks=True, dirs_exist_ok=True)


def run_build_scripts():
    d = os.path.join(HERE, "build.d")
    if not os.path.isdir(d):
        return
    env = dict(os.environ, KPGS_NODE_ROOT=UPPER, KPGS_RUN=RUN)
    for name in sorted(os.listdir(d)):
        if name.endswith(".sh"):
            t0 = time.time()
            e = env
            if name == "20-pve-pki.sh" and NODE_NAME != "kpro5":
                e = pki_env_other_node(env)
            sh(["sh", os.path.join(d, name)], env=e)
            log("build.d/%s done (%.1fs)" % (name, time.time() - t0))


def pki_env_other_node(env):
    """Another node's PVE certificate from the lab's one CA, with the lab's one set of API credentials (so the
    controller trusts .run/pki/ca.pem for every node): 20-pve-pki.sh runs with KPGS_RUN=.run/<node>/, seeded
    with the CA and the credentials; it issues that node's pve-ssl for its own name and address."""
    d = os.path.join(NODE, "pki")
    os.makedirs(d, mode=0o700, exist_ok=True)
    for f in ("ca.pem", "ca.key"):
        shutil.copy(os.path.join(RUN, "pki", f), os.path.join(d, f))
    dst = os.path.join(NODE, "pve-credentials.json")
    if not os.path.exists(dst):
        shutil.copy(os.path.join(RUN, "pve-credentials.json"), dst)
    return dict(env, KPGS_RUN=NODE, KPGS_NODE_NAME=NODE_NAME, KPGS_NODE_ADDR=NODE_IP)


def lan_up():
    """The two-node lab's segment: bridge LAN_BR in the lab's netns LAN_NS; the controller side's address on LAN_H
    (root namespace), its peer LAN_P a bridge port. Node-to-node traffic is bridged inside LAN_NS only."""
    if quiet(["ip", "netns", "exec", LAN_NS, "true"]) != 0:
        sh(["ip", "netns", "add", LAN_NS])
    lan = ["ip", "netns", "exec", LAN_NS]
    if quiet(lan + ["ip", "link", "show", LAN_BR]) != 0:
        sh(lan + ["ip", "link", "add", LAN_BR, "type", "bridge"])
    sh(lan + ["ip", "link", "set", LAN_BR, "up"])
    if quiet(["ip", "link", "show", LAN_H]) != 0:
        sh(["ip", "link", "add", LAN_H, "type", "veth", "peer", "name", LAN_P])
        sh(["ip", "link", "set", LAN_P, "netns", LAN_NS])
    sh(lan + ["ip", "link", "set", LAN_P, "master", LAN_BR, "up"])
    quiet(["ip", "addr", "add", HOST_IP + "/24", "dev", LAN_H])
    sh(["ip", "link", "set", LAN_H, "up"])


def lan_down():
    if quiet(["ip", "link", "show", LAN_H]) == 0:
        quiet(["ip", "link", "del", LAN_H])
    if os.path.exists("/run/netns/" + LAN_NS):
        sh(["ip", "netns", "del", LAN_NS])  # its bridge and the node-side ports go with it


def netns_up():
    if quiet(["ip", "netns", "exec", NETNS, "true"]) != 0:
        sh(["ip", "netns", "add", NETNS])
    if multi_node():
        # the node's veth: its root-side end is a port of the lab's bridge (no address), in LAN_NS
        lan = ["ip", "netns", "exec", LAN_NS]
        if quiet(lan + ["ip", "link", "show", VETH_H]) != 0:
            if quiet(["ip", "link", "show", VETH_H]) == 0:
                quiet(["ip", "link", "del", VETH_H])
            sh(["ip", "link", "add", VETH_H, "type", "veth", "peer", "name", VETH_N])
            sh(["ip", "link", "set", VETH_N, "netns", NETNS])
            sh(["ip", "link", "set", VETH_H, "netns", LAN_NS])
        sh(lan + ["ip", "link", "set", VETH_H, "master", LAN_BR, "up"])
    else:
        if quiet(["ip", "link", "show", VETH_H]) != 0:
            sh(["ip", "link", "add", VETH_H, "type", "veth", "peer", "name", VETH_N])
            sh(["ip", "link", "set", VETH_N, "netns", NETNS])
        quiet(["ip", "addr", "add", HOST_IP + "/24", "dev", VETH_H])
        sh(["ip", "link", "set", VETH_H, "up"])
    quiet(["ip", "netns", "exec", NETNS, "ip", "addr", "add", NODE_IP + "/24", "dev", VETH_N])
    sh(["ip", "netns", "exec", NETNS, "ip", "link", "set", VETH_N, "up"])
    sh(["ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up"])
    quiet(["ip", "netns", "exec", NETNS, "ip", "route", "add", "default", "via", HOST_IP])


def netns_down():
    if quiet(["ip", "link", "show", VETH_H]) == 0:
        quiet(["ip", "link", "del", VETH_H])
    if os.path.exists("/run/netns/" + NETNS):
        sh(["ip", "netns", "del", NETNS])


# --------------------------------------------------------------------------------------
# The node's init (PID 1 of its PID namespace, in its private mount namespace)
# --------------------------------------------------------------------------------------

def _mount(*args):
    subprocess.run(["mount"] + list(args), check=True)


def _spawn(argv, logname, chroot=True, env=None):
    logdir = os.path.join(MERGED, "var/log/kpro-lab")
    os.makedirs(logdir, exist_ok=True)
    out = open(os.path.join(logdir, logname), "ab")
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if chroot:
                os.chroot(MERGED)
                os.chdir("/")
            devnull = os.open("/dev/null", os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            os.execve(argv[0], argv, env or NODE_ENV)
        except BaseException as e:  # noqa: BLE001
            os.write(2, ("exec %s failed: %s\n" % (argv, e)).encode())
        os._exit(127)
    out.close()
    return pid


def _wait_for(pred, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError("timed out waiting for %s" % what)


def node_init():
    """Runs as PID 1 of the node's namespaces: mounts, then fakesys, sshd, services; reaps."""
    roles = {}
    _mount("--make-rprivate", "/")
    for d in (UPPER, WORK, MERGED, FUSEDIR):
        os.makedirs(d, exist_ok=True)
    lower = rootfs_cache.rootfs_dir(rootfs_cache.RELEASES[lab_release()])
    _mount("-t", "overlay", "kpgs-" + NODE_NAME, "-o", "lowerdir=%s,upperdir=%s,workdir=%s" % (lower, UPPER, WORK), MERGED)
    _mount("-t", "proc", "proc", os.path.join(MERGED, "proc"))
    fs_pid = _spawn([sys.executable, "-W", "ignore", os.path.join(HERE, "fakesys.py"), MERGED, FUSEDIR], "fakesys.log",
                    chroot=False, env=dict(os.environ))
    roles["fakesys"] = fs_pid
    _wait_for(lambda: os.path.isdir(os.path.join(FUSEDIR, "sys", "bus")), 20, "the FUSE /sys")
    _mount("--bind", os.path.join(FUSEDIR, "sys"), os.path.join(MERGED, "sys"))
    for rel in ("devices", "modules", "cmdline", "sys/kernel/osrelease", "driver"):
        if os.path.exists(os.path.join(MERGED, "proc", rel)):
            _mount("--bind", os.path.join(FUSEDIR, "proc", rel), os.path.join(MERGED, "proc", rel))
    dev = os.path.join(MERGED, "dev")
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid", "kpgs-dev", dev)
    for name, major, minor, mode in (("null", 1, 3, 0o666), ("zero", 1, 5, 0o666), ("full", 1, 7, 0o666),
                                     ("random", 1, 8, 0o666), ("urandom", 1, 9, 0o666), ("tty", 5, 0, 0o666)):
        os.mknod(os.path.join(dev, name), 0o020000 | mode, os.makedev(major, minor))
        os.chmod(os.path.join(dev, name), mode)
    for d in ("pts", "shm", "vfio"):
        os.makedirs(os.path.join(dev, d), exist_ok=True)
    _mount("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620,gid=5", "devpts", os.path.join(dev, "pts"))
    os.symlink("pts/ptmx", os.path.join(dev, "ptmx"))
    _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "shm", os.path.join(dev, "shm"))
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    _mount("-t", "tmpfs", "-o", "mode=755,nosuid,nodev", "kpgs-run", os.path.join(MERGED, "run"))
    for d in ("sshd", "lock", "qemu-server", "lxc"):
        os.makedirs(os.path.join(MERGED, "run", d), exist_ok=True)
    os.chmod(os.path.join(MERGED, "run/sshd"), 0o755)
    # Container 129's disk and its base image: the container runtime (ct/runtime.py)
    # mounts its overlay from these. The disk lives under .run, on a real filesystem
    # (an overlay upper cannot sit on the node's own overlay).
    ct_base, ct_disks = os.path.join(MERGED, "var/lib/kpro-lab/ct-base"), os.path.join(MERGED, "var/lib/kpro-lab/ct")
    for d in (ct_base, ct_disks, CTDIR):
        os.makedirs(d, exist_ok=True)
    _mount("--bind", "-o", "ro", rootfs_cache.rootfs_dir("ct"), ct_base)
    _mount("--bind", CTDIR, ct_disks)
    socket.sethostname(NODE_NAME)
    roles["anchor"] = _spawn(["/bin/sleep", "infinity"], "anchor.log")
    roles["sshd"] = _spawn(["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config"], "sshd.log")
    sd = os.path.join(MERGED, "usr/lib/kpro-lab/services.d")
    if os.path.isdir(sd):
        for name in sorted(os.listdir(sd)):
            path = os.path.join(sd, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                roles["svc-" + name] = _spawn(["/usr/lib/kpro-lab/services.d/" + name], "svc-%s.log" % name)
    with open(os.path.join(PIDS, "ns-map.json.tmp"), "w") as f:
        json.dump(roles, f)
    os.rename(os.path.join(PIDS, "ns-map.json.tmp"), os.path.join(PIDS, "ns-map.json"))
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    while True:  # reap
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1)


# --------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------

def ssh_ok(timeout=5):
    try:
        return subprocess.run(ssh_args() + ["true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def healthy():
    ents = recorded()
    need = ("supervisor", "init", "fakesys", "sshd", "anchor")
    if not all(r in ents and alive_ours(*ents[r]) for r in need):
        return False
    return ssh_ok()


def node_root():
    pid = pid_of("anchor")
    if pid is None:
        raise SystemExit("labctl: the lab is not up")
    return "/proc/%d/root" % pid


def summary():
    ents = recorded()
    return "%s up: ssh root@%s (key %s), netns %s, root %s, pids %s" % (
        NODE_NAME, NODE_IP, os.path.relpath(os.path.join(SSHDIR, "id_ed25519")), NETNS, node_root(),
        " ".join("%s=%d" % (k, v[0]) for k, v in sorted(ents.items())))


def start_guests():
    """Start the containers the state says were running (PVE's onboot at boot), through pct."""
    for vmid, guest in sorted((labstate.load(node_root()).get("guests") or {}).items()):
        if guest.get("type") == "qemu" and guest.get("status") == "running":
            # A stand-in for the VM's kvm process, found the way PVE finds it: the pidfile
            # names a live process started with -pidfile <that file>. It lives in the
            # node's PID namespace and ends with the node.
            pidfile = "/run/qemu-server/%s.pid" % vmid
            code = "import os,sys,time; open(sys.argv[4], 'w').write('%d\\n' % os.getpid()); time.sleep(10**9)"
            subprocess.Popen(exec_argv(["/usr/bin/python3", "-c", code, "-id", str(vmid), "-pidfile", pidfile]),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
            log("VM %s: kvm stand-in started (%s)" % (vmid, pidfile))
        if guest.get("type") == "lxc" and guest.get("status") == "running":
            r = subprocess.run(exec_argv(["pct", "start", str(vmid)]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            log("CT %s: pct start rc=%d%s" % (vmid, r.returncode, (": " + r.stderr.strip()) if r.returncode else ""))


def published_kernels(k):
    """The kernel releases in the lab's pve repository: ``kernel.published`` (labctl publish-kernel), and the
    installed ones (a host's own kernels came from that repository)."""
    rels = list(k.get("installed") or [])
    for r in k.get("published") or []:
        if r not in rels:
            rels.append(r)
    return rels


def apt_mirror(debian=True):
    """The lab's package mirror (aptrepo.py): Debian's packages from the pools, Proxmox's header stand-ins for
    every release the node's kernel has headers available for, its kernel stand-ins for every published release."""
    t0 = time.time()
    if debian:
        aptrepo.build_debian(RUN, (rootfs_cache.RELEASES[lab_release()], "ct"))
    k = labstate.load(UPPER).get("kernel") or {}
    releases = k.get("headers_available") or []
    aptrepo.build_pve(RUN, releases, published_kernels(k))
    node_repo = rootfs_cache.REPO_OF_SUITE[rootfs_cache.SUITES[rootfs_cache.RELEASES[lab_release()]]]
    log("apt mirror: %d Debian packages for the node (%s), headers for %s, kernels %s (%.1fs)" % (
        len(os.listdir(os.path.join(RUN, "build", "apt", node_repo))) - 2, node_repo, ", ".join(releases),
        ", ".join(published_kernels(k)), time.time() - t0))


def register_stock_kernels():
    """A PVE 8 host has its kernels installed as packages (proxmox-default-kernel -> proxmox-kernel-6.8 -> the
    image packages): register the node's installed kernels with dpkg once, their hooks skipped (KPGS_LAB_SEED:
    what they did at the host's install is in the seed), so that apt full-upgrade finds the meta packages."""
    if subprocess.run(exec_argv(["dpkg-query", "-W", "proxmox-default-kernel"]), stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode == 0:
        return
    k = labstate.load(node_root()).get("kernel") or {}
    pkgs = ["proxmox-default-kernel"] + ["proxmox-kernel-%s" % r for r in k.get("installed") or []]
    r = subprocess.run(exec_argv(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + pkgs),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       env=dict(NODE_ENV, DEBIAN_FRONTEND="noninteractive", KPGS_LAB_SEED="1"))
    if r.returncode != 0:
        raise RuntimeError("registering the stock kernels with dpkg failed: %s" % r.stdout.strip()[-2000:])


def apt_update():
    """apt's lists on the node, as a host that has run apt-get update once after its install has them."""
    r = subprocess.run(exec_argv(["apt-get", "update", "-qq"]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, env=dict(NODE_ENV))
    if r.returncode != 0:
        raise RuntimeError("apt-get update on the node failed: %s" % r.stdout.strip())


def lab_locks():
    """The stand-in wheels and, from them and the cached PyPI wheels, the hashed locks the lab
    inventory points sglang_install at (made as roles/sglang_install/files/locks/regenerate.sh
    makes the real ones, against the lab's wheels instead of PyPI)."""
    sh([sys.executable, os.path.join(HERE, "sglang_standin", "build_wheel.py"), "--out", WHEELS], stdout=subprocess.DEVNULL)
    sh([sys.executable, os.path.join(HERE, "torch_standin", "build_wheel.py"), "--out", WHEELS], stdout=subprocess.DEVNULL)
    sh([sys.executable, os.path.join(HERE, "services", "fetch_wheels.py"), WHEEL_CACHE], stdout=subprocess.DEVNULL)
    hub = next(line.split()[0] for line in open(os.path.join(HERE, "..", "..", "requirements", "dev.lock"))
               if line.startswith("huggingface-hub=="))
    # ninja as the real SGLang brings it (its Requires-Dist), at the collection's real lock's pin (fetch_wheels.py)
    ninja = next(line.split()[0] for line in open(os.path.join(HERE, "..", "..", "roles", "sglang_install", "files", "locks",
                                                               "sglang-0.5.11-py3.11-x86_64.txt")) if line.startswith("ninja=="))
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    os.makedirs(LOCKS, exist_ok=True)
    for version in LAB_SGLANG_VERSIONS:
        out = os.path.join(LOCKS, "sglang-%s-py3.11-x86_64.txt" % version)  # made anew: the stand-in may have changed
        if os.path.exists(out):
            os.unlink(out)  # uv keeps the pins (and hashes) of an existing output file
        # huggingface_hub as the real SGLang brings it (the collection's hf_model runs on the venv), the torch stand-in (the
        # two-GPU check), the nvcc stand-in and ninja (the runtime toolchain); --no-cache: uv would otherwise reuse the
        # hash of an earlier stand-in wheel of the same name
        sh([uv, "pip", "compile", "-", "-q", "--no-cache", "--no-index", "--find-links", WHEELS, "--find-links", WHEEL_CACHE,
            "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36", "--generate-hashes",
            "--no-header", "-o", out], universal_newlines=True,
           input="sglang==%s\ntorch==2.11.0\nnvidia-cuda-nvcc==13.0.88\n%s\n%s\n" % (version, hub, ninja),
           env=dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_OFFLINE="1"))


def secret_file(name, prefix):
    """A secret made once per lab run (mode 0600), like a vault value: tests grep outputs for it."""
    path = os.path.join(RUN, name)
    if not os.path.exists(path):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write("%s%s\n" % (prefix, os.urandom(16).hex()))
    return path


def services_up():
    """labsvc on HOST_IP (reachable from the node and its containers), with a hub token made per run."""
    os.makedirs(SVC, exist_ok=True)
    for stale in ("labsvc.json", "labsvc.pid"):
        if os.path.exists(os.path.join(SVC, stale)):
            os.unlink(os.path.join(SVC, stale))
    token_file = secret_file("hub-token", "hf_lab")
    secret_file("sglang-api-key", "sk-lab-")  # the server's API key in the lab inventory
    logf = open(os.path.join(SVC, "labsvc.log"), "ab")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "services", "labsvc.py"), "--addr", HOST_IP, "--state-dir", SVC,
                             "--files-port", str(SVC_PORTS["files"]), "--files-dir", os.path.join(RUN, "build"),
                             "--index-port", str(SVC_PORTS["index"]), "--index-dir", WHEEL_CACHE, "--index-dir", WHEELS,
                             "--hub-port", str(SVC_PORTS["hub"]), "--hub-cdn-port", str(SVC_PORTS["hub_cdn"]),
                             "--hub-token-file", token_file],
                            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, cwd="/")
    record("labsvc", proc.pid)
    _wait_for(lambda: os.path.exists(os.path.join(SVC, "labsvc.json")) or proc.poll() is not None, 60, "the lab services")
    if proc.poll() is not None:
        raise RuntimeError("labsvc exited (rc %s); see %s" % (proc.returncode, os.path.join(SVC, "labsvc.log")))


def extra_nodes_recorded():
    """The nodes other than kpro5 that have anything of theirs recorded or a netns left (``down`` ends them)."""
    out = []
    cur = NODE_NAME
    for name in NODE_ORDER[1:]:
        use_node(name)
        if recorded() or os.path.exists("/run/netns/" + NETNS):
            out.append(name)
    use_node(cur)
    return out


def healthy_nodes(nodes):
    cur, ok = NODE_NAME, True
    for name in NODE_ORDER[:nodes]:
        use_node(name)
        ok = ok and bool(recorded()) and healthy()
    use_node(cur)
    return ok


def cmd_up(args):
    if os.geteuid() != 0:
        raise SystemExit("labctl: must run as root")
    if getattr(args, "nouveau", False):
        os.environ["KPGS_LAB_NOUVEAU"] = "1"
    nodes = getattr(args, "nodes", None) or 1
    if nodes not in (1, 2):
        raise SystemExit("labctl: --nodes is 1 or 2")
    use_node("kpro5")
    layout_ok = multi_node() == (nodes > 1) and (nodes > 1 or not extra_nodes_recorded())
    if wanted_release(args) and wanted_release(args) != lab_release() and not fresh_upper():
        settle_release(args)  # says so and exits: another release needs a fresh disk (reset)
    if layout_ok and healthy_nodes(nodes):
        print(summary_all(nodes))
        return 0
    if recorded() or os.path.exists("/run/netns/" + NETNS) or multi_node() or extra_nodes_recorded():
        log("the lab is partly up or has another number of nodes: stopping it first (disk kept)")
        cmd_down(argparse.Namespace(keep_disk=True))
    t0 = time.time()
    ensure_packages()
    release = settle_release(args)
    for variant in (rootfs_cache.RELEASES[release], "ct"):
        rootfs_cache.ensure_rootfs(variant, log)
    os.makedirs(PIDS, exist_ok=True)
    ensure_keys(nodes)
    if fresh_upper():
        log("fresh node: seeding %s" % os.path.relpath(UPPER))
        seed_upper()
    else:
        refresh_fakes(UPPER)
    install_access(UPPER)
    run_build_scripts()
    apt_mirror()
    lab_locks()
    if nodes > 1:
        lan_up()
    netns_up()
    try:
        boot_node(first=True)
        for name in NODE_ORDER[1:nodes]:
            use_node(name)
            t1 = time.time()
            os.makedirs(PIDS, exist_ok=True)
            if fresh_upper():
                log("fresh node %s: seeding %s" % (name, os.path.relpath(UPPER)))
                seed_upper()
            else:
                refresh_fakes(UPPER)
            install_access(UPPER)
            run_build_scripts()
            netns_up()
            boot_node(first=False)
            log("%s up (%.1fs)" % (name, time.time() - t1))
        use_node("kpro5")
    except Exception as e:
        use_node("kpro5")
        log("up failed: %s" % e)
        cmd_down(argparse.Namespace(keep_disk=True))
        return 1
    print(summary_all(nodes) + " (%.1fs)" % (time.time() - t0))
    return 0


def summary_all(nodes):
    cur, out = NODE_NAME, []
    for name in NODE_ORDER[:nodes]:
        use_node(name)
        out.append(summary())
    use_node(cur)
    return "\n".join(out)


def boot_node(first):
    """Start the current node's init (its namespaces, overlay, /sys, sshd, services) and boot it; the first node
    also starts the controller-side lab services."""
    for stale in ("ns-map.json",):
        if os.path.exists(os.path.join(PIDS, stale)):
            os.unlink(os.path.join(PIDS, stale))
    os.makedirs(NODE, exist_ok=True)
    logf = open(os.path.join(NODE, "init.log"), "ab")
    node_arg = [] if NODE_NAME == "kpro5" else ["--node", NODE_NAME]
    proc = subprocess.Popen(["ip", "netns", "exec", NETNS, "unshare", "--mount", "--pid", "--uts", "--ipc", "--fork",
                             "--propagation", "private", sys.executable, os.path.abspath(__file__)] + node_arg + ["_init"],
                            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, cwd="/")
    record("supervisor", proc.pid)
    _wait_for(lambda: os.path.exists(os.path.join(PIDS, "ns-map.json")) or proc.poll() is not None, 60, "the node's init")
    if proc.poll() is not None:
        raise RuntimeError("the node's init exited (rc %s); see %s" % (proc.returncode, os.path.join(NODE, "init.log")))
    kids = children(proc.pid)
    if not kids:
        raise RuntimeError("no init process under the supervisor")
    init = kids[0]
    record("init", init)
    roles = json.load(open(os.path.join(PIDS, "ns-map.json")))
    byns = {nspid(p): p for p in descendants(init)}
    for role, npid in roles.items():
        if npid in byns:
            record(role, byns[npid])
    _wait_for(ssh_ok, 30, "ssh on %s" % NODE_IP)
    if first:
        services_up()
    apt_update()
    register_stock_kernels()
    # a power-on of the kept disk: /dev is a fresh tmpfs; the enabled units (the device-node unit) run
    boot_userspace("units")
    start_guests()


def _kill_wait(pids, sig, timeout):
    for pid, st in pids:
        if alive_ours(pid, st):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    end = time.time() + timeout
    while time.time() < end:
        if not any(alive_ours(p, s) for p, s in pids):
            return True
        time.sleep(0.05)
    return not any(alive_ours(p, s) for p, s in pids)


def cmd_down(args):
    """Everything the lab started, ended by PID, and every kpgs-* thing it made removed: the extra nodes first,
    then kpro5, the lab services and the two-node segment."""
    cur = NODE_NAME
    for name in reversed(extra_nodes_recorded()):
        use_node(name)
        down_node(args)
    use_node("kpro5")
    try:
        return down_node(args)
    finally:
        use_node(cur)


def down_node(args):
    ents = recorded()
    init = ents.get("init")
    sup = ents.get("supervisor")
    if init:
        # PID 1 of the node's PID namespace: killing it ends every process in the namespace.
        _kill_wait([init], signal.SIGKILL, 10)
    if sup and alive_ours(*sup):
        kids = children(sup[0])
        for k in kids:  # the init, if it was not recorded yet (up interrupted)
            st = starttime(k)
            if st is not None:
                _kill_wait([(k, st)], signal.SIGKILL, 10)
        if not _kill_wait([sup], signal.SIGTERM, 5):
            _kill_wait([sup], signal.SIGKILL, 5)
    left = [r for r, e in ents.items() if alive_ours(*e)]
    if not _kill_wait(list(ents.values()), signal.SIGKILL, 10):
        raise SystemExit("labctl: processes still alive: %s" % left)
    netns_down()
    if NODE_NAME != "kpro5":
        for p in ((PIDS, WORK, MERGED, FUSEDIR) if getattr(args, "keep_disk", False) else (NODE,)):
            shutil.rmtree(p, ignore_errors=True)
        if ents:
            print("%s down" % NODE_NAME)
        return 0
    lan_down()
    if getattr(args, "keep_disk", False):
        for p in (PIDS, SSHDIR, WORK, MERGED, FUSEDIR):
            shutil.rmtree(p, ignore_errors=True)
    else:
        shutil.rmtree(RUN, ignore_errors=True)
    if ents:
        print("kpro5 down")
    return 0


def cmd_status(args):
    if recorded() and healthy():
        print(summary())
        return 0
    print("%s down" % NODE_NAME if not recorded() else "%s unhealthy: %s" % (
        NODE_NAME, {k: alive_ours(*v) for k, v in recorded().items()}))
    return 3


def cmd_root(args):
    print(node_root())
    return 0


def cmd_release(args):
    print(lab_release())
    return 0


def exec_argv(argv):
    pid = pid_of("anchor")
    if pid is None:
        raise SystemExit("labctl: the lab is not up")
    return ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"] + argv


def cmd_exec(args):
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        argv = ["/bin/bash"]
    return subprocess.run(exec_argv(argv), env=NODE_ENV).returncode


def boot_userspace(what):
    """Run the node's boot.py (``shutdown`` | ``units`` | ``boot``) inside the node; its output is logged."""
    r = subprocess.run(exec_argv(["/usr/bin/python3", "/usr/lib/kpro-lab/boot.py", what]), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, env=dict(NODE_ENV))
    if r.returncode != 0:
        raise RuntimeError("boot.py %s failed: %s" % (what, r.stdout.strip()[-2000:]))
    log("boot.py %s: %s" % (what, r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "done"))


def _reboot(release=None):
    """A reboot: shutdown (guests and services stopped by PID), the kernel half of the boot into ``release`` or the
    boot loader's choice (labstate.next_boot_release: next-boot pin, pin, newest installed), then systemd's
    units and PVE's start of the onboot guests (boot.py)."""
    root = node_root()
    boot_userspace("shutdown")
    with labstate.modify(root) as st:
        if release:
            labstate.install_kernel(st, release, root)
        rel = release or labstate.next_boot_release(st, root)
        k = st.setdefault("kernel", {})
        if k.get("mok_pending"):  # MokManager at the console: the operator confirmed the pending enrolment
            k.setdefault("mok_enrolled", [])
            k["mok_enrolled"] += [c for c in k.pop("mok_pending") if c not in k["mok_enrolled"]]
        labstate.boot(st, root, rel)
        rel = st["kernel"]["release"]
    nbp = os.path.join(root, labstate.NEXT_BOOT_PIN)
    if os.path.exists(nbp):  # proxmox-boot-cleanup.service: a next-boot pin holds for one boot
        os.unlink(nbp)
    devdir = os.path.join(root, "dev")
    for name in os.listdir(devdir):  # a fresh devtmpfs: nodes made by nvidia-modprobe are gone
        if name.startswith("nvidia"):
            p = os.path.join(devdir, name)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    with open(os.path.join(root, "var/lib/kpro-lab/calls.log"), "a") as f:
        f.write("%s labctl %s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), "kernel-upgrade" if release else "reboot", rel))
    boot_userspace("boot")
    return rel


def cmd_reboot(args):
    print("kpro5 rebooted into %s" % _reboot())
    return 0


def cmd_publish_kernel(args):
    """A new kernel release in the lab's Proxmox repository (with its headers unless --no-headers); the node's
    apt lists learn it at its next ``apt-get update``, as a host's do."""
    root = node_root()
    with labstate.modify(root) as st:
        k = st.setdefault("kernel", {})
        pub = k.setdefault("published", [])
        if args.release not in pub:
            pub.append(args.release)
        ha = k.setdefault("headers_available", [])
        if not args.no_headers and args.release not in ha:
            ha.append(args.release)
    apt_mirror(debian=False)
    print("published proxmox-kernel-%s%s" % (args.release, "" if args.no_headers else " and proxmox-headers-%s" % args.release))
    return 0


def cmd_unpublish_kernel(args):
    """The release and its headers taken out of the lab's Proxmox repository again (the meta packages point at the
    newest release left); the node's apt lists follow at its next ``apt-get update``."""
    root = node_root()
    with labstate.modify(root) as st:
        k = st.setdefault("kernel", {})
        if args.release in (k.get("installed") or []):
            raise SystemExit("labctl: %s is installed on the node: remove proxmox-kernel-%s first" % (args.release, args.release))
        k["published"] = [r for r in k.get("published") or [] if r != args.release]
        k["headers_available"] = [r for r in k.get("headers_available") or [] if r != args.release]
    apt_mirror(debian=False)
    print("unpublished proxmox-kernel-%s" % args.release)
    return 0


def cmd_secure_boot(args):
    """The firmware's Secure Boot switch (the EFI SecureBoot variable, efivars): the kernel enforces module
    signatures from now on (set it, then reboot, as an operator would). Turning it on starts the MOK list
    (kernel.mok_enrolled) if the lab had none: only enrolled keys are trusted then."""
    with labstate.modify(node_root()) as st:
        k = st.setdefault("kernel", {})
        k["secure_boot"] = args.state == "on"
        if args.state == "on" and k.get("mok_enrolled") is None:
            k["mok_enrolled"] = []
    print("Secure Boot %s" % ("enabled" if args.state == "on" else "disabled"))
    return 0


def cmd_mok_enroll(args):
    """Enrol a certificate (a node path, DER or PEM) in the MOK list, as ``mokutil --import`` and MokManager's
    confirmation at the next boot would."""
    import nvlab
    root = node_root()
    os.environ["KPRO_LAB_ROOT"] = root
    info = nvlab.cert_info(args.cert)
    if not info:
        raise SystemExit("labctl: %s is not a certificate (DER or PEM)" % args.cert)
    with labstate.modify(root) as st:
        k = st.setdefault("kernel", {})
        enrolled = k.get("mok_enrolled") or []
        entry = {"signer": info["signer"], "sig_key": info["sig_key"], "cert": args.cert}
        if not any(e.get("sig_key") == entry["sig_key"] for e in enrolled):
            enrolled.append(entry)
        k["mok_enrolled"] = enrolled
    print("enrolled %s (signer %s, sig_key %s)" % (args.cert, info["signer"], info["sig_key"]))
    return 0


def cmd_mok_list(args):
    print(json.dumps((labstate.load(node_root()).get("kernel") or {}).get("mok_enrolled"), indent=1))
    return 0


def cmd_kernel_upgrade(args):
    st = labstate.load(node_root())
    rel = args.release or labstate.next_release(st["kernel"]["release"])
    rel = _reboot(rel)
    # The new kernel's headers are in the Proxmox repository when it is released, and the upgrade went
    # through apt, so the host's lists know them.
    apt_mirror()
    apt_update()
    print("kpro5 upgraded and rebooted into %s" % rel)
    return 0


def cmd_uvm_reload(args):
    """nvidia-uvm unloaded and loaded again under another dynamic major (as after a new kernel
    or driver): /proc/devices follows the state; the host's /dev nodes are made anew."""
    root = node_root()
    with labstate.modify(root) as st:
        majors = st.setdefault("majors", {})
        if "nvidia-uvm" not in majors:
            raise SystemExit("labctl: nvidia-uvm is not loaded (install the driver first)")
        taken = set(majors.values())
        new = args.major or next(m for m in range(majors["nvidia-uvm"] - 1, 234, -1) if m not in taken)
        majors["nvidia-uvm"] = new
    for name, minor in (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)):
        path = os.path.join(root, "dev", name)
        if os.path.lexists(path):
            os.unlink(path)
        os.mknod(path, 0o020666, os.makedev(new, minor))
        os.chmod(path, 0o666)
    print("nvidia-uvm reloaded with major %d" % new)
    return 0


def cmd_rebuild(args):
    """The host rebuilt as after a reinstall of Proxmox VE: the node's disk is a fresh one as found
    (GPUs on vfio-pci, no NVIDIA driver, CT 129's config without passthrough, VMs as before) but
    booted into a newer kernel; CT 129's own disk (venv, model, unit) is kept as a restore from
    backup would bring it back, or lost with --lose-ct-disk."""
    if not recorded():
        raise SystemExit("labctl: the lab is not up")
    release = labstate.next_release(labstate.load(node_root())["kernel"]["release"])
    cmd_down(argparse.Namespace(keep_disk=True))
    shutil.rmtree(UPPER, ignore_errors=True)
    shutil.rmtree(WORK, ignore_errors=True)
    if args.lose_ct_disk:
        shutil.rmtree(CTDIR, ignore_errors=True)
    seed_upper()
    with labstate.modify(UPPER) as st:
        labstate.install_kernel(st, release, UPPER)
        labstate.boot(st, UPPER, release)
        for vmid in ("105", "129"):  # running when the host went down for the rebuild
            st["guests"][vmid]["status"] = "running"
    log("rebuilt: fresh node disk, kernel %s, CT 129 disk %s" % (release, "lost" if args.lose_ct_disk else "kept"))
    return cmd_up(args)


def cmd_reset(args):
    cmd_down(argparse.Namespace(keep_disk=False))
    return cmd_up(args)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="labctl.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", choices=NODE_ORDER, default="kpro5",
                    help="the node that status, root, exec and the node commands act on (kpro7: the second node of up --nodes 2)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "reset"):
        p = sub.add_parser(name)
        p.add_argument("--nouveau", action="store_true",
                       help="a fresh node whose modprobe.d does not blacklist nouveau (seed.py, KPGS_LAB_NOUVEAU)")
        p.add_argument("--nodes", type=int, default=1, choices=(1, 2),
                       help="2: a second node kpro7 (10.213.5.3, CT 131) next to kpro5, on the lab's own bridge")
        p.add_argument("--release", choices=sorted(rootfs_cache.RELEASES),
                       help="the Proxmox VE release of a fresh node (default: $KPGS_LAB_RELEASE, else pve8)")
    p = sub.add_parser("down")
    p.add_argument("--keep-disk", action="store_true", help="keep .run/kpro5/upper (the node's disk)")
    sub.add_parser("status")
    p = sub.add_parser("rebuild")
    p.add_argument("--lose-ct-disk", action="store_true", help="CT 129's disk is not restored (venv and model lost)")
    sub.add_parser("root")
    sub.add_parser("release")
    p = sub.add_parser("exec")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("reboot")
    p = sub.add_parser("kernel-upgrade")
    p.add_argument("release", nargs="?")
    p = sub.add_parser("publish-kernel")
    p.add_argument("release")
    p.add_argument("--no-headers", action="store_true", help="the release's proxmox-headers package is not in the repository")
    p = sub.add_parser("unpublish-kernel")
    p.add_argument("release")
    p = sub.add_parser("secure-boot")
    p.add_argument("state", choices=("on", "off"))
    p = sub.add_parser("mok-enroll")
    p.add_argument("cert", help="path of the certificate on the node (DER or PEM)")
    sub.add_parser("mok-list")
    p = sub.add_parser("uvm-reload")
    p.add_argument("major", nargs="?", type=int)
    sub.add_parser("_init")
    args = ap.parse_args(argv)
    if args.node != "kpro5":
        if args.cmd in ("up", "reset", "down", "rebuild"):
            raise SystemExit("labctl: %s acts on the whole lab (no --node)" % args.cmd)
        use_node(args.node)
    if args.cmd == "_init":
        node_init()
        return 0
    return {"up": cmd_up, "down": cmd_down, "status": cmd_status, "reset": cmd_reset, "root": cmd_root, "exec": cmd_exec,
            "release": cmd_release,
            "reboot": cmd_reboot, "kernel-upgrade": cmd_kernel_upgrade, "rebuild": cmd_rebuild,
            "uvm-reload": cmd_uvm_reload, "publish-kernel": cmd_publish_kernel, "unpublish-kernel": cmd_unpublish_kernel, "secure-boot": cmd_secure_boot,
            "mok-enroll": cmd_mok_enroll, "mok-list": cmd_mok_list}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
