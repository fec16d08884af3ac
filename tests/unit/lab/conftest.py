"""Fixtures for the lab's simulated NVIDIA stack (no lab, no root needed)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LAB = os.path.join(REPO, "tests", "lab")
LABLIB = os.path.join(LAB, "rootfs", "usr", "lib", "kpro-lab")
VERSION = "580.126.09"
RELEASE = "6.8.12-9-pve"
NEW_RELEASE = "6.8.12-11-pve"
UUIDS = ["GPU-5c1b9f2e-7d3a-4e61-9a0b-2f4c8d1e6a01", "GPU-8e2d4a6c-1b3f-4c5d-8e7f-9a0b1c2d3e02"]

for _d in (LABLIB, LAB):
    if _d not in sys.path:
        sys.path.insert(0, _d)


def lablib(name):
    """Import a module of the node's /usr/lib/kpro-lab without leaving __pycache__ in the rootfs source."""
    import importlib
    old, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        return importlib.import_module(name)
    finally:
        sys.dont_write_bytecode = old


def have_gcc():
    return shutil.which("gcc") is not None


@pytest.fixture(scope="session")
def nvbuild(tmp_path_factory):
    """Compile the fake libnvidia-ml and build the .run (as build.d/10-nvml.sh does)."""
    if not have_gcc():
        pytest.skip("gcc is needed to build the fake libnvidia-ml.so.1")
    out = tmp_path_factory.mktemp("nvbuild")
    lib = out / "libnvidia-ml.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(lib),
                    os.path.join(LAB, "nvml", "fakenvml.c"), "-ldl"], check=True)
    # as the installer lays it out: libnvidia-ml.so.<version> + the .so.1 symlink
    libdir = out / "lib"
    libdir.mkdir()
    shutil.copy(str(lib), str(libdir / ("libnvidia-ml.so." + VERSION)))
    os.symlink("libnvidia-ml.so." + VERSION, str(libdir / "libnvidia-ml.so.1"))
    run = out / ("NVIDIA-Linux-x86_64-%s.run" % VERSION)
    subprocess.run([sys.executable, os.path.join(LAB, "nvidia", "build_run.py"), "--lib", str(lib), "--out", str(run),
                    "--version", VERSION], check=True, stdout=subprocess.DEVNULL)
    other = out / "NVIDIA-Linux-x86_64-580.159.run"
    subprocess.run([sys.executable, os.path.join(LAB, "nvidia", "build_run.py"), "--lib", str(lib), "--out", str(other),
                    "--version", "580.159"], check=True, stdout=subprocess.DEVNULL)
    return {"dir": out, "lib": lib, "libdir": libdir, "run": run, "run_other": other}


def base_state():
    """kpro5 after the vfio release: two A6000 + their HDMI audio functions, no NVIDIA driver."""
    devices = {}
    for bus in ("01", "02"):
        devices["0000:%s:00.0" % bus] = {"vendor": "0x10de", "device": "0x2230", "subsystem_vendor": "0x10de",
                                         "subsystem_device": "0x1459", "class": "0x030000", "iommu_group": int(bus),
                                         "driver": None, "driver_override": None}
        devices["0000:%s:00.1" % bus] = {"vendor": "0x10de", "device": "0x1aef", "subsystem_vendor": "0x10de",
                                         "subsystem_device": "0x1459", "class": "0x040300", "iommu_group": int(bus),
                                         "driver": "snd_hda_intel", "driver_override": None}
    return {
        "kernel": {"release": RELEASE, "installed": [RELEASE, NEW_RELEASE], "headers": [RELEASE],
                   "headers_available": [RELEASE, NEW_RELEASE], "secure_boot": False, "cmdline": "BOOT_IMAGE=/vmlinuz"},
        "modules": {"loaded": ["snd_hda_intel"], "available": {}},
        "pci": {"devices": devices, "drivers": {}},
        "nvidia": {"installed": None, "persistenced": None},
        "gpus": [{"bdf": "0000:%s:00.0" % bus, "name": "NVIDIA RTX A6000", "uuid": UUIDS[i], "mem_total_mib": 49140,
                  "mem_reserved_mib": 390, "mem_used_mib": None, "processes": []} for i, bus in enumerate(("01", "02"))],
        "majors": {"nvidia-uvm": 509, "nvidia-caps": 510},
        "guests": {},
    }


class Root(object):
    """A temp node root: labstate + the NVIDIA fakes, a state.json, KPRO_LAB_ROOT pointing at it."""

    def __init__(self, path, build):
        self.path = str(path)
        self.build = build
        for rel in ("usr/lib/kpro-lab", "var/lib/kpro-lab", "var/log", "dev", "usr/sbin", "usr/bin", "usr/local/sbin",
                    "etc/systemd/system", "lib/systemd/system"):
            os.makedirs(os.path.join(self.path, rel), exist_ok=True)
        for name in os.listdir(LABLIB):
            if name.endswith(".py"):
                shutil.copy(os.path.join(LABLIB, name), os.path.join(self.path, "usr/lib/kpro-lab", name))
        shutil.copy(os.path.join(LAB, "rootfs", "usr/bin/systemctl"), os.path.join(self.path, "usr/bin/systemctl"))
        self.install_dkms()

    def install_dkms(self):
        """The dkms package installed: the lab's stand-in where the real one goes (fakes/install-fakes)."""
        shutil.copy(os.path.join(LABLIB, "fakes", "dkms"), self.p("/usr/sbin/dkms"))

    def install_headers(self, release):
        """What the lab's proxmox-headers-<release> package does (tests/lab/aptrepo.py): files, link, state."""
        aptrepo = lablib("aptrepo")
        for rel, text in aptrepo.header_files(release).items():
            os.makedirs(os.path.dirname(self.p(rel)), exist_ok=True)
            with open(self.p(rel), "w") as f:
                f.write(text)
        os.makedirs(self.p("/lib/modules/%s" % release), exist_ok=True)
        os.symlink("/usr/src/linux-headers-%s" % release, self.p("/lib/modules/%s/build" % release))
        with self.modify() as st:
            st["kernel"].setdefault("headers", []).append(release)

    def p(self, rel):
        return os.path.join(self.path, rel.lstrip("/"))

    def env(self, **extra):
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        env.update({"KPRO_LAB_ROOT": self.path, "FAKE_NVML_CONFIG": self.p("/var/lib/kpro-lab/nvml.conf"),
                    "LD_LIBRARY_PATH": self.p("/usr/lib/x86_64-linux-gnu"), "KPRO_LAB_PYTHON": os.environ.get("KPRO_LAB_TEST_PYTHON", sys.executable),
                    "PYTHONDONTWRITEBYTECODE": "1"})
        env.update(extra)
        return env

    def labstate(self):
        labstate = lablib("labstate")
        nvml_render = lablib("nvml_render")
        if nvml_render.render not in labstate._RENDERERS:
            labstate.register_renderer(nvml_render.render)
        return labstate

    def save(self, state):
        self.labstate().save(state, self.path)

    def state(self):
        with open(self.p("/var/lib/kpro-lab/state.json")) as f:
            return json.load(f)

    def modify(self):
        return self.labstate().modify(self.path)

    def run(self, argv, **kw):
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, cwd=self.path, check=False, **kw)

    def installer(self, *args, run=None):
        return self.run(["sh", str(run or self.build["run"])] + list(args))

    def tool(self, rel, *args):
        return self.run([sys.executable, self.p(rel)] + list(args))

    def nvml(self, code):
        """Run ``code`` with the real pynvml in a subprocess seeing this root's library and nvml.conf."""
        prog = "import json, pynvml\nout = {}\ntry:\n" + "".join("    " + ln + "\n" for ln in code.splitlines()) + \
               "except pynvml.NVMLError as e:\n    out['error'] = type(e).__name__\nprint(json.dumps(out))\n"
        r = self.run([sys.executable, "-c", prog])
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def root(tmp_path, nvbuild):
    r = Root(tmp_path / "root", nvbuild)
    r.save(base_state())
    return r
