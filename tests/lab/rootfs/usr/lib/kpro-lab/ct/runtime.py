"""Container runtime of the lab node: what ``lxc-start``/``lxc-stop``/``lxc-attach`` do on PVE.

Runs inside the node as root (Debian python3 3.11, standard library only). Hook for pct and the
PVE API::

    sys.path.insert(0, "/usr/lib/kpro-lab")
    from ct import runtime
    runtime.start(vmid)                    # raises runtime.CTError(text) -> the task error
    runtime.stop(vmid, timeout=...)        # "clean" | "killed" | "not running"
    runtime.status(vmid)                   # "running" | "stopped"
    runtime.exec_argv(vmid, argv)          # argv to os.execvp for ``pct exec`` / ``pct enter``
    runtime.exec_in(vmid, argv, stdin=b"") # CompletedProcess (captured output)
    runtime.push(vmid, src, dst, perms=None, user=None, group=None) / runtime.pull(vmid, src, dst)

A container (all paths relative to the node root ``root``, "/" on the node):

- rootfs: an overlay mounted *inside* the container's mount namespace (so it goes away with
  the container): lower ``/var/lib/kpro-lab/ct-base`` (the cached debootstrap rootfs, read-only),
  upper/work ``/var/lib/kpro-lab/ct/<vmid>/{upper,work}`` (the CT "disk", must be a real
  filesystem, not overlayfs/FUSE), merged at ``/var/lib/kpro-lab/ct/<vmid>/root``. PVE's own
  path would be ``/rpool/data/subvol-<vmid>-disk-0``. On every start the seed tree
  (``/usr/lib/kpro-lab/ct-seed``: the lab's init, systemctl, journalctl) is copied in; it holds
  only lab plumbing, no configuration, so a re-copy is like a package upgrade.
- namespaces: new mount, pid, uts (hostname from the config), ipc. **Network: the node's netns
  is shared** (a simplification: real LXC gives the CT a veth on vmbr0 with its own address) so
  the container reaches the lab services on 10.213.5.1; ``start(..., netns=PATH)`` joins a named
  netns instead (e.g. /run/netns/kpgs-ct129) when the lab core provides one.
- /proc: the container's own procfs; the node's ``/proc/driver`` (``/proc/driver/nvidia``),
  ``/proc/devices``, ``/proc/modules``, ``/proc/cmdline`` and ``/proc/sys/kernel/osrelease`` are
  bound over it read-only (a real CT sees the host kernel's). No lxcfs (meminfo/cpuinfo are the
  kernel's).
- /sys: a read-only tmpfs holding read-only binds of the node's /sys entries (the FUSE sysfs)
  and, at ``/sys/fs/cgroup``, the init's cgroup view (``system.slice/<unit>/cgroup.procs``).
- /dev: tmpfs with null, zero, full, random, urandom, tty, devpts (ptmx), shm, mqueue and the
  fd links; GPU nodes only as the config passes them: ``devN:`` -> mknod with the node's
  major:minor, ``mode`` (default 0660), ``uid``/``gid`` (default 0); a devN whose path does not
  exist on the node fails the start with PVE's "Device /dev/x does not exist".
  ``mpN`` bind mount points (a node directory) are mounted at their mp, before the mount entries (volumes are
  not simulated); ``lxc.mount.entry`` lines are mounted (bind/rbind, ro, create=file|dir, optional: a missing
  source is skipped silently, as LXC does). ``lxc.cgroup2.devices.allow`` is recorded in
  ``ct/<vmid>/runtime.json`` but not enforced (no device cgroup in the lab). Containers run
  privileged: ``unprivileged: 1`` has no idmap here (uids inside are what the config says).
- lab plumbing: the node's ``/var/lib/kpro-lab`` (the "GPU": state.json, nvml.conf) is bound
  at the same path so the fake libnvidia-ml in the CT reads the same hardware
  (``ct``/``ct-base`` below it are masked).
- PID 1: ``/usr/lib/kpro-lab/ctinit.py`` (the systemd stand-in) run by the container's
  ``/usr/bin/python3``, environment ``container=lxc`` and PATH only. Its node-visible PID goes
  to labstate ``guests[vmid] = {"type": "lxc", "status": "running", "pid": PID}``; its console
  output to ``ct/<vmid>/console.log``.
"""

import ctypes
import errno
import fcntl
import json
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(_HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(_HERE))

import labstate  # noqa: E402  (next to the ct package)
from ct import conf  # noqa: E402

BASE_REL = "var/lib/kpro-lab/ct-base"
CT_REL = "var/lib/kpro-lab/ct"
SEED_REL = "usr/lib/kpro-lab/ct-seed"
INIT_PATH = "/usr/lib/kpro-lab/ctinit.py"
SOCK_PATH = "/run/kpro-lab-systemd.sock"
LXC_ROOTFS = "/usr/lib/x86_64-linux-gnu/lxc/rootfs"  # what LXC's messages call the rootfs mount
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROC_BINDS = ("driver", "devices", "modules", "cmdline", "sys/kernel/osrelease")

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 32, 4096, 8192, 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
OVERLAY_MAGIC, FUSE_MAGIC = 0x794C7630, 0x65735546
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}

_libc = ctypes.CDLL(None, use_errno=True)


class CTError(Exception):
    """A start/stop failure; ``str()`` is the text PVE would put in the task log (last line
    is the TASK ERROR)."""


# --- small syscall wrappers -----------------------------------------------------------

def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _b(s):
    return None if s is None else os.fsencode(s)


def mount(src, target, fstype=None, flags=0, data=None):
    _check(_libc.mount(_b(src), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
           "mount %s on %s" % (src, target))


def bind(src, target, ro=False, rec=False):
    mount(src, target, None, MS_BIND | (MS_REC if rec else 0))
    if ro:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _setns(path, nstype):
    fd = os.open(path, os.O_RDONLY)
    try:
        _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns %s" % path)
    finally:
        os.close(fd)


def _pivot_root(new, old):
    nr = _SYS_PIVOT_ROOT.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, "pivot_root: unknown syscall number")
    _check(_libc.syscall(ctypes.c_long(nr), _b(new), _b(old)), "pivot_root")


def fs_magic(path):
    buf = ctypes.create_string_buffer(256)
    _check(_libc.statfs(_b(path), buf), "statfs %s" % path)
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


# --- paths and bookkeeping --------------------------------------------------------------

def _p(root, rel):
    return os.path.join(root, rel.lstrip("/"))


def ct_dir(vmid, root="/"):
    return _p(root, "%s/%s" % (CT_REL, vmid))


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _pstart(pid):
    """Start time (clock ticks since boot) of a live, non-zombie process, else None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _init_pid(vmid, root="/"):
    """PID of the container's init if it is alive (checked against its recorded start time)."""
    info = _read_json(os.path.join(ct_dir(vmid, root), "runtime.json"))
    pid = info.get("pid")
    if not pid or _pstart(pid) is None or _pstart(pid) != info.get("pstart"):
        return None
    return pid


def _set_guest(vmid, root, status, pid):
    with labstate.modify(root) as st:
        guests = st.setdefault("guests", {})
        g = guests.setdefault(str(vmid), {"type": "lxc"})
        g.update({"type": "lxc", "status": status, "pid": pid})


class _Lock(object):
    """Serialises start/stop of one CT (not PVE's config lock, which the caller may hold)."""

    def __init__(self, vmid, root):
        self.path = ct_dir(vmid, root) + ".lock"

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


# --- start ---------------------------------------------------------------------------------

def status(vmid, root="/"):
    """"running" or "stopped" (the init is alive)."""
    return "running" if _init_pid(vmid, root) else "stopped"


def _validate_devices(cfg, root):
    """devN -> [(dev, st_mode, st_rdev)]; PVE checks the node's nodes at every start."""
    out = []
    for dev in conf.devices(cfg):
        path = dev["path"] or ""
        if not path.startswith("/dev/"):
            raise CTError("unable to parse dev%d: path must start with /dev/" % dev["index"])
        try:
            st = os.stat(_p(root, path))
        except OSError:
            raise CTError("Device %s does not exist" % path)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise CTError("%s is not a device" % path)
        out.append((dev, stat.S_IFMT(st.st_mode), st.st_rdev))
    return out


def _validate_mount_points(cfg, root):
    """The mpN bind mounts (a host directory); PVE dies "directory '<path>' does not exist" when the source is missing
    (pve-container src/PVE/LXC.pm:2300 __mountpoint_mount). Storage volumes are not simulated: said, not skipped."""
    out = []
    for mp in conf.mount_points(cfg):
        if not (mp["volume"] or "").startswith("/") or (mp["volume"] or "").startswith("/dev/"):
            raise CTError("lab: %s: only bind mount points (a host directory) are simulated, not %r"
                          % (mp["key"], mp["volume"]))
        if not os.path.isdir(_p(root, mp["volume"])):
            raise CTError("directory '%s' does not exist" % mp["volume"])
        out.append(mp)
    return out


def _mount_point(root, R, mp):
    """A bind mount point at its mp (made when absent, as walk_tree_nofollow does, src/PVE/LXC.pm:2071), ro=1 read-only."""
    target = R + "/" + mp["mp"].strip("/")
    os.makedirs(target, exist_ok=True)
    bind(_p(root, mp["volume"]), target, ro=mp["ro"])


def start(vmid, root="/", netns=None, timeout=15.0):
    """Start CT ``vmid`` (``lxc-start``). Returns the init's node-visible PID.

    Raises :class:`CTError` with PVE's text when the config is missing, a devN device is missing
    on the node, a non-optional mount entry fails, or the init does not come up."""
    vmid = str(vmid)
    with _Lock(vmid, root):
        if _init_pid(vmid, root):
            raise CTError("CT %s already running" % vmid)
        try:
            cfg = conf.load(vmid, root)
        except LookupError as e:
            raise CTError(str(e))
        devs = _validate_devices(cfg, root)
        mps = _validate_mount_points(cfg, root)
        d = ct_dir(vmid, root)
        base = _p(root, BASE_REL)
        for sub in ("upper", "work", "root"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        if not os.path.isfile(os.path.join(base, "usr/bin/python3")):
            raise CTError("lab: the CT base rootfs %s has no usr/bin/python3 (the lab core binds the cached "
                          "debootstrap rootfs there)\nstartup for container '%s' failed" % (base, vmid))
        magic = fs_magic(os.path.join(d, "upper"))
        if magic in (OVERLAY_MAGIC, FUSE_MAGIC):
            raise CTError("lab: %s is on %s; the CT disk (overlay upper) must be on a real filesystem "
                          "(the lab core binds a directory of tests/lab/.run there)\nstartup for container '%s' failed"
                          % (os.path.join(d, "upper"), "overlayfs" if magic == OVERLAY_MAGIC else "FUSE", vmid))
        seed = os.environ.get("KPRO_LAB_CT_SEED") or _p(root, SEED_REL)
        info = {"vmid": vmid, "hostname": conf.hostname(cfg, vmid), "devices": [dict(x[0]) for x in devs],
                "mount_entries": [m["line"] for m in conf.mount_entries(cfg)],
                "cgroup2_devices_allow": conf.cgroup_allow(cfg), "netns": netns,
                "mount_points": [dict(m) for m in mps]}
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # A: unshare, fork the container's PID 1, report its PID, exit
            code = 1
            try:
                os.close(rfd)
                os.setsid()
                if netns:
                    _setns(netns, CLONE_NEWNET)
                _unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID)
                child = os.fork()
                if child == 0:
                    _container_main(vmid, root, cfg, devs, info, base, d, seed, wfd)  # never returns
                os.write(wfd, b"PID %d\n" % child)
                code = 0
            except BaseException as e:  # noqa: B902  report anything to the parent
                try:
                    os.write(wfd, ("ERR lab: %s\n" % e).encode())
                except OSError:
                    pass
            os._exit(code)
        os.close(wfd)
        os.waitpid(pid, 0)
        data = b""
        while True:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            data += chunk
        os.close(rfd)
        init_pid, errors = None, []
        for line in data.decode(errors="replace").splitlines():
            if line.startswith("PID "):
                init_pid = int(line[4:])
            elif line.startswith("ERR "):
                errors.append(line[4:].replace("\\n", "\n"))
        if errors:
            if init_pid:
                _wait_gone(init_pid, 5.0)
            raise CTError("\n".join(errors) + "\nstartup for container '%s' failed" % vmid)
        if not init_pid:
            raise CTError("lab: the container runtime gave no init PID\nstartup for container '%s' failed" % vmid)
        info.update(pid=init_pid, pstart=_pstart(init_pid), started=time.time())
        sock = "/proc/%d/root%s" % (init_pid, SOCK_PATH)
        deadline = time.time() + timeout
        while time.time() < deadline and _pstart(init_pid) is not None and not os.path.exists(sock):
            time.sleep(0.02)
        if not os.path.exists(sock):
            alive = _pstart(init_pid) is not None
            if alive:
                _kill_wait(init_pid, 5.0)
            raise CTError("lab: the container's init %s (console: %s)\nstartup for container '%s' failed"
                          % ("did not open %s within %ss" % (SOCK_PATH, timeout) if alive else "exited",
                             _tail(os.path.join(d, "console.log")), vmid))
        tmp = os.path.join(d, "runtime.json.tmp")
        with open(tmp, "w") as f:
            json.dump(info, f, indent=1, sort_keys=True)
        os.rename(tmp, os.path.join(d, "runtime.json"))
        _set_guest(vmid, root, "running", init_pid)
        return init_pid


def _tail(path, n=600):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip().replace("\n", " | ")
    except OSError:
        return "(none)"


def _fail(wfd, text):
    try:
        os.write(wfd, ("ERR " + text.replace("\n", "\\n") + "\n").encode())
    finally:
        os._exit(1)


def _container_main(vmid, root, cfg, devs, info, base, d, seed, wfd):
    """PID 1 of the new pid namespace, in the new mount/uts/ipc namespaces: build the rootfs,
    pivot into it and exec the init. Errors go to ``wfd`` as "ERR text"."""
    try:
        R = os.path.join(d, "root")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("overlay", R, "overlay", 0, "lowerdir=%s,upperdir=%s,workdir=%s"
              % (base, os.path.join(d, "upper"), os.path.join(d, "work")))
        if os.path.isdir(seed):
            _copy_tree(seed, R)
        hn = info["hostname"]
        socket.sethostname(hn)
        _write_hostname(R, hn)
        # /proc
        os.makedirs(R + "/proc", exist_ok=True)
        mount("proc", R + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for rel in PROC_BINDS:
            src, dst = _p(root, "proc/" + rel), R + "/proc/" + rel
            if os.path.exists(src) and os.path.exists(dst):
                try:
                    bind(src, dst, ro=True, rec=True)
                except OSError:
                    pass
        # /sys
        os.makedirs(R + "/sys", exist_ok=True)
        mount("tmpfs", R + "/sys", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755,size=1m")
        node_sys = _p(root, "sys")
        if os.path.isdir(node_sys):
            for name in sorted(os.listdir(node_sys)):
                src = os.path.join(node_sys, name)
                if name == "fs" or os.path.islink(src) or not os.path.isdir(src):
                    continue
                os.mkdir(R + "/sys/" + name)
                try:
                    bind(src, R + "/sys/" + name, ro=True, rec=True)
                except OSError:
                    pass
        os.makedirs(R + "/sys/fs/cgroup")
        mount("tmpfs", R + "/sys/fs/cgroup", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755,size=4m")
        mount(None, R + "/sys", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755,size=1m")
        # /dev
        _setup_dev(R)
        for dev, ifmt, rdev in devs:
            target = R + dev["path"]
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.lexists(target):
                os.unlink(target)
            os.mknod(target, ifmt | 0o600, rdev)
            os.chown(target, dev["uid"], dev["gid"])
            os.chmod(target, dev["mode"])
        for mp in info["mount_points"]:
            _mount_point(root, R, mp)
        for entry in conf.mount_entries(cfg):
            _mount_entry(root, R, entry)
        # /run, lab plumbing
        os.makedirs(R + "/run", exist_ok=True)
        mount("tmpfs", R + "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64m")
        os.makedirs(R + "/run/lock", exist_ok=True)
        lab = _p(root, "var/lib/kpro-lab")
        os.makedirs(R + "/var/lib/kpro-lab", exist_ok=True)
        bind(lab, R + "/var/lib/kpro-lab")
        for sub in ("ct", "ct-base"):
            if os.path.isdir(R + "/var/lib/kpro-lab/" + sub):
                mount("tmpfs", R + "/var/lib/kpro-lab/" + sub, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
        if not os.path.isfile(R + INIT_PATH):
            raise CTError("the CT has no %s (seed %s missing?)" % (INIT_PATH, seed))
        console = os.open(os.path.join(d, "console.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        # into the rootfs
        os.chdir(R)
        try:
            os.makedirs(R + "/.oldroot", exist_ok=True)
            _pivot_root(".", ".oldroot")
            os.chdir("/")
            _check(_libc.umount2(b"/.oldroot", ctypes.c_int(MNT_DETACH)), "umount /.oldroot")
            os.rmdir("/.oldroot")
        except OSError:  # e.g. the node itself runs chrooted: move the rootfs onto / and chroot
            try:
                os.rmdir(R + "/.oldroot")
            except OSError:
                pass
            os.chdir(R)
            mount(R, "/", None, MS_MOVE)
            os.chroot(".")
            os.chdir("/")
    except CTError as e:
        _fail(wfd, str(e))
    except BaseException as e:  # noqa: B902
        _fail(wfd, "lab: container setup: %s" % e)
    os.write(wfd, b"OK\n")
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(console, 1)
    os.dup2(console, 2)
    os.closerange(3, 65536)
    env = {"container": "lxc", "PATH": PATH_ENV, "TERM": "linux"}
    for sig in range(1, signal.NSIG):
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        os.execve("/usr/bin/python3", ["/usr/bin/python3", INIT_PATH], env)
    except OSError as e:
        os.write(2, ("lab ct runtime: cannot exec the init: %s\n" % e).encode())
    os._exit(127)


def _copy_tree(src, dst):
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        tdir = os.path.normpath(os.path.join(dst, rel))
        if not os.path.isdir(tdir):
            os.makedirs(tdir, 0o755)
        for name in filenames:
            s, t = os.path.join(dirpath, name), os.path.join(tdir, name)
            if name.endswith((".pyc",)) or "__pycache__" in dirpath:
                continue
            if os.path.lexists(t):
                os.unlink(t)
            shutil.copy2(s, t)


def _write_hostname(R, hn):
    """What PVE's CT setup does at start: /etc/hostname and the 127.0.1.1 line of /etc/hosts."""
    os.makedirs(R + "/etc", exist_ok=True)
    with open(R + "/etc/hostname", "w") as f:
        f.write(hn + "\n")
    hosts = R + "/etc/hosts"
    try:
        with open(hosts) as f:
            text = f.read()
    except OSError:
        text = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
    lines = [ln for ln in text.splitlines() if not ln.startswith("127.0.1.1")]
    lines.insert(1 if lines else 0, "127.0.1.1 %s" % hn)
    if os.path.islink(hosts):
        os.unlink(hosts)
    with open(hosts, "w") as f:
        f.write("\n".join(lines) + "\n")


def _setup_dev(R):
    dev = R + "/dev"
    os.makedirs(dev, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=500000")
    for name, major, minor, mode in (("null", 1, 3, 0o666), ("zero", 1, 5, 0o666), ("full", 1, 7, 0o666),
                                     ("random", 1, 8, 0o666), ("urandom", 1, 9, 0o666), ("tty", 5, 0, 0o666)):
        os.mknod(dev + "/" + name, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(dev + "/" + name, mode)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, dev + "/" + name)
    os.mkdir(dev + "/pts")
    mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5")
    os.mkdir(dev + "/shm", 0o1777)
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    os.mkdir(dev + "/mqueue")
    try:
        mount("mqueue", dev + "/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass


def _mount_entry(root, R, entry):
    """One ``lxc.mount.entry`` (LXC ``mount_entry``): relative and absolute targets are both
    under the rootfs; ``optional`` skips a missing source or a failed mount silently."""
    opts = entry["options"]
    optional = "optional" in opts
    is_bind = "bind" in opts or "rbind" in opts
    src = _p(root, entry["source"]) if is_bind else entry["source"]
    target = R + "/" + entry["target"].lstrip("/")
    shown = "%s/%s" % (LXC_ROOTFS, entry["target"].lstrip("/"))
    if is_bind and not os.path.lexists(src):
        if optional:
            return
        raise CTError('safe_mount: No such file or directory - Failed to mount "%s" onto "%s"\n'
                      'Failed to setup mount entries' % (entry["source"], shown))
    create = [o.split("=", 1)[1] for o in opts if o.startswith("create=")]
    if not os.path.lexists(target) and create:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if create[-1] == "dir":
            os.makedirs(target, exist_ok=True)
        else:
            open(target, "a").close()
    flags, data = 0, []
    for o in opts:
        if o in ("bind", "optional") or o.startswith("create="):
            continue
        if o == "rbind":
            flags |= MS_REC
        elif o == "ro":
            flags |= MS_RDONLY
        elif o == "nosuid":
            flags |= MS_NOSUID
        elif o == "nodev":
            flags |= MS_NODEV
        elif o == "noexec":
            flags |= MS_NOEXEC
        elif o not in ("rw", "defaults"):
            data.append(o)
    try:
        if is_bind:
            mount(src, target, None, MS_BIND | (flags & MS_REC))
            if flags & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC):
                mount(None, target, None, MS_BIND | MS_REMOUNT | (flags & ~MS_REC))
        else:
            mount(entry["source"], target, entry["fstype"], flags, ",".join(data) or None)
    except OSError as e:
        if optional:
            return
        raise CTError('safe_mount: %s - Failed to mount "%s" onto "%s"\nFailed to setup mount entries'
                      % (os.strerror(e.errno), entry["source"], shown))


# --- stop ----------------------------------------------------------------------------------

def _wait_gone(pid, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _pstart(pid) is None:
            return True
        time.sleep(0.02)
    return _pstart(pid) is None


def _kill_wait(pid, timeout):
    try:
        os.kill(pid, signal.SIGKILL)  # PID 1 of the CT: the kernel kills the whole pid namespace
    except ProcessLookupError:
        return True
    return _wait_gone(pid, timeout)


def stop(vmid, timeout=10.0, root="/"):
    """Stop CT ``vmid``: SIGTERM to its init (it stops the units, then exits), wait up to
    ``timeout`` s, then SIGKILL the init by PID (ends every process of the pid namespace; the
    mount namespace and its overlay go with the last one). ``timeout=0`` is ``pct stop``'s hard
    stop. Returns "clean", "killed" or "not running"."""
    vmid = str(vmid)
    with _Lock(vmid, root):
        pid = _init_pid(vmid, root)
        if not pid:
            _set_guest(vmid, root, "stopped", None)
            return "not running"
        result = "killed"
        if timeout and timeout > 0:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if _wait_gone(pid, timeout):
                result = "clean"
        if result != "clean" and not _kill_wait(pid, 10.0):
            raise CTError("lab: CT %s init %d survived SIGKILL" % (vmid, pid))
        _set_guest(vmid, root, "stopped", None)
        return result


# --- exec / push / pull ----------------------------------------------------------------

def exec_argv(vmid, argv, root="/"):
    """The command line that runs ``argv`` inside the CT (its /, pid/mount/uts/ipc namespaces),
    for ``os.execvpe(a[0], a, exec_env())`` in ``pct exec`` (lxc-attach --clear-env)."""
    pid = _init_pid(str(vmid), root)
    if not pid:
        raise CTError("CT %s not running" % vmid)
    return ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-p", "-r", "-w", "--"] + list(argv)


def exec_env():
    """lxc-attach --clear-env: only container=lxc, PATH, HOME and TERM."""
    env = {"container": "lxc", "PATH": PATH_ENV, "HOME": "/root"}
    if os.environ.get("TERM"):
        env["TERM"] = os.environ["TERM"]
    return env


def exec_in(vmid, argv, stdin=None, root="/", timeout=None, capture=True):
    """Run ``argv`` in the CT; returns subprocess.CompletedProcess (bytes stdout/stderr when captured)."""
    cmd = exec_argv(vmid, argv, root)
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if capture else {}
    return subprocess.run(cmd, input=stdin if stdin is not None else b"", env=exec_env(), timeout=timeout, **kw)


def push(vmid, src, dst, perms=None, user=None, group=None, root="/"):
    """``pct push``: copy the node file ``src`` to ``dst`` in the CT (owner root unless
    ``user``/``group``, names resolved in the CT; ``perms`` octal string or int)."""
    if not dst.startswith("/"):
        raise CTError("destination must be an absolute path")
    with open(src, "rb") as f:
        data = f.read()
    mode = perms if isinstance(perms, int) else int(str(perms), 0 if str(perms).startswith("0x") else 8) \
        if perms is not None else None
    script = 'cat > "$1" || exit 1\n'
    if mode is not None:
        script += 'chmod %o "$1" || exit 1\n' % mode
    if user or group:
        script += 'chown "%s:%s" "$1" || exit 1\n' % (user or "", group or "")
    r = exec_in(vmid, ["sh", "-c", script, "sh", dst], stdin=data, root=root)
    if r.returncode:
        raise CTError("failed to push %s to CT %s:%s: %s" % (src, vmid, dst, r.stderr.decode(errors="replace").strip()))


def pull(vmid, src, dst, root="/"):
    """``pct pull``: copy ``src`` from the CT to the node file ``dst``."""
    r = exec_in(vmid, ["cat", "--", src], root=root)
    if r.returncode:
        raise CTError("failed to pull %s from CT %s: %s" % (src, vmid, r.stderr.decode(errors="replace").strip()))
    with open(dst, "wb") as f:
        f.write(r.stdout)
