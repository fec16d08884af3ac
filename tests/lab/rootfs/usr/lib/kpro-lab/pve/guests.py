"""Guest state and power actions (labstate ``guests`` section; configs under /etc/pve are the truth).

``guests[vmid] = {"type": "lxc"|"qemu", "status": "running"|"stopped", "pid": int or None,
"started": epoch seconds or None}``.

Container runtime hook: :func:`ct_start` / :func:`ct_stop` / :func:`exec_argv` delegate to
``pve/ct_runtime.py`` when that module exists (a later issue provides the real container:
namespaces, rootfs, /dev passthrough). It must define::

    start(vmid, conf, log) -> pid        # the CT's init pid on the node
    stop(vmid, pid, log, force=True, timeout=60)
    exec_argv(vmid, pid, argv) -> list   # e.g. ["nsenter", "-t", str(pid), "-a", "--"] + argv
    is_running(vmid, pid) -> bool        # optional: lets status follow a CT that died

Else, on the node itself (root "/", euid 0) once ``/var/lib/kpro-lab/ct-base/usr/bin/python3``
exists (or with ``KPRO_LAB_CT_RUNTIME=ct``), the lab's container runtime ``ct/runtime.py``
(``from ct import runtime``: start/stop/status/exec_argv/push/pull) is used through
:class:`_CtRuntime`; ``KPRO_LAB_CT_RUNTIME=fake`` forces the state-only fake, which is also
what temp roots (unit tests) get: start/stop only flip the state (pid = a value that can
never be a real pid).
"""

import os
import re
import time

import labstate

import pve
from pve import PVEError, ctconf

FAKE_PID_BASE = 1 << 22  # above the kernel's maximum pid_max: never a real process


class _CtRuntime(object):
    """Adapter from the hook interface above to ct/runtime.py (which records guests[vmid] itself)."""

    def __init__(self, mod):
        self.mod = mod

    def _call(self, func, *args, **kw):
        try:
            return func(*args, **kw)
        except getattr(self.mod, "CTError", ()) as e:
            raise PVEError(str(e).strip() or type(e).__name__)

    def start(self, vmid, conf, log):
        self._call(self.mod.start, int(vmid), root=pve.root())
        return guest_state(vmid).get("pid")

    def stop(self, vmid, pid, log, force=True, timeout=60):
        res = self._call(self.mod.stop, int(vmid), timeout=float(timeout if not force else min(timeout, 10)), root=pve.root())
        if res == "killed":
            log("container did not stop in time - killed")

    def exec_argv(self, vmid, pid, argv):
        return self._call(self.mod.exec_argv, int(vmid), list(argv), root=pve.root())

    def is_running(self, vmid, pid):
        return self.mod.status(int(vmid), root=pve.root()) == "running"

    def push(self, vmid, src, dst, **kw):
        return self._call(self.mod.push, int(vmid), src, dst, root=pve.root(), **kw)

    def pull(self, vmid, src, dst):
        return self._call(self.mod.pull, int(vmid), src, dst, root=pve.root())


def _runtime():
    mode = os.environ.get("KPRO_LAB_CT_RUNTIME", "auto")
    if mode == "fake":
        return None
    try:
        from pve import ct_runtime  # noqa: F401  (optional hook module)
        return ct_runtime
    except ImportError:
        pass
    # auto: the real runtime once the node is provisioned for it (its documented base rootfs exists)
    provisioned = os.path.exists(pve.path("var/lib/kpro-lab/ct-base/usr/bin/python3"))
    if mode == "ct" or (pve.root() == "/" and os.geteuid() == 0 and provisioned):
        try:
            from ct import runtime
        except ImportError:
            return None
        return _CtRuntime(runtime)
    return None


def _entry(state, vmid):
    return (state.get("guests") or {}).get(str(vmid)) or {}


def guest_state(vmid):
    try:
        state = labstate.load()
    except (OSError, ValueError):
        state = {}
    ent = dict(_entry(state, vmid))
    rt = _runtime()
    if ent.get("status") == "running" and rt is not None and hasattr(rt, "is_running"):
        if not rt.is_running(vmid, ent.get("pid")):
            ent["status"] = "stopped"
    return ent


def check_running(vmid):
    return guest_state(vmid).get("status") == "running"


def _set_state(vmid, kind, status, pid=None):
    with labstate.modify() as st:
        guests = st.setdefault("guests", {})
        guests[str(vmid)] = {"type": kind, "status": status, "pid": pid,
                             "started": int(time.time()) if status == "running" else None}


def list_vmids(kind="lxc"):
    d = pve.guest_dir(kind)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in (re.match(r"^(\d+)\.conf$", n) for n in names) if m)


def check_devices(conf):
    """Every devN path must be a device node now: vm_start calls update_lxc_config (pve-container src/PVE/LXC.pm:2649
    and :702 in 5.2.6, :3136 and :777 in 6.1.x), which dies with get_device_mode_and_rdev's "Device <path> does not
    exist" (src/PVE/LXC/Tools.pm:163) before lxc-start runs. The prestart hook's "Could not get mode or device ID of
    <path>" (src/lxc-pve-prestart-hook:144 / :167) is never reached for a node missing at start, so not modelled."""
    for key in sorted((k for k in conf if re.match(r"^dev\d+$", k)), key=lambda k: int(k[3:])):
        dev = ctconf.parse_device(conf[key])
        ctconf.device_mode_and_rdev(dev["path"])


def start_delay():
    return float(os.environ.get("KPRO_LAB_CT_START_DELAY", "1.0"))


def ct_start(vmid, log=None, skiplock=False):
    """The body of a vzstart task (PVE::API2::LXC::Status vm_start realcmd + PVE::LXC::vm_start)."""
    log = log or (lambda text: None)
    with ctconf.lock_config(vmid):
        conf = ctconf.load_config(vmid)
        if conf.get("template"):
            raise PVEError("you can't start a CT if it's a template")
        if not skiplock and conf.get("lock") != "mounted":
            ctconf.check_lock(conf)
        if conf.get("pending"):
            ctconf.apply_pending(conf)
            ctconf.write_config(vmid, conf)
            conf = ctconf.load_config(vmid)
        check_devices(conf)
        time.sleep(start_delay())
        rt = _runtime()
        pid = rt.start(vmid, conf, log) if rt is not None else FAKE_PID_BASE + int(vmid)
        _set_state(vmid, "lxc", "running", pid)


def ct_stop(vmid, log=None, shutdown=False, timeout=60, force=False, skiplock=False):
    """The body of a vzstop / vzshutdown task."""
    log = log or (lambda text: None)
    with ctconf.lock_config(vmid):
        conf = ctconf.load_config(vmid)
        if shutdown or (not skiplock and conf.get("lock") != "mounted"):
            ctconf.check_lock(conf)
        ent = guest_state(vmid)
        rt = _runtime()
        if rt is not None:
            rt.stop(vmid, ent.get("pid"), log, force=(not shutdown) or force, timeout=timeout)
        else:
            time.sleep(min(start_delay(), 0.5))
        _set_state(vmid, "lxc", "stopped", None)


def ct_reboot(vmid, log=None, timeout=60):
    ct_stop(vmid, log, shutdown=True, timeout=timeout, force=True)
    ct_start(vmid, log)


def ct_unlock(vmid):
    with ctconf.lock_config(vmid):
        conf = ctconf.load_config(vmid)
        conf.pop("lock", None)
        ctconf.write_config(vmid, conf)


STOCK_TEMPLATE = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"  # what ct-base is (tests/lab/stock/ct.txt)


def _ct_disk(vmid):
    """The CT's own rootfs volume (PVE: local-zfs:subvol-<vmid>-disk-0): the overlay upper/work of ct/runtime.py."""
    return [pve.path("var/lib/kpro-lab/ct/%s/%s" % (vmid, sub)) for sub in ("upper", "work")]


def ct_destroy(vmid, log=None):
    """``pct destroy`` (pve-container src/PVE/API2/LXC.pm destroy_vm :847-921): refused for a protected, locked or
    running CT with PVE's messages; frees the volumes the CT owns (src/PVE/LXC.pm destroy_lxc_container :1023-1040:
    rootfs and volume mpN; a bind mpN is a host directory, classify_mountpoint, and is left alone), then the config."""
    import shutil
    conf = ctconf.load_config(vmid)
    if conf.get("protection"):
        raise PVEError("can't remove CT %s - protection mode enabled" % vmid)
    ctconf.check_lock(conf)
    if check_running(vmid):
        raise PVEError("unable to destroy CT %s - container is running" % vmid)
    with ctconf.lock_config(vmid):
        for d in _ct_disk(vmid):
            shutil.rmtree(d, ignore_errors=True)
        os.unlink(ctconf.config_file(vmid))
        with labstate.modify() as st:
            (st.get("guests") or {}).pop(str(vmid), None)


def ct_create(vmid, ostemplate, params):
    """``pct create <vmid> <ostemplate>`` (src/PVE/API2/LXC.pm create_vm): a VMID in use is refused with
    pve-cluster's check_vmid_unused message (:281); ``unprivileged`` defaults to 1 (:272); ``rootfs STORAGE:SIZE``
    allocates subvol-<vmid>-disk-0 (an empty CT disk over the template, ct-base). Only the lab's stock template
    exists; the new CT is stopped."""
    if ctconf.read_raw(vmid) is not None:
        raise PVEError("CT %s already exists on node '%s'" % (vmid, pve.nodename()))
    if ostemplate != STOCK_TEMPLATE:
        raise PVEError("lab: the only container template here is %s (got %s)" % (STOCK_TEMPLATE, ostemplate))
    conf = {"arch": "amd64", "ostype": "debian", "unprivileged": 1, "digest": "", "pending": {}, "snapshots": {}}
    for key, value in params.items():
        conf[key] = ctconf.check_type(key, value)
    m = re.match(r"^([a-z][\w.-]*):(\d+(?:\.\d+)?)$", str(params.get("rootfs", "local-zfs:8")))
    if not m:
        raise PVEError("lab: rootfs must be STORAGE:SIZE_IN_GiB for a new container (got %s)" % params["rootfs"])
    conf["rootfs"] = "%s:subvol-%s-disk-0,size=%sG" % (m.group(1), vmid, m.group(2))
    for d in _ct_disk(vmid):
        os.makedirs(d, exist_ok=True)
    with ctconf.lock_config(vmid):
        ctconf.write_config(vmid, conf)
    _set_state(vmid, "lxc", "stopped")


def exec_argv(vmid, argv):
    """argv that runs ``argv`` inside the CT, or None when only the placeholder exists."""
    ent = guest_state(vmid)
    if ent.get("status") != "running":
        raise PVEError("container '%s' not running!" % vmid)
    rt = _runtime()
    if rt is not None and hasattr(rt, "exec_argv"):
        return rt.exec_argv(vmid, ent.get("pid"), argv)
    return None


# ---- status ---------------------------------------------------------------------------

def _maxdisk(conf):
    m = re.search(r"(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)", str(conf.get("rootfs") or ""))
    if not m:
        return 4 * 1024 ** 3
    mult = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}[m.group(2)]
    return int(float(m.group(1)) * mult)


def ct_vmstatus(vmid, conf=None):
    """One entry of GET /nodes/<node>/lxc (PVE::LXC::vmstatus)."""
    conf = conf if conf is not None else ctconf.load_config(vmid)
    ent = guest_state(vmid)
    running = ent.get("status") == "running"
    d = {"vmid": int(vmid), "type": "lxc", "status": "running" if running else "stopped",
         "name": re.sub(r"\s", "", str(conf.get("hostname") or "CT%s" % vmid)),
         "cpus": conf.get("cores") or conf.get("cpulimit") or os.cpu_count() or 1,
         "maxmem": int(conf.get("memory") or 512) * 1024 * 1024, "maxswap": int(conf.get("swap") or 0) * 1024 * 1024,
         "maxdisk": _maxdisk(conf), "disk": 0, "mem": 0, "swap": 0, "cpu": 0, "uptime": 0, "netin": 0, "netout": 0,
         "diskread": 0, "diskwrite": 0}
    if conf.get("tags") is not None:
        d["tags"] = conf["tags"]
    if conf.get("template"):
        d["template"] = 1
    if conf.get("lock"):
        d["lock"] = conf["lock"]
    if running:
        if ent.get("pid") is not None:
            d["pid"] = int(ent["pid"])
        if ent.get("started"):
            d["uptime"] = max(0, int(time.time()) - int(ent["started"]))
    return d


def vm_vmstatus(vmid, conf=None):
    """One entry of GET /nodes/<node>/qemu (read-only VMs; the lab never runs them)."""
    conf = conf if conf is not None else ctconf.load_config(vmid, "qemu-server")
    ent = guest_state(vmid)
    running = ent.get("status") == "running"
    cores = int(conf.get("cores") or 1) * int(conf.get("sockets") or 1)
    d = {"vmid": int(vmid), "status": "running" if running else "stopped", "name": conf.get("name") or "VM %s" % vmid,
         "cpus": conf.get("vcpus") or cores, "maxmem": int(conf.get("memory") or 512) * 1024 * 1024, "maxdisk": 0,
         "mem": 0, "cpu": 0, "uptime": 0, "disk": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0}
    if running:
        d["qmpstatus"] = "running"
        if ent.get("pid") is not None:
            d["pid"] = int(ent["pid"])
    else:
        d["qmpstatus"] = "stopped"
    if conf.get("lock"):
        d["lock"] = conf["lock"]
    if conf.get("tags") is not None:
        d["tags"] = conf["tags"]
    if conf.get("template"):
        d["template"] = 1
    return d


def _startup_order(conf):
    """``startup: order=N,up=S,down=S`` -> N (guests without an order start after those with one)."""
    for part in str(conf.get("startup") or "").split(","):
        k, _sep, v = part.partition("=")
        if k.strip() == "order" and v.strip().isdigit():
            return int(v)
    return 1 << 31


def _vm_start_standin(vmid):
    """A VM's kvm stand-in (what labctl starts at up): a process PVE's pidfile check finds."""
    import subprocess
    import sys as _sys
    pidfile = "/run/qemu-server/%s.pid" % vmid
    os.makedirs(os.path.dirname(pidfile), exist_ok=True)
    code = "import os,sys,time; open(sys.argv[4], 'w').write('%d\\n' % os.getpid()); time.sleep(10**9)"
    subprocess.Popen([_sys.executable, "-c", code, "-id", str(vmid), "-pidfile", pidfile], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _attempt in range(100):
        if os.path.exists(pidfile):
            break
        time.sleep(0.02)
    _set_state(vmid, "qemu", "running", None)


def startall(log, user="root@pam", force=False, vms=None):
    """The body of the ``startall`` task (pve-manager PVE/API2/Nodes.pm startall, run by pve-guests.service at
    boot): the guests with ``onboot: 1`` (all with ``force``), by ``startup: order=`` then VMID; each start is
    its own vzstart/qmstart task, waited for; a failure is logged ("Starting CT 129 failed: <task status>")
    and the next guest is started."""
    from pve import tasks
    want = set(int(v) for v in str(vms).split(",") if v.strip()) if vms else None
    todo = []
    for kind, label in (("lxc", "CT"), ("qemu-server", "VM")):
        for vmid in list_vmids(kind):
            if want is not None and vmid not in want:
                continue
            try:
                conf = ctconf.load_config(vmid, kind) if kind != "lxc" else ctconf.load_config(vmid)
            except PVEError:
                continue
            if not force and str(conf.get("onboot", "0")) not in ("1", "yes", "on", "true"):
                continue
            todo.append((_startup_order(conf), vmid, kind, label))
    for _prio, vmid, kind, label in sorted(todo):
        if check_running(vmid):
            continue
        if kind != "lxc":
            conf = ctconf.load_config(vmid, kind)
            pci = sorted(k for k in conf if re.match(r"^hostpci\d+$", k))
            if pci:
                # Fidelity gap, said in the lab's own words (not PVE's): qemu-server would bind these devices to
                # vfio-pci here (PVE/QemuServer/PCI.pm prepare_pci_device), taking them from the host's driver.
                log("kpro-lab: VM %d (onboot, %s) not started: the lab does not simulate a VM taking its "
                    "passthrough devices; a real host starts it here" % (vmid, ", ".join(conf[k] for k in pci)))
                continue
        log("Starting %s %d" % (label, vmid))
        if kind == "lxc":
            upid = tasks.fork_worker("vzstart", vmid, user, lambda upid, wlog, v=vmid: ct_start(v, wlog))
            status = tasks.wait(upid, timeout=120)
        else:
            _vm_start_standin(vmid)
            status = "OK"
        if status != "OK":
            log("Starting %s %d failed: %s" % (label, vmid, status))
