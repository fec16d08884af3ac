"""Shared helpers of the lab's NVIDIA driver fakes (installer, dkms, nvidia-modprobe,
nvidia-persistenced). Standard library only.

On the node this file is /usr/lib/kpro-lab/nvlab.py, next to labstate.py. The installer
stand-in (.run) also carries a copy, so that in a container (no labstate, no lab state)
``--no-kernel-modules`` works with only what the .run ships.

All paths are relative to ``root()``: ``$KPRO_LAB_ROOT`` or ``/`` (as labstate).

State keys this module writes (see tests/lab/README.md for the rest):
- ``nvidia.kernel_modules[release]`` = {version, type, signed, dkms}: the nvidia module
  built for a kernel (what ``modinfo -F version nvidia`` would say for that kernel);
- ``modules.available[release]`` += nvidia, nvidia_uvm, nvidia_modeset, nvidia_drm,
  nvidia_peermem: modules modprobe can load for that kernel (helpers
  :func:`mark_built` / :func:`unmark_built` are the only places that know this shape).
"""

import contextlib
import importlib
import json
import os
import stat
import sys

NVIDIA_MODULES = ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem"]
KO_FILES = ["nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko", "nvidia-peermem.ko"]
NVIDIA_MAJOR = 195
DEFAULT_MAJORS = {"nvidia-uvm": 511, "nvidia-caps": 510}


class KmodError(Exception):
    """A module load/unload refused, with modprobe/rmmod's message."""


def root():
    return os.environ.get("KPRO_LAB_ROOT", "/")


def path(p):
    return os.path.join(root(), p.lstrip("/"))


def lab_dir():
    return path("/usr/lib/kpro-lab")


_LABSTATE = []


def labstate():
    """The node's labstate module (with the NVML renderer registered), or None (container)."""
    if _LABSTATE:
        return _LABSTATE[0]
    mod = None
    if os.path.exists(os.path.join(lab_dir(), "labstate.py")) and os.path.exists(path(labstate_rel())):
        if lab_dir() not in sys.path:
            sys.path.insert(0, lab_dir())
        mod = importlib.import_module("labstate")
        try:
            nvml_render = importlib.import_module("nvml_render")
            renderers = getattr(mod, "_RENDERERS", None)
            if renderers is not None and not any(getattr(f, "__module__", "") == "nvml_render" for f in renderers):
                mod.register_renderer(nvml_render.render)
        except ImportError:
            pass
    _LABSTATE.append(mod)
    return mod


def labstate_rel():
    return "/var/lib/kpro-lab/state.json"


def has_state():
    return labstate() is not None


@contextlib.contextmanager
def modify():
    """``with modify() as st:`` through labstate (renderers run); a plain dict without state."""
    ls = labstate()
    if ls is None:
        yield {}
        return
    with ls.modify(root()) as st:
        yield st


def load():
    ls = labstate()
    return ls.load(root()) if ls is not None else {}


def running_release(st=None):
    """The running kernel: the state's kernel.release, then the node's /proc/sys/kernel/osrelease, then uname."""
    st = st if st is not None else load()
    rel = (st.get("kernel") or {}).get("release")
    if rel:
        return rel
    text = read("/proc/sys/kernel/osrelease")
    return text.strip() if text and text.strip() else os.uname()[2]


def headers_installed(st, release):
    return release in ((st.get("kernel") or {}).get("headers") or [])


# --- modules built per kernel -------------------------------------------------------

def mark_built(st, release, version, mtype, signed, dkms, sig=None):
    """``sig``: {signer, sig_key, sig_hashalgo} of the signing certificate (:func:`cert_info`), when signed."""
    nv = st.setdefault("nvidia", {})
    entry = {"version": version, "type": mtype, "signed": bool(signed), "dkms": bool(dkms)}
    if signed and sig:
        entry.update({k: sig.get(k) for k in ("signer", "sig_key", "sig_hashalgo")})
    nv.setdefault("kernel_modules", {})[release] = entry
    avail = st.setdefault("modules", {}).setdefault("available", {})
    have = avail.get(release) or []
    avail[release] = sorted(set(have) | set(NVIDIA_MODULES))


def unmark_built(st, release):
    (st.get("nvidia") or {}).get("kernel_modules", {}).pop(release, None)
    avail = (st.get("modules") or {}).get("available") or {}
    if release in avail:
        avail[release] = [m for m in avail[release] if m not in NVIDIA_MODULES]


def cert_info(cert_path, hashalgo="sha512"):
    """What ``modinfo`` shows of a module signed with this certificate: {signer: the subject's CN, sig_key: the
    certificate's serial number as colon-separated hex (the PKCS#7 signer identifier; kmod libkmod-signature.c
    prints it so), sig_hashalgo}. The certificate is DER (dkms's mok.pub, NVIDIA's --module-signing-public-key)
    or PEM; read with openssl. None when it is not a certificate."""
    import subprocess
    full = path(cert_path)
    for form in ("DER", "PEM"):
        try:
            r = subprocess.run(["openssl", "x509", "-inform", form, "-in", full, "-noout", "-subject", "-serial",
                                "-nameopt", "multiline"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               universal_newlines=True, check=False)
        except OSError:
            return None
        if r.returncode != 0:
            continue
        signer, serial = None, None
        for line in r.stdout.splitlines():
            line = line.strip()
            if line.startswith("commonName"):
                signer = line.split("=", 1)[1].strip()
            elif line.startswith("serial="):
                serial = line.split("=", 1)[1].strip()
        if serial:
            serial = serial if len(serial) % 2 == 0 else "0" + serial
            return {"signer": signer or "", "sig_key": ":".join(serial[i:i + 2] for i in range(0, len(serial), 2)).upper(),
                    "sig_hashalgo": hashalgo}
    return None


def ko_text(version, mtype, signed, sig=None):
    """The placeholder .ko: the fields modinfo (the lab's stand-in) shows."""
    text = "kpro-lab placeholder kernel module\nversion=%s\ntype=%s\nsigned=%d\n" % (version, mtype, 1 if signed else 0)
    if signed and sig:
        text += "signer=%s\nsig_key=%s\nsig_hashalgo=%s\n" % (sig.get("signer"), sig.get("sig_key"), sig.get("sig_hashalgo"))
    return text


def built_for(st, release):
    return ((st.get("nvidia") or {}).get("kernel_modules") or {}).get(release)


def loaded(st):
    return list((st.get("modules") or {}).get("loaded") or [])


# --- module load / unload ----------------------------------------------------------

def _norm(name):
    return name.replace("-", "_")


def _ls_kmod(op):
    ls = labstate()
    return getattr(ls, "kmod_" + op, None) if ls is not None else None


def kmod_load(name):
    """Load a module the way modprobe would (dependencies first). Raises KmodError."""
    name = _norm(name)
    fn = _ls_kmod("load")
    if fn is not None:
        try:
            _call_root(fn, name)
        except Exception as e:  # labstate reports refusals as exceptions
            raise KmodError(str(e))
        return
    with modify() as st:
        _fallback_load(st, name)


def kmod_unload(name):
    name = _norm(name)
    fn = _ls_kmod("unload")
    if fn is not None:
        try:
            _call_root(fn, name)
        except Exception as e:
            raise KmodError(str(e))
        return
    with modify() as st:
        _fallback_unload(st, name)


def _call_root(fn, name):
    try:
        import inspect
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "root" in params:
        return fn(name, root=root())
    return fn(name)


def _hexint(v):
    if isinstance(v, int):
        return v
    try:
        return int(str(v), 16)
    except (TypeError, ValueError):
        return -1


def _fallback_load(st, name):
    """Used only when labstate has no kmod_load (unit tests, or before lab core provides it)."""
    mods = st.setdefault("modules", {})
    ld = mods.setdefault("loaded", [])
    if name in ld:
        return
    release = running_release(st)
    if name.startswith("nvidia"):
        if name not in ((mods.get("available") or {}).get(release) or []):
            raise KmodError("modprobe: FATAL: Module %s not found in directory /lib/modules/%s" % (name, release))
        info = built_for(st, release) or {}
        if (st.get("kernel") or {}).get("secure_boot") and not info.get("signed"):
            raise KmodError("modprobe: ERROR: could not insert '%s': Key was rejected by service" % name)
    if name != "nvidia" and name.startswith("nvidia"):
        _fallback_load(st, "nvidia")
    if name == "nvidia":
        devices = (st.get("pci") or {}).get("devices") or {}
        bound = 0
        for bdf in sorted(devices):
            dev = devices[bdf]
            if _hexint(dev.get("vendor")) != 0x10de or not str(dev.get("class", "0x03")).lower().replace("0x", "").startswith("03"):
                continue
            if dev.get("driver") in (None, "nvidia") and dev.get("driver_override") in (None, "", "nvidia"):
                dev["driver"] = "nvidia"
                bound += 1
        if not bound:
            raise KmodError("modprobe: ERROR: could not insert 'nvidia': No such device")
        st.setdefault("pci", {}).setdefault("drivers", {})["nvidia"] = {"ids": [[0x10de, 0xffffffff]], "dynids": []}
        majors = st.setdefault("majors", {})
        majors.setdefault("nvidia-caps", DEFAULT_MAJORS["nvidia-caps"])
    if name == "nvidia_uvm":
        st.setdefault("majors", {}).setdefault("nvidia-uvm", DEFAULT_MAJORS["nvidia-uvm"])
    ld.append(name)


def in_use_by(st, name):
    """Why ``name`` cannot be unloaded ([] when it can)."""
    ld = loaded(st)
    users = []
    if name == "nvidia":
        users += [m for m in ("nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem") if m in ld]
    if name == "nvidia_modeset" and "nvidia_drm" in ld:
        users.append("nvidia_drm")
    return users


def gpu_users(st):
    """Processes holding a GPU (CUDA programs, nvidia-persistenced): the module's use count."""
    out = []
    for gpu in st.get("gpus") or []:
        out += [p.get("pid") for p in gpu.get("processes") or []]
    pers = (st.get("nvidia") or {}).get("persistenced") or {}
    if pers.get("pid"):
        out.append(pers["pid"])
    return out


def _fallback_unload(st, name):
    ld = loaded(st)
    if name not in ld:
        raise KmodError("rmmod: ERROR: Module %s is not currently loaded" % name)
    users = in_use_by(st, name)
    if users:
        raise KmodError("rmmod: ERROR: Module %s is in use by: %s" % (name, " ".join(users)))
    if name in ("nvidia", "nvidia_uvm") and gpu_users(st):
        raise KmodError("rmmod: ERROR: Module %s is in use" % name)
    st["modules"]["loaded"] = [m for m in ld if m != name]
    if name == "nvidia":
        for dev in ((st.get("pci") or {}).get("devices") or {}).values():
            if dev.get("driver") == "nvidia":
                dev["driver"] = None
        ((st.get("pci") or {}).get("drivers") or {}).pop("nvidia", None)


# --- device nodes ------------------------------------------------------------------

def majors():
    """Dynamic char majors from the node's /proc/devices, then the state."""
    out = {}
    try:
        with open(path("/proc/devices")) as f:
            chars = False
            for line in f:
                line = line.strip()
                if line.startswith("Character devices"):
                    chars = True
                elif line.startswith("Block devices"):
                    chars = False
                elif chars and line:
                    num, name = line.split(None, 1)
                    out.setdefault(name, int(num))
    except (IOError, OSError, ValueError):
        pass
    for k, v in (load().get("majors") or {}).items():
        out.setdefault(k, int(v))
    return out


def mknod_chr(p, major, minor, mode=0o666):
    """mknod like nvidia-modprobe (replacing a node with other numbers); returns True if created."""
    full = path(p)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    try:
        st = os.lstat(full)
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major and os.minor(st.st_rdev) == minor:
            return False
        os.unlink(full)
    except OSError:
        pass
    try:
        os.mknod(full, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(full, mode)
    except PermissionError:
        if root() == "/":
            raise
        with open(full, "w") as f:  # unprivileged unit test on a temp root: a marker
            f.write("c %d:%d\n" % (major, minor))
    return True


def write(p, text, mode=0o644):
    full = path(p)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    tmp = "%s.tmp.%d" % (full, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.rename(tmp, full)


def read(p):
    try:
        with open(path(p)) as f:
            return f.read()
    except (IOError, OSError):
        return None


def dumps(obj):
    return json.dumps(obj, indent=1, sort_keys=True)
