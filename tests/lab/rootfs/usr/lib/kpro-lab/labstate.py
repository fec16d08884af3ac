"""The lab's simulated hardware and kernel state: one JSON document, one lock.

Every fake on the simulated Proxmox node (the FUSE sysfs, /proc overlays, modprobe,
the NVIDIA installer stand-in, libnvidia-ml, nvidia-smi, pct/pvesh, the PVE API, the
SGLang stand-in) reads and writes the hardware through this module, so that they all
agree on what the "machine" looks like. Standard library only: it runs with the
node's own /usr/bin/python3 (3.11) and with the controller's venv python (3.12).

Layout: ``<root>/var/lib/kpro-lab/state.json``; ``<root>`` is ``/`` on the node (or
``$KPRO_LAB_ROOT``) and the node's root directory when used from outside (the FUSE
daemon, tests: ``labctl.py root``). After every change the derived files that C code
and shell fakes read are rendered again by the renderers registered with
:func:`register_renderer`, and by plugins: each ``<root>/usr/lib/kpro-lab/plugins/*.py``
may define ``render(root, state)`` (called after each committed change) and
``on_boot(root, state)`` (called by :func:`boot` after the kernel came up, e.g. to start
``onboot`` guests).

API (state transitions; all raise :class:`KernelError`, an ``OSError`` with the kernel's
errno whose ``str()`` is the message the real tool prints; ``st`` is the state dict from
``with modify() as st``; nothing here takes the lock except the ``*_locked`` helpers):

  Modules (names normalised: ``vfio-pci`` == ``vfio_pci``)
    module_available(st, name, release=None) -> bool
    kmod_load(st, name, params=None) -> bool          # insmod + dependencies; False if already loaded
        ENOENT "modprobe: FATAL: Module X not found in directory /lib/modules/R"
        EKEYREJECTED (Secure Boot, unsigned), ENODEV (nvidia: no GPU could be probed)
    kmod_unload(st, name) -> None                     # rmmod: ENOENT not loaded, EBUSY holders/users
    modprobe(st, name, root=None, params=None, remove=False, alias=False) -> list[str]
        modprobe semantics from the node's /etc/modprobe.d (options, softdep, install
        /bin/false, blacklist for alias probing only) and the cmdline ``mod.param=``
    Compatibility: ``kmod_load("nvidia", root=R)`` / ``kmod_unload(name, root=R)`` with a
    module name as first argument take the lock themselves (used by nvlab.py).
    module_holders(st, name) -> list[str]; module_refcnt(st, name) -> int
  PCI (sysfs writes; ``text`` is what was written, newline included)
    pci_bind(st, driver, text)        # ENODEV no device / no match; EBUSY already bound
    pci_unbind(st, driver, text)      # ENODEV not bound to this driver
    pci_probe(st, text)               # /sys/bus/pci/drivers_probe; ENODEV no device
    pci_new_id(st, driver, text)      # EINVAL malformed, EEXIST already matched; binds unbound matches
    pci_remove_id(st, driver, text)   # EINVAL malformed, ENODEV not a dynid
    pci_set_override(st, bdf, text)   # "\n" clears; EINVAL too long
    pci_match(st, driver, bdf) -> bool; pci_driver_of(st, bdf) -> name or None
  Boot
    boot(st, root=None, release=None) -> None          # reboot into release (default running)
    install_kernel(st, release, root=None) -> None     # package install: initramfs + ESP refresh
    register_kernel(st, release) / unregister_kernel(st, release)  # the kernel package's postinst / postrm
    next_boot_release(st, root=None) -> str            # what the boot loader boots: next-boot pin, pin, newest
    boot_kernels(st, root=None) -> (manual, automatic, pinned, next_boot)  # proxmox-boot-tool kernel list
    module_signature_ok(st, release=None) -> (bool, why)  # Secure Boot: signed by an enrolled key
    initramfs_update(st, root=None, releases=None); boot_refresh(st, root=None)  # the fakes' backends
    read_modprobe_conf(root=None, files=None) -> dict; boot_cmdline(st, root=None) -> str
  Rendering (read by fakesys / the /proc overlay)
    proc_devices(st), proc_modules(st), proc_cmdline(st), proc_nvidia_version(st) -> str
  State
    load(root=None); save(state, root=None); locked(root=None); modify(root=None)
    register_renderer(func); initial_state() -> dict (the seed's hardware)

State shape (README "The state"): kernel {release, installed, headers,
headers_available, secure_boot, cmdline, efi, boots}; modules {loaded (load order),
params {mod: {p: v}}, available {release: [out-of-tree modules built for it]}, refcnt
{mod: n}}; pci {devices {bdf: {...}}, drivers {name: {module, ids, dynids, seq}}};
majors {chrdev name: dynamic major}; boot {esp_cmdline, grub_cmdline, initramfs
{release: {"files": {path: text}}}}; nvidia; gpus; guests.
PCI id entries (``ids``/``dynids``) are ``[vendor, device, subvendor, subdevice, class,
class_mask]`` as lowercase hex strings, ``"ffffffff"`` meaning PCI_ANY_ID (kernel
``struct pci_device_id``); device fields ``vendor``/``device``/``class`` are hex strings
without ``0x`` (``"10de"``, ``"2230"``, ``"030000"``).
"""

import contextlib
import copy
import errno
import fcntl
import glob
import json
import os
import re
import time

STATE_REL = "var/lib/kpro-lab/state.json"
LOCK_REL = "var/lib/kpro-lab/state.lock"
PLUGINS_REL = "usr/lib/kpro-lab/plugins"
ANY = "ffffffff"

_RENDERERS = []
_PLUGINS = {}


class KernelError(OSError):
    """A refusal with the kernel's errno; ``str()`` is the message the real tool prints."""

    def __init__(self, err, message=None):
        super().__init__(err, message or os.strerror(err))
        self.message = message or os.strerror(err)

    def __str__(self):
        return self.message


def register_renderer(func):
    """Register ``func(root, state)``, called after each committed change."""
    if func not in _RENDERERS:
        _RENDERERS.append(func)
    return func


def _root(root):
    return root if root is not None else os.environ.get("KPRO_LAB_ROOT", "/")


def _p(root, rel):
    return os.path.join(_root(root), rel.lstrip("/"))


def state_path(root=None):
    return os.path.join(_root(root), STATE_REL)


def load(root=None):
    """Return a copy of the current state (no lock needed: writers rename atomically)."""
    with open(state_path(root)) as f:
        return json.load(f)


def _plugins(root):
    """Import ``<root>/usr/lib/kpro-lab/plugins/*.py`` once per root (sorted)."""
    root = _root(root)
    if root not in _PLUGINS:
        mods = []
        for path in sorted(glob.glob(os.path.join(root, PLUGINS_REL, "*.py"))):
            ns = {"__name__": "kpro_lab_plugin_" + os.path.basename(path)[:-3], "__file__": path}
            try:
                with open(path) as f:
                    exec(compile(f.read(), path, "exec"), ns)  # noqa: S102 (lab plugins only)
            except Exception as e:  # a broken plugin must not break the kernel
                print("labstate: plugin %s failed to load: %s" % (path, e))
                continue
            mods.append(ns)
        _PLUGINS[root] = mods
    return _PLUGINS[root]


def save(state, root=None):
    """Write ``state`` atomically. Call under :func:`modify`'s lock."""
    path = state_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.write("\n")
    os.rename(tmp, path)
    _render(state, root)


def _render(state, root):
    for func in _RENDERERS:
        func(_root(root), state)
    for ns in _plugins(root):
        if callable(ns.get("render")):
            ns["render"](_root(root), state)


def views_current(state, root=None):
    """True when the rendered views (nvml.conf) match ``state``. A writer SIGKILLed between saving
    state.json and rendering leaves them stale; the next :func:`modify` renders them again."""
    return _nvml_render is None or _nvml_render.is_current(_root(root), state)


@contextlib.contextmanager
def locked(root=None):
    """Hold the state lock (exclusive) for a read-modify-write."""
    lock_path = os.path.join(_root(root), LOCK_REL)
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lf, fcntl.LOCK_UN)


@contextlib.contextmanager
def modify(root=None):
    """``with modify() as st: st[...] = ...`` — saved (and rendered) on clean exit only."""
    with locked(root):
        state = load(root)
        before = copy.deepcopy(state)
        yield state
        if state != before:
            save(state, root)
        elif not views_current(state, root):
            _render(state, root)  # a writer died between saving and rendering: repair its views


# --------------------------------------------------------------------------------------
# The kernel's module catalogue (in-tree modules of a PVE 6.8 kernel that matter here)
# --------------------------------------------------------------------------------------

def _id(vendor=ANY, device=ANY, cls="000000", mask="000000", subvendor=ANY, subdevice=ANY):
    return [vendor, device, subvendor, subdevice, cls, mask]


# name: deps (modules it needs), pci (driver name it registers), ids (static table),
# chr (fixed majors), dyn (dynamically allocated char majors), size, out_of_tree.
MODULES = {
    "vfio": {"deps": [], "dyn": ["vfio"], "size": 69632},
    "vfio_iommu_type1": {"deps": ["vfio"], "size": 49152},
    "irqbypass": {"deps": [], "size": 12288},
    "vfio_pci_core": {"deps": ["vfio", "irqbypass"], "size": 86016},
    # vfio-pci's static table only has override-only entries: it binds by ids= (dynids) or driver_override.
    "vfio_pci": {"deps": ["vfio_pci_core"], "pci": "vfio-pci", "ids": [], "size": 16384},
    "libahci": {"deps": [], "size": 53248},
    "ahci": {"deps": ["libahci"], "pci": "ahci", "ids": [_id("8086", cls="010601", mask="ffffff"), _id(cls="010601", mask="ffffff")],
             "size": 49152},
    "dca": {"deps": [], "size": 16384},
    "i2c_algo_bit": {"deps": [], "size": 16384},
    "igb": {"deps": ["dca", "i2c_algo_bit"], "pci": "igb", "ids": [_id("8086", "1533"), _id("8086", "1521"), _id("8086", "10c9")],
            "size": 323584},
    "snd": {"deps": [], "size": 135168},
    "soundcore": {"deps": [], "size": 16384},
    "snd_pcm": {"deps": ["snd"], "size": 192512},
    "snd_hda_core": {"deps": ["snd", "snd_pcm"], "size": 139264},
    "snd_hda_codec": {"deps": ["snd_hda_core", "snd_pcm", "snd"], "size": 204800},
    "snd_intel_dspcfg": {"deps": [], "size": 36864},
    "snd_hda_intel": {"deps": ["snd_intel_dspcfg", "snd_hda_codec", "snd_hda_core", "snd_pcm", "snd", "soundcore"],
                      "pci": "snd_hda_intel", "ids": [_id("10de", cls="040300", mask="ffff00"), _id(cls="040300", mask="ffff00")],
                      "size": 61440},
    "xhci_pci": {"deps": [], "pci": "xhci_hcd", "ids": [_id(cls="0c0330", mask="ffffff")], "size": 24576},
    "drm": {"deps": [], "size": 741376},
    "drm_kms_helper": {"deps": ["drm"], "size": 253952},
    "drm_ttm_helper": {"deps": ["drm"], "size": 12288},
    "ttm": {"deps": ["drm"], "size": 110592},
    "video": {"deps": [], "size": 73728},
    "nouveau": {"deps": ["drm_kms_helper", "drm_ttm_helper", "ttm", "drm", "video", "i2c_algo_bit"], "pci": "nouveau",
                "ids": [_id("10de", cls="030000", mask="ff0000"), _id("12d2", cls="030000", mask="ff0000")], "size": 3096576},
    "coretemp": {"deps": [], "size": 20480},
    "spl": {"deps": [], "size": 155648},
    "zfs": {"deps": ["spl"], "size": 6053888},
    "kvm": {"deps": [], "size": 1413120},
    "kvm_intel": {"deps": ["kvm"], "size": 413696},
    # NVIDIA (out of tree: available only where modules.available[release] lists them)
    "nvidia": {"deps": [], "pci": "nvidia", "ids": [_id("10de", cls="030000", mask="ffff00"), _id("10de", cls="030200", mask="ffff00")],
               "chr": [(195, "nvidia"), (195, "nvidiactl")], "dyn": ["nvidia-caps", "nvidia-caps-imex-channels"],
               "size": 104022016, "out_of_tree": True},
    "nvidia_uvm": {"deps": ["nvidia"], "dyn": ["nvidia-uvm"], "size": 2068480, "out_of_tree": True},
    "nvidia_modeset": {"deps": ["nvidia"], "size": 1638400, "out_of_tree": True},
    "nvidia_drm": {"deps": ["nvidia_modeset", "drm_kms_helper", "drm", "video"], "size": 135168, "out_of_tree": True},
    "nvidia_peermem": {"deps": ["nvidia"], "size": 16384, "out_of_tree": True},
}

BUILTIN_DRIVERS = {"pcieport": {"ids": [_id(cls="060400", mask="ffffff")]}}

# /proc/devices: what any PVE 8 host shows (dynamic majors 234..254 taken by these at boot)
CHAR_BASE = [
    (1, "mem"), (4, "/dev/vc/0"), (4, "tty"), (4, "ttyS"), (5, "/dev/tty"), (5, "/dev/console"), (5, "/dev/ptmx"),
    (5, "ttyprintk"), (7, "vcs"), (10, "misc"), (13, "input"), (21, "sg"), (29, "fb"), (89, "i2c"), (99, "ppdev"),
    (108, "ppp"), (128, "ptm"), (136, "pts"), (180, "usb"), (189, "usb_device"), (202, "cpu/msr"), (203, "cpu/cpuid"),
    (226, "drm"), (234, "kfd"), (235, "ipmidev"), (236, "nvme-generic"), (237, "nvme"), (238, "hidraw"),
    (239, "ttyDBC"), (240, "aux"), (241, "cec"), (242, "lirc"), (243, "bsg"), (244, "watchdog"), (245, "remoteproc"),
    (246, "ptp"), (247, "pps"), (248, "rtc"), (249, "dma_heap"), (250, "dax"), (251, "dimmctl"), (252, "ndctl"),
    (253, "tpm"), (254, "gpiochip"),
]
BLOCK_BASE = [(7, "loop"), (8, "sd"), (9, "md"), (11, "sr"), (65, "sd"), (66, "sd"), (67, "sd"), (128, "sd"), (135, "sd"),
              (253, "device-mapper"), (254, "mdp"), (259, "blkext")]
DYN_EXT_START = 511  # CHRDEV_MAJOR_DYN_EXT_START: the 234..254 range is full on this host


def norm(name):
    return name.strip().replace("-", "_")


def _st_kernel(st):
    return st.setdefault("kernel", {})


def _st_mods(st):
    m = st.setdefault("modules", {})
    m.setdefault("loaded", [])
    m.setdefault("params", {})
    m.setdefault("available", {})
    m.setdefault("refcnt", {})
    return m


def _st_pci(st):
    p = st.setdefault("pci", {})
    p.setdefault("devices", {})
    p.setdefault("drivers", {})
    return p


def release_of(st):
    return _st_kernel(st).get("release")


def module_available(st, name, release=None):
    name = norm(name)
    release = release or release_of(st)
    if name not in MODULES:
        return False
    if release not in (_st_kernel(st).get("installed") or [release]):
        return False
    if MODULES[name].get("out_of_tree"):
        return name in ((_st_mods(st).get("available") or {}).get(release) or [])
    return True


def module_holders(st, name):
    """Loaded modules that depend on ``name`` (lsmod's "Used by")."""
    name = norm(name)
    return [m for m in _st_mods(st)["loaded"] if name in MODULES.get(m, {}).get("deps", [])]


def _gpu_users(st):
    n = 0
    for gpu in st.get("gpus") or []:
        n += len(gpu.get("processes") or [])
    pers = (st.get("nvidia") or {}).get("persistenced")
    if isinstance(pers, dict) and pers.get("pid"):
        n += 1
    return n


def module_refcnt(st, name):
    name = norm(name)
    n = len(module_holders(st, name)) + int(_st_mods(st)["refcnt"].get(name, 0))
    if name in ("nvidia", "nvidia_uvm"):
        n += _gpu_users(st)
    return n


def _alloc_dyn_major(st):
    used = {m for m, _ in CHAR_BASE} | set((st.get("majors") or {}).values())
    for maj in range(DYN_EXT_START, 383, -1):
        if maj not in used:
            return maj
    raise KernelError(errno.EBUSY, "no free char major")


def _register_driver(st, mod):
    info = MODULES[mod]
    if "pci" not in info:
        return None
    pci = _st_pci(st)
    seq = 1 + max([d.get("seq", 0) for d in pci["drivers"].values()] + [0])
    pci["drivers"][info["pci"]] = {"module": mod, "ids": copy.deepcopy(info["ids"]), "dynids": [], "seq": seq}
    return info["pci"]


def kmod_load(st, name=None, params=None, root=None):
    """Load module ``name`` (and its dependencies first), like modprobe's insmod step.

    Returns True if it was loaded now, False if it already was. ``params``: {param: value}.
    Compatibility form ``kmod_load("nvidia", root=R)`` takes the lock itself.
    """
    if isinstance(st, str):
        with modify(root) as real:
            return kmod_load(real, st, params=name if isinstance(name, dict) else params)
    name = norm(name)
    mods = _st_mods(st)
    if name in mods["loaded"]:
        return False
    release = release_of(st)
    if not module_available(st, name, release):
        raise KernelError(errno.ENOENT, "modprobe: FATAL: Module %s not found in directory /lib/modules/%s" % (name, release))
    info = MODULES[name]
    if info.get("out_of_tree") and _st_kernel(st).get("secure_boot") and not module_signature_ok(st, release)[0]:
        # kernel/module/signing.c module_sig_check(): with Secure Boot (lockdown) an unsigned module or one whose
        # signer is not in the trusted keyrings (builtin + platform/MOK) fails with -EKEYREJECTED; kmod's modprobe
        # prints "could not insert '%s': %s" with strerror (kmod tools/modprobe.c insmod error path)
        raise KernelError(errno.EKEYREJECTED, "modprobe: ERROR: could not insert '%s': Key was rejected by service" % name)
    for dep in info.get("deps", []):
        kmod_load(st, dep)
    saved = copy.deepcopy({k: st.get(k) for k in ("modules", "pci", "majors")})
    mods["loaded"].append(name)
    if params:
        mods["params"][name] = {str(k): str(v) for k, v in params.items()}
    else:
        mods["params"].pop(name, None)
    majors = st.setdefault("majors", {})
    for dyn in info.get("dyn", []):
        majors[dyn] = _alloc_dyn_major(st)
    drv = None if _pci_driver_suppressed(st, name) else _register_driver(st, name)
    if drv:
        if name == "vfio_pci":  # vfio_pci_fill_ids(): ids= become dynids (then driver_attach)
            for spec in (mods["params"].get(name, {}).get("ids") or "").split(","):
                entry = _parse_colon_id(spec)
                if entry is not None:
                    _st_pci(st)["drivers"][drv]["dynids"].append(entry)
        bound = _driver_attach(st, drv)
        if name == "nvidia" and not bound and not any(d.get("driver") == "nvidia" for d in _st_pci(st)["devices"].values()):
            for k, v in saved.items():  # NVRM: No NVIDIA GPU found. -> the module does not stay loaded
                st[k] = v
            raise KernelError(errno.ENODEV, "modprobe: ERROR: could not insert 'nvidia': No such device")
    return True


def _pci_driver_suppressed(st, name):
    """nouveau loaded with modeset=0 returns from its init before pci_register_driver()
    (drivers/gpu/drm/nouveau/nouveau_drm.c:1435-1446, v6.12): loaded, but it binds nothing."""
    return name == "nouveau" and (_st_mods(st)["params"].get(name) or {}).get("modeset") == "0"


def _parse_colon_id(spec):
    """vfio-pci ids= entry ``vendor:device[:subvendor[:subdevice[:class[:class_mask]]]]``."""
    parts = [p for p in spec.strip().split(":")]
    if len(parts) < 2 or not all(re.match(r"^[0-9a-fA-F]{1,8}$", p) for p in parts):
        return None
    vals = [int(p, 16) for p in parts] + [0xffffffff, 0xffffffff, 0, 0][len(parts) - 2:]
    v, d, sv, sd, c, m = vals[:6]
    return ["%04x" % v, "%04x" % d, "%04x" % sv if sv != 0xffffffff else ANY, "%04x" % sd if sd != 0xffffffff else ANY,
            "%06x" % c, "%06x" % m]


def kmod_unload(st, name=None, root=None):
    """rmmod ``name``: unbinds its devices, drops its driver (and dynids) and majors."""
    if isinstance(st, str):
        with modify(root) as real:
            return kmod_unload(real, st)
    name = norm(name)
    mods = _st_mods(st)
    if name not in mods["loaded"]:
        raise KernelError(errno.ENOENT, "rmmod: ERROR: Module %s is not currently loaded" % name)
    holders = module_holders(st, name)
    if holders:
        raise KernelError(errno.EBUSY, "rmmod: ERROR: Module %s is in use by: %s" % (name, " ".join(holders)))
    if module_refcnt(st, name):
        raise KernelError(errno.EBUSY, "rmmod: ERROR: Module %s is in use" % name)
    info = MODULES.get(name, {})
    drv = info.get("pci")
    pci = _st_pci(st)
    if drv:
        for dev in pci["devices"].values():
            if dev.get("driver") == drv:
                dev["driver"] = None
        pci["drivers"].pop(drv, None)
    for dyn in info.get("dyn", []):
        (st.get("majors") or {}).pop(dyn, None)
    mods["loaded"].remove(name)
    mods["params"].pop(name, None)
    mods["refcnt"].pop(name, None)


# --------------------------------------------------------------------------------------
# PCI core (drivers/pci/pci-driver.c, drivers/base/bus.c, dd.c)
# --------------------------------------------------------------------------------------

def _streq(text):
    """sysfs_streq(): the written text with one trailing newline ignored."""
    return text[:-1] if text.endswith("\n") else text


def _dev_by_name(st, text):
    return _st_pci(st)["devices"].get(_streq(text))


def _hex(v):
    return int(v, 16)


def _match_one(entry, dev):
    v, d, sv, sd, c, m = entry
    return ((v == ANY or _hex(v) == _hex(dev["vendor"])) and (d == ANY or _hex(d) == _hex(dev["device"]))
            and (sv == ANY or _hex(sv) == _hex(dev.get("subsystem_vendor", "0")))
            and (sd == ANY or _hex(sd) == _hex(dev.get("subsystem_device", "0")))
            and not ((_hex(c) ^ _hex(dev["class"])) & _hex(m)))


def _driver_table(st, drvname):
    d = _st_pci(st)["drivers"].get(drvname)
    if d is not None:
        return d
    if drvname in BUILTIN_DRIVERS:
        return {"module": None, "ids": BUILTIN_DRIVERS[drvname]["ids"], "dynids": [], "seq": 0}
    return None


def pci_match(st, drvname, bdf):
    """pci_match_device(): driver_override restricts to that driver; dynids, then static ids."""
    dev = _st_pci(st)["devices"].get(bdf)
    drv = _driver_table(st, drvname)
    if dev is None or drv is None:
        return False
    ovr = dev.get("driver_override")
    if ovr and ovr != drvname:
        return False
    if any(_match_one(e, dev) for e in drv["dynids"]) or any(_match_one(e, dev) for e in drv["ids"]):
        return True
    return bool(ovr)


def pci_driver_of(st, bdf):
    dev = _st_pci(st)["devices"].get(bdf)
    return dev.get("driver") if dev else None


def _drivers_in_order(st):
    drivers = _st_pci(st)["drivers"]
    return list(BUILTIN_DRIVERS) + sorted(drivers, key=lambda n: drivers[n].get("seq", 0))


def _device_attach(st, bdf):
    """device_attach(): first registered driver that matches; True if bound."""
    dev = _st_pci(st)["devices"][bdf]
    if dev.get("driver"):
        return True
    for drv in _drivers_in_order(st):
        if pci_match(st, drv, bdf):
            dev["driver"] = drv
            return True
    return False


def _driver_attach(st, drvname):
    """driver_attach(): bind every unbound device the driver matches; returns how many."""
    n = 0
    for bdf in sorted(_st_pci(st)["devices"]):
        dev = _st_pci(st)["devices"][bdf]
        if not dev.get("driver") and pci_match(st, drvname, bdf):
            dev["driver"] = drvname
            n += 1
    return n


def _need_driver(st, drvname):
    if _driver_table(st, drvname) is None:
        raise KernelError(errno.ENOENT, "no such driver %s" % drvname)
    return _driver_table(st, drvname)


def pci_bind(st, drvname, text):
    _need_driver(st, drvname)
    bdf = _streq(text)
    dev = _dev_by_name(st, text)
    if dev is None or not pci_match(st, drvname, bdf):
        raise KernelError(errno.ENODEV, "No such device")
    if dev.get("driver"):
        raise KernelError(errno.EBUSY, "Device or resource busy")
    dev["driver"] = drvname


def pci_unbind(st, drvname, text):
    _need_driver(st, drvname)
    dev = _dev_by_name(st, text)
    if dev is None or dev.get("driver") != drvname:
        raise KernelError(errno.ENODEV, "No such device")
    dev["driver"] = None


def pci_probe(st, text):
    """drivers_probe: ENODEV for an unknown device; a bound device or no match is success."""
    bdf = _streq(text)
    if _dev_by_name(st, text) is None:
        raise KernelError(errno.ENODEV, "No such device")
    _device_attach(st, bdf)


_HEX_FIELD = re.compile(r"\s*([+-]?(?:0[xX])?[0-9a-fA-F]+)")


def _sscanf_hex(text, maxfields):
    """sscanf(buf, "%x %x ...") : the fields converted before the first mismatch."""
    out, pos = [], 0
    while len(out) < maxfields:
        m = _HEX_FIELD.match(text, pos)
        if not m:
            break
        tok = m.group(1)
        neg = tok.startswith("-")
        tok = tok.lstrip("+-")
        if tok[:2].lower() == "0x":
            tok = tok[2:]
            if not tok:
                break
        val = int(tok, 16) & 0xffffffff
        out.append((-val) & 0xffffffff if neg else val)
        pos = m.end()
    return out


def _entry_from_fields(f):
    v, d = f[0], f[1]
    sv = f[2] if len(f) > 2 else 0xffffffff
    sd = f[3] if len(f) > 3 else 0xffffffff
    c = f[4] if len(f) > 4 else 0
    m = f[5] if len(f) > 5 else 0

    def h(x, w):
        return ANY if x == 0xffffffff else "%0*x" % (w, x)
    return [h(v, 4), h(d, 4), h(sv, 4), h(sd, 4), "%06x" % c, "%06x" % m]


def pci_new_id(st, drvname, text):
    drv = _need_driver(st, drvname)
    f = _sscanf_hex(text, 7)
    if len(f) < 2:
        raise KernelError(errno.EINVAL, "Invalid argument")
    entry = _entry_from_fields(f)
    if len(f) != 7:  # "Only accept driver_data values that match an existing id_table entry" / EEXIST check
        probe = {"vendor": "%x" % f[0], "device": "%x" % f[1], "subsystem_vendor": "%x" % (f[2] if len(f) > 2 else 0xffffffff),
                 "subsystem_device": "%x" % (f[3] if len(f) > 3 else 0xffffffff), "class": "%x" % (f[4] if len(f) > 4 else 0)}
        if any(_match_one(e, probe) for e in drv["dynids"] + drv["ids"]):
            raise KernelError(errno.EEXIST, "File exists")
    if drvname in BUILTIN_DRIVERS:
        raise KernelError(errno.EINVAL, "Invalid argument")
    drv["dynids"].append(entry)
    _driver_attach(st, drvname)


def pci_remove_id(st, drvname, text):
    drv = _need_driver(st, drvname)
    f = _sscanf_hex(text, 6)
    if len(f) < 2:
        raise KernelError(errno.EINVAL, "Invalid argument")
    v, d = f[0], f[1]
    sv = f[2] if len(f) > 2 else 0xffffffff
    sd = f[3] if len(f) > 3 else 0xffffffff
    c = f[4] if len(f) > 4 else 0
    m = f[5] if len(f) > 5 else 0
    for e in list(drv["dynids"]):
        ev = 0xffffffff if e[0] == ANY else _hex(e[0])
        ed = 0xffffffff if e[1] == ANY else _hex(e[1])
        esv = 0xffffffff if e[2] == ANY else _hex(e[2])
        esd = 0xffffffff if e[3] == ANY else _hex(e[3])
        if ev == v and ed == d and (sd == 0xffffffff or esd == sd) and (sv == 0xffffffff or esv == sv) and not ((_hex(e[4]) ^ c) & m):
            drv["dynids"].remove(e)
            return
    raise KernelError(errno.ENODEV, "No such device")


def pci_set_override(st, bdf, text):
    dev = _st_pci(st)["devices"].get(bdf)
    if dev is None:
        raise KernelError(errno.ENOENT, "No such file or directory")
    if len(text) >= 4095:
        raise KernelError(errno.EINVAL, "Invalid argument")
    val = text.split("\n", 1)[0]
    dev["driver_override"] = val or None


# --------------------------------------------------------------------------------------
# modprobe configuration and boot
# --------------------------------------------------------------------------------------

def _conf_files(root):
    out = {}
    for d in ("lib/modprobe.d", "etc/modprobe.d"):
        for p in sorted(glob.glob(os.path.join(_root(root), d, "*.conf"))):
            out[os.path.basename(p)] = p  # /etc overrides /lib by file name
    return [out[k] for k in sorted(out)]


def read_modprobe_conf(root=None, files=None):
    """Parse modprobe.d: {"options": {mod: {p: v}}, "blacklist": [mod], "softdep": {mod: {"pre": [], "post": []}},
    "install": {mod: cmd}, "remove": {mod: cmd}, "alias": {alias: mod}}. ``files``: {path: text} (an initramfs copy)."""
    conf = {"options": {}, "blacklist": [], "softdep": {}, "install": {}, "remove": {}, "alias": {}}
    if files is None:
        files = {}
        for p in _conf_files(root):
            try:
                with open(p) as f:
                    files[p] = f.read()
            except OSError:
                pass
    for path in sorted(files, key=os.path.basename):
        if not path.endswith(".conf"):
            continue
        text = files[path].replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            words = line.split()
            cmd, args = words[0], words[1:]
            if cmd == "options" and args:
                opts = conf["options"].setdefault(norm(args[0]), {})
                for a in args[1:]:
                    k, _, v = a.partition("=")
                    opts[k] = v
            elif cmd == "blacklist" and args:
                conf["blacklist"].append(norm(args[0]))
            elif cmd == "softdep" and args:
                sd = conf["softdep"].setdefault(norm(args[0]), {"pre": [], "post": []})
                where = None
                for a in args[1:]:
                    if a in ("pre:", "post:"):
                        where = a[:-1]
                    elif where:
                        sd[where].append(norm(a))
            elif cmd in ("install", "remove") and len(args) >= 2:
                conf[cmd][norm(args[0])] = " ".join(args[1:])
            elif cmd == "alias" and len(args) >= 2:
                conf["alias"][args[0]] = norm(args[1])
    return conf


def _cmdline_params(cmdline):
    """``mod.param=value`` tokens and ``modprobe.blacklist=`` from a kernel command line."""
    params, blacklist = {}, []
    for tok in (cmdline or "").split():
        key, eq, val = tok.partition("=")
        if key == "modprobe.blacklist":
            blacklist += [norm(x) for x in val.split(",") if x]
        elif "." in key and eq:
            mod, _, p = key.partition(".")
            params.setdefault(norm(mod), {})[p] = val
    return params, blacklist


_FALSE_CMDS = {"/bin/false", "/usr/bin/false", "false", "/bin/true", "/usr/bin/true", "true"}


def modprobe(st, name, root=None, params=None, remove=False, alias=False, conf=None):
    """modprobe [-r] NAME: softdeps (pre, the module, post), options from modprobe.d and the cmdline.

    ``alias=True`` is udev's alias probing: blacklisted modules are skipped (returns []).
    Explicit loads ignore ``blacklist`` (as kmod does). Returns the modules loaded/removed now.
    """
    name = norm(conf["alias"].get(name, name) if conf else name)
    if conf is None:
        conf = read_modprobe_conf(root)
        conf["alias"] = conf.get("alias", {})
        name = norm(conf["alias"].get(name, name))
    cmd_params, cmd_black = _cmdline_params(_st_kernel(st).get("cmdline", ""))
    done = []
    if remove:
        if name not in _st_mods(st)["loaded"]:
            if name not in MODULES:
                raise KernelError(errno.ENOENT, "modprobe: FATAL: Module %s not found." % name)
            return done
        if name in conf["remove"] and conf["remove"][name].split()[0] in _FALSE_CMDS:
            if conf["remove"][name].split()[0].endswith("false"):
                raise KernelError(errno.EPERM, "modprobe: ERROR: Error running remove command '%s' for module %s: retcode 1"
                                  % (conf["remove"][name], name))
            return done
        holders = module_holders(st, name)
        if holders:
            raise KernelError(errno.EBUSY, "modprobe: FATAL: Module %s is in use." % name)
        if module_refcnt(st, name):
            raise KernelError(errno.EBUSY, "modprobe: FATAL: Module %s is in use." % name)
        kmod_unload(st, name)
        done.append(name)
        for dep in MODULES.get(name, {}).get("deps", []):  # -r also removes now-unused dependencies
            if dep in _st_mods(st)["loaded"] and not module_refcnt(st, dep):
                try:
                    done += modprobe(st, dep, root, remove=True, conf=conf)
                except KernelError:
                    pass
        return done
    if alias and (name in conf["blacklist"] or name in cmd_black):
        return done
    if name in cmd_black and not alias:
        pass  # modprobe.blacklist= behaves like blacklist: explicit loads still work
    if name in _st_mods(st)["loaded"]:
        return done
    if name in conf["install"]:
        first = conf["install"][name].split()[0]
        if first in _FALSE_CMDS:
            if first.endswith("false"):
                raise KernelError(errno.EPERM, "modprobe: ERROR: Error running install command '%s' for module %s: retcode 1"
                                  % (conf["install"][name], name))
            return done
    if not module_available(st, name):
        raise KernelError(errno.ENOENT, "modprobe: FATAL: Module %s not found in directory /lib/modules/%s" % (name, release_of(st)))
    sd = conf["softdep"].get(name, {"pre": [], "post": []})
    for pre in sd["pre"]:
        try:
            done += modprobe(st, pre, root, conf=conf)
        except KernelError:
            pass
    opts = dict(conf["options"].get(name, {}))
    opts.update(cmd_params.get(name, {}))
    opts.update(params or {})
    for dep in MODULES[name].get("deps", []):
        if dep not in _st_mods(st)["loaded"]:
            dopts = dict(conf["options"].get(dep, {}))
            dopts.update(cmd_params.get(dep, {}))
            if kmod_load(st, dep, dopts or None):
                done.append(dep)
    if kmod_load(st, name, opts or None):
        done.append(name)
    for post in sd["post"]:
        try:
            done += modprobe(st, post, root, conf=conf)
        except KernelError:
            pass
    return done


def _read(root, rel):
    try:
        with open(_p(root, rel)) as f:
            return f.read()
    except OSError:
        return None


def uses_proxmox_boot_tool(root=None):
    return os.path.exists(_p(root, "etc/kernel/proxmox-boot-uuids"))


def grub_cmdline_from_files(root=None):
    text = _read(root, "etc/default/grub") or ""
    for p in sorted(glob.glob(_p(root, "etc/default/grub.d/*.cfg"))):
        text += "\n" + (open(p).read())
    vals = {"GRUB_CMDLINE_LINUX": "", "GRUB_CMDLINE_LINUX_DEFAULT": ""}
    for line in text.splitlines():
        m = re.match(r'^\s*(GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=(["\']?)(.*)\2\s*$', line)
        if m:
            vals[m.group(1)] = m.group(3).replace("$" + m.group(1), vals[m.group(1)]).replace(
                "${%s}" % m.group(1), vals[m.group(1)]).strip()
    return ("root=ZFS=rpool/ROOT/pve-1 boot=zfs ro %s %s" % (vals["GRUB_CMDLINE_LINUX"], vals["GRUB_CMDLINE_LINUX_DEFAULT"])).split()


def boot_refresh(st, root=None):
    """proxmox-boot-tool refresh: copy /etc/kernel/cmdline (systemd-boot) or the GRUB config to the ESPs."""
    b = st.setdefault("boot", {})
    if uses_proxmox_boot_tool(root):
        b["esp_cmdline"] = " ".join((_read(root, "etc/kernel/cmdline") or "").split())
    b["grub_cmdline"] = " ".join(grub_cmdline_from_files(root))
    b["esp_refreshed"] = int(time.time())


def update_grub(st, root=None):
    b = st.setdefault("boot", {})
    b["grub_cmdline"] = " ".join(grub_cmdline_from_files(root))
    if uses_proxmox_boot_tool(root):  # update-grub on such hosts also refreshes the ESPs
        boot_refresh(st, root)


INITRAMFS_GLOBS = ["etc/modprobe.d/*.conf", "lib/modprobe.d/*.conf", "etc/initramfs-tools/modules", "etc/modules"]


def initramfs_update(st, root=None, releases=None):
    """update-initramfs -u [-k REL|all]: snapshot the modprobe configuration into each initramfs."""
    k = _st_kernel(st)
    releases = releases or [sorted(k.get("installed") or [k.get("release")], key=_relkey)[-1]]
    files = {}
    for g in INITRAMFS_GLOBS:
        for p in sorted(glob.glob(_p(root, g))):
            try:
                with open(p) as f:
                    files["/" + os.path.relpath(p, _root(root))] = f.read()
            except OSError:
                pass
    ird = st.setdefault("boot", {}).setdefault("initramfs", {})
    for rel in releases:
        ird[rel] = {"files": files, "updated": int(time.time())}
    if uses_proxmox_boot_tool(root):
        boot_refresh(st, root)


def _relkey(rel):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.-]", rel or "")]


def boot_cmdline(st, root=None, release=None):
    release = release or release_of(st)
    b = st.get("boot") or {}
    if uses_proxmox_boot_tool(root):
        rest = b.get("esp_cmdline") if b.get("esp_cmdline") is not None else " ".join((_read(root, "etc/kernel/cmdline") or "").split())
        return "initrd=\\EFI\\proxmox\\%s\\initrd.img-%s %s" % (release, release, rest)
    rest = b.get("grub_cmdline") or " ".join(grub_cmdline_from_files(root))
    return "BOOT_IMAGE=/boot/vmlinuz-%s %s" % (release, rest)


def _etc_modules(root):
    names = []
    texts = [_read(root, "etc/modules") or ""]
    for p in sorted(glob.glob(_p(root, "etc/modules-load.d/*.conf")) + glob.glob(_p(root, "usr/lib/modules-load.d/*.conf"))):
        texts.append(open(p).read())
    for text in texts:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith(";"):
                names.append(line.split()[0])
    return names


def boot(st, root=None, release=None):
    """Reboot the node into ``release`` (default: the running one).

    Runtime state is reset (modules, bindings, driver_override, dynids, majors, GPU
    processes, guests stopped). Then, as initramfs + udev + systemd-modules-load would:
    (1) udev coldplug in the initramfs: for each device, alias-probe the modules whose id
    table matches, with the modprobe configuration *as copied into that kernel's
    initramfs* by the last ``update-initramfs`` (blacklist applies; softdeps pull vfio-pci
    first, whose ids= then claims its devices); (2) /etc/modules and modules-load.d with
    the real root's /etc/modprobe.d; (3) coldplug again in the real root. Finally the
    plugins' ``on_boot`` hooks run (onboot guests).
    """
    k = _st_kernel(st)
    release = release or k.get("release")
    k["release"] = release
    if release not in k.setdefault("installed", []):
        k["installed"].append(release)
    k["cmdline"] = boot_cmdline(st, root, release)
    k["boots"] = int(k.get("boots", 0)) + 1
    k["booted_at"] = int(time.time())
    mods = _st_mods(st)
    mods["loaded"], mods["params"], mods["refcnt"] = [], {}, {}
    st["majors"] = {}
    pci = _st_pci(st)
    pci["drivers"] = {}
    for dev in pci["devices"].values():
        dev["driver"] = None
        dev["driver_override"] = None
    for gpu in st.get("gpus") or []:
        gpu["processes"] = []
        gpu["mem_used_mib"] = None
    nv = st.get("nvidia")
    if isinstance(nv, dict) and isinstance(nv.get("persistenced"), dict):
        nv["persistenced"]["pid"] = None
    for g in (st.get("guests") or {}).values():
        g["status"], g["pid"] = "stopped", None
        if "started" in g:
            g["started"] = None
    for bdf in sorted(pci["devices"]):  # built-in drivers (pcieport) bind first
        for drv in BUILTIN_DRIVERS:
            if pci_match(st, drv, bdf):
                pci["devices"][bdf]["driver"] = drv
                break
    initrd = ((st.get("boot") or {}).get("initramfs") or {}).get(release)
    early = read_modprobe_conf(root, files=initrd["files"]) if initrd else read_modprobe_conf(root)
    late = read_modprobe_conf(root)
    # initramfs-tools loads /etc/initramfs-tools/modules (as copied) before udev's coldplug
    ird_modules = initrd["files"].get("/etc/initramfs-tools/modules", "") if initrd else (_read(root, "etc/initramfs-tools/modules") or "")
    for line in ird_modules.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            try:
                modprobe(st, line.split()[0], root, conf=early)
            except KernelError:
                pass
    for conf in (early, None, late):
        if conf is None:
            for name in _etc_modules(root):
                try:
                    modprobe(st, name, root, conf=late)
                except KernelError:
                    pass
            continue
        # udev loads every module whose alias matches a device's "add" event, bound or not
        # (systemd rules.d/80-drivers.rules:5): with vfio-pci holding the A6000s, nouveau is still
        # loaded (and its PCI driver registered) unless blacklisted; the next probe gives it the GPUs.
        for bdf in sorted(pci["devices"]):
            dev = pci["devices"][bdf]
            for mod in sorted(MODULES):
                info = MODULES[mod]
                if "pci" in info and any(_match_one(e, dev) for e in info["ids"]) and module_available(st, mod):
                    try:
                        modprobe(st, mod, root, alias=True, conf=conf)
                    except KernelError:
                        pass
    for ns in _plugins(root):
        if callable(ns.get("on_boot")):
            ns["on_boot"](_root(root), st)


def module_signature_ok(st, release=None):
    """(ok, why): may the kernel load the out-of-tree (nvidia) module built for ``release`` under Secure Boot?

    The module must carry a signature (``nvidia.kernel_modules[rel].signed``) whose key is enrolled: its
    ``sig_key`` is in ``kernel.mok_enrolled`` (the MOK list, ``labctl mok-enroll`` / ``mokutil --import`` + reboot).
    A state without ``kernel.mok_enrolled`` (older labs, unit tests) trusts any signed module.
    """
    release = release or release_of(st)
    built = ((st.get("nvidia") or {}).get("kernel_modules") or {}).get(release) or {}
    if not built.get("signed"):
        return False, "the module for %s is not signed" % release
    enrolled = _st_kernel(st).get("mok_enrolled")
    if enrolled is None:
        return True, "signed"
    keys = {(k.get("sig_key") or "").upper() for k in enrolled if isinstance(k, dict)}
    if (built.get("sig_key") or "").upper() in keys:
        return True, "signed by the enrolled key %s" % built.get("signer")
    return False, "the module for %s is signed by %s (%s), which is not an enrolled key" % (
        release, built.get("signer"), built.get("sig_key"))


def register_kernel(st, release):
    """The kernel package's files are on disk (its postinst, before the postinst.d hooks run)."""
    k = _st_kernel(st)
    if release not in k.setdefault("installed", []):
        k["installed"].append(release)
    k["installed"].sort(key=_relkey)


def unregister_kernel(st, release):
    k = _st_kernel(st)
    k["installed"] = [r for r in k.get("installed") or [] if r != release]
    k["headers"] = [r for r in k.get("headers") or [] if r != release]


PIN_FILE = "etc/kernel/proxmox-boot-pin"
NEXT_BOOT_PIN = "etc/kernel/next-boot-pin"
MANUAL_KERNELS = "etc/kernel/proxmox-boot-manual-kernels"


def boot_kernels(st, root=None):
    """(manual, automatic, pinned, next_boot) as proxmox-boot-tool reads them (proxmox-kernel-helper
    src/proxmox-boot-tool: MANUAL_KERNEL_LIST, PINNED_KERNEL_CONF, NEXT_BOOT_PIN). Automatic: the installed
    kernels (the real list keeps the running, the newest and the previous one of each series; the lab keeps
    all installed)."""
    manual = [w for w in (_read(root, MANUAL_KERNELS) or "").split() if w]
    auto = sorted(_st_kernel(st).get("installed") or [], key=_relkey)
    pinned = (_read(root, PIN_FILE) or "").strip() or None
    nxt = (_read(root, NEXT_BOOT_PIN) or "").strip() or None
    return manual, auto, pinned, nxt


def next_boot_release(st, root=None):
    """The kernel the boot loader starts next: the next-boot pin, then the pin, then the newest kernel
    (systemd-boot/GRUB sort the entries by version, newest first)."""
    manual, auto, pinned, nxt = boot_kernels(st, root)
    avail = set(manual) | set(auto)
    for rel in (nxt, pinned):
        if rel and rel in avail:
            return rel
    return sorted(avail, key=_relkey)[-1] if avail else release_of(st)


def install_kernel(st, release, root=None, headers=False):
    """A kernel package install: /lib/modules/<rel>, its initramfs (current modprobe.d), the ESP refresh."""
    k = _st_kernel(st)
    if release not in k.setdefault("installed", []):
        k["installed"].append(release)
    if release not in k.setdefault("headers_available", []):
        k["headers_available"].append(release)
    if headers and release not in k.setdefault("headers", []):
        k["headers"].append(release)
    initramfs_update(st, root, [release])
    if not uses_proxmox_boot_tool(root):
        update_grub(st, root)


def next_release(release):
    m = re.match(r"^(\d+\.\d+\.\d+)-(\d+)-(.*)$", release)
    if not m:
        return release + "-1"
    return "%s-%d-%s" % (m.group(1), int(m.group(2)) + 1, m.group(3))


# --------------------------------------------------------------------------------------
# Rendered files (/proc overlay)
# --------------------------------------------------------------------------------------

def proc_devices(st):
    chars = list(CHAR_BASE)
    for mod in _st_mods(st)["loaded"]:
        chars += MODULES.get(mod, {}).get("chr", [])
    chars += [(v, k) for k, v in (st.get("majors") or {}).items()]
    chars.sort(key=lambda x: x[0])
    out = ["Character devices:"] + ["%3d %s" % c for c in chars] + ["", "Block devices:"] + ["%3d %s" % b for b in BLOCK_BASE]
    return "\n".join(out) + "\n"


def proc_modules(st):
    lines = []
    for i, mod in enumerate(reversed(_st_mods(st)["loaded"])):
        holders = module_holders(st, mod)
        lines.append("%s %d %d %s Live 0x0000000000000000%s" % (
            mod, MODULES.get(mod, {}).get("size", 16384), module_refcnt(st, mod),
            "".join(h + "," for h in holders) or "-", " (OE)" if MODULES.get(mod, {}).get("out_of_tree") else ""))
    return "\n".join(lines) + ("\n" if lines else "")


def proc_cmdline(st):
    return (_st_kernel(st).get("cmdline") or "") + "\n"


def proc_nvidia_version(st):
    """/proc/driver/nvidia/version while nvidia is loaded, else None."""
    if "nvidia" not in _st_mods(st)["loaded"]:
        return None
    built = ((st.get("nvidia") or {}).get("kernel_modules") or {}).get(release_of(st)) or {}
    inst = (st.get("nvidia") or {}).get("installed") or {}
    version = built.get("version") or inst.get("version") or "580.126.09"
    if (built.get("type") or inst.get("kernel_module_type")) in ("open", "kernel-open"):
        head = "NVIDIA UNIX Open Kernel Module for x86_64"
    else:
        head = "NVIDIA UNIX x86_64 Kernel Module"
    return ("NVRM version: %s  %s  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Wed Jan  7 22:33:56 UTC 2026\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n" % (head, version))


# --------------------------------------------------------------------------------------
# The seed hardware (kpro5)
# --------------------------------------------------------------------------------------

def _dev(vendor, device, cls, sv, sd, group, path, rev="00", numa=0, label=""):
    return {"vendor": vendor, "device": device, "class": cls, "subsystem_vendor": sv, "subsystem_device": sd, "revision": rev,
            "iommu_group": group, "numa_node": numa, "path": path, "driver": None, "driver_override": None, "label": label}


def initial_devices():
    return {
        "0000:00:14.0": _dev("8086", "a36d", "0c0330", "15d9", "1c48", 18, "pci0000:00", "10", 0, "Cannon Lake PCH USB 3.1 xHCI"),
        "0000:00:17.0": _dev("8086", "a182", "010601", "15d9", "1c48", 20, "pci0000:00", "10", 0, "C620 Series SATA Controller [AHCI mode]"),
        "0000:00:1f.3": _dev("8086", "a348", "040300", "15d9", "1c48", 22, "pci0000:00", "10", 0, "Cannon Lake PCH cAVS"),
        "0000:03:00.0": _dev("8086", "1533", "020000", "15d9", "1533", 14, "pci0000:00/0000:00:1c.0", "03", 0, "I210 Gigabit Network"),
        "0000:04:00.0": _dev("1b21", "1242", "0c0330", "1b21", "1242", 12, "pci0000:00/0000:00:1c.4", "00", 0,
                             "ASM1142 USB 3.1 Host Controller"),
        "0000:16:00.0": _dev("8086", "2030", "060400", "15d9", "1c48", 26, "pci0000:16", "04", 0, "Sky Lake-E PCI Express Root Port A"),
        "0000:17:00.0": _dev("10de", "2230", "030000", "10de", "1459", 27, "pci0000:16/0000:16:00.0", "a1", 0, "GA102GL [RTX A6000]"),
        "0000:17:00.1": _dev("10de", "1aef", "040300", "10de", "1459", 27, "pci0000:16/0000:16:00.0", "a1", 0, "GA102 HD Audio Controller"),
        "0000:64:00.0": _dev("8086", "2030", "060400", "15d9", "1c48", 74, "pci0000:64", "04", 0, "Sky Lake-E PCI Express Root Port A"),
        "0000:65:00.0": _dev("10de", "2230", "030000", "10de", "1459", 75, "pci0000:64/0000:64:00.0", "a1", 0, "GA102GL [RTX A6000]"),
        "0000:65:00.1": _dev("10de", "1aef", "040300", "10de", "1459", 75, "pci0000:64/0000:64:00.0", "a1", 0, "GA102 HD Audio Controller"),
    }


def initial_state(release="6.8.12-9-pve"):
    """The node's state before its first boot; labctl seeds it and then calls boot()."""
    return {
        "schema": 1,
        "node": "kpro5",
        "kernel": {"release": release, "installed": ["6.8.12-4-pve", release], "headers": [],
                   "headers_available": ["6.8.12-4-pve", release], "secure_boot": False, "efi": True, "cmdline": "", "boots": 0},
        "modules": {"loaded": [], "params": {}, "available": {}, "refcnt": {}},
        "pci": {"devices": initial_devices(), "drivers": {}},
        "majors": {},
        "boot": {},
        "nvidia": {"installed": None, "persistenced": None},
        # The "hardware" NVML reports once the nvidia driver binds the boards (index order = PCI order).
        "gpus": [{"bdf": bdf, "name": "NVIDIA RTX A6000", "uuid": uuid, "mem_total_mib": 49140, "mem_reserved_mib": 4,
                  "mem_used_mib": None, "processes": []}
                 for bdf, uuid in (("0000:17:00.0", "GPU-3c1f0b6e-9a4d-5f7e-8b21-6d0e4a7c9f10"),
                                   ("0000:65:00.0", "GPU-8e2a7d41-0c5b-4f3a-9e66-b17f2c58d3a4"))],
        "guests": {"105": {"type": "qemu", "status": "running", "pid": None},
                   "110": {"type": "qemu", "status": "stopped", "pid": None},
                   "129": {"type": "lxc", "status": "running", "pid": None}},
    }


try:  # the NVIDIA stack's renderer (nvml.conf for the fake libnvidia-ml), next to this file
    import nvml_render as _nvml_render
    register_renderer(_nvml_render.render)
except ImportError:
    _nvml_render = None
