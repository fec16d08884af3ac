# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve stage's test lab: the real SGLang stand-in, the fake libnvidia-ml, the lab's systemctl.

No root, no lab up: a temporary KPRO_LAB_ROOT holds state.json (two RTX A6000 on the nvidia
driver) and the nvml.conf rendered from it by the lab's labstate/nvml_render (the stand-in writes
its GPU memory through labstate, so NVML sees it). The fake libnvidia-ml.so.1 is compiled once and
preloaded into this process, so the real pynvml the modules import talks to it. Every process a
test starts is ended by PID at teardown.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
LAB = os.path.join(REPO, "tests", "lab")
STANDIN = os.path.join(LAB, "sglang_standin")
LABLIB = os.path.join(LAB, "rootfs", "usr", "lib", "kpro-lab")
LAB_SYSTEMCTL_PY = os.path.join(LAB, "rootfs", "usr", "bin", "systemctl")
TOTAL = 49140
BASELINE = 300
TOTAL_SIZE = 55400000000
RELEASE = "6.8.12-9-pve"
MODEL_NAME = "qwen3.6-27b"
GOOD_OPTIONS = {"served_model_name": MODEL_NAME, "tp_size": 2, "context_length": 65536, "mem_fraction_static": 0.85,
                "max_running_requests": 16, "reasoning_parser": "qwen3"}     # the role's default for this model
QWEN36_TEXT = {
    "model_type": "qwen3_5_text", "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1, "max_position_embeddings": 262144, "hidden_size": 5120, "intermediate_size": 17408,
    "vocab_size": 248320, "torch_dtype": "bfloat16",
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def descendants(pid):
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    data = f.read()
                kids.setdefault(int(data[data.rindex(")") + 2:].split()[1]), []).append(int(name))
            except (OSError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


@pytest.fixture(scope="session")
def fakenvml(tmp_path_factory):
    """Compile tests/lab/nvml/fakenvml.c and preload it: pynvml's dlopen("libnvidia-ml.so.1") then finds it."""
    pytest.importorskip("pynvml")
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake libnvidia-ml.so.1")
    out = tmp_path_factory.mktemp("fakenvml")
    lib = out / "libnvidia-ml.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(lib),
                    os.path.join(LAB, "nvml", "fakenvml.c"), "-ldl"], check=True)
    ctypes.CDLL(str(lib), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
    return lib


def _labstate():
    if LABLIB not in sys.path:
        sys.path.insert(0, LABLIB)
    old, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        import labstate  # noqa: F401  pylint: disable=import-error
        import nvml_render  # pylint: disable=import-error
    finally:
        sys.dont_write_bytecode = old
    if nvml_render.render not in labstate._RENDERERS:  # pylint: disable=protected-access
        labstate.register_renderer(nvml_render.render)
    return labstate


def lab_state():
    devices = {}
    gpus = []
    for i, bus in enumerate(("41", "61")):
        bdf = "0000:%s:00.0" % bus
        devices[bdf] = {"vendor": "0x10de", "device": "0x2230", "subsystem_vendor": "0x10de", "subsystem_device": "0x1459",
                        "class": "0x030000", "iommu_group": i, "driver": "nvidia", "driver_override": None}
        gpus.append({"bdf": bdf, "name": "NVIDIA RTX A6000", "uuid": "GPU-%d1f0c0de-0000-0000-0000-00000000000%d" % (i, i),
                     "mem_total_mib": TOTAL, "mem_reserved_mib": BASELINE, "mem_used_mib": BASELINE, "processes": []})
    return {"kernel": {"release": RELEASE}, "modules": {"loaded": ["nvidia", "nvidia_uvm"]},
            "nvidia": {"kernel_modules": {RELEASE: {"version": "580.126.09", "type": "open"}}},
            "pci": {"devices": devices}, "gpus": gpus}


class ServeLab(object):
    """A temp root with the lab state, a model directory, and the processes a test started."""

    def __init__(self, tmp, monkeypatch):
        self.tmp = tmp
        self.root = tmp / "root"
        for rel in ("var/lib/kpro-lab", "etc/systemd/system", "var/log/sglang", "run"):
            (self.root / rel).mkdir(parents=True, exist_ok=True)
        self.labstate = _labstate()
        self.labstate.save(lab_state(), str(self.root))
        self.model = tmp / "Qwen3.6-27B"
        self.model.mkdir()
        cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": QWEN36_TEXT,
               "vision_config": {"depth": 27, "hidden_size": 1152}, "torch_dtype": "bfloat16"}
        (self.model / "config.json").write_text(json.dumps(cfg))
        wm = dict(("model.language_model.layers.%d.mlp.down_proj.weight" % i, "model-%05d-of-00011.safetensors" % (i % 11 + 1))
                  for i in range(64))
        (self.model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": TOTAL_SIZE}, "weight_map": wm}))
        self.bindir = tmp / "bin"
        self.bindir.mkdir()
        (self.bindir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (self.bindir / "nvidia-smi").chmod(0o755)
        # the lab's systemctl stand-in (a python script, not executable in the checkout)
        self.systemctl = str(self.bindir / "systemctl")
        with open(self.systemctl, "w") as f:
            f.write('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (sys.executable, LAB_SYSTEMCTL_PY))
        os.chmod(self.systemctl, 0o755)
        # what the first forward compiles with (the stand-in's toolchain.py): the nvcc stand-in as CUDA_HOME's, the
        # caches in the test's directory (never this machine's ~/.triton, nor a real /usr/local/cuda)
        self.cuda = tmp / "cuda"
        (self.cuda / "bin").mkdir(parents=True)
        (self.cuda / "bin" / "nvcc").symlink_to(os.path.join(STANDIN, "nvidia_cuda_nvcc", "nvcc"))
        self.cache = tmp / "compile-cache"
        self.log_dir = self.root / "var/log/sglang"
        self.launcher = tmp / "sglang-launch"
        self.started = []
        self.port = free_port()
        monkeypatch.setenv("KPRO_LAB_ROOT", str(self.root))
        monkeypatch.setenv("FAKE_NVML_CONFIG", str(self.root / "var/lib/kpro-lab/nvml.conf"))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

    def server_env(self, drill=""):
        """What the stand-in needs (the unit's Environment=, or Popen's env)."""
        return {"PYTHONPATH": "%s:%s" % (STANDIN, LABLIB), "KPRO_LAB_ROOT": str(self.root), "KPRO_LAB_LIBDIR": LABLIB,
                "KPRO_LAB_SGLANG_SPEED": os.environ.get("KPRO_TEST_SGLANG_SPEED", "20"), "KPRO_LAB_SGLANG_DRILL": drill,
                "KPRO_LAB_SGLANG_STANDIN_VERSION": "0.5.11", "PYTHONDONTWRITEBYTECODE": "1",
                "PATH": "%s:%s" % (self.bindir, os.environ.get("PATH", "")), "CUDA_HOME": str(self.cuda),
                "TRITON_CACHE_DIR": str(self.cache / "triton"), "FLASHINFER_WORKSPACE_BASE": str(self.cache / "flashinfer")}

    def options(self, **kw):
        o = dict(GOOD_OPTIONS, model_path=str(self.model), host="127.0.0.1", port=self.port)
        o.update(kw)
        return o

    def argv(self, options):
        from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_unit import render_flags
        return [sys.executable, "-m", "sglang.launch_server"] + render_flags(options)

    def write_launcher(self):
        from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_unit import LAUNCHER_SCRIPT
        self.launcher.write_text(LAUNCHER_SCRIPT)
        self.launcher.chmod(0o755)

    def launch(self, launch_id, drill="", api_key=None, **opts):
        """Start the stand-in by hand through the launcher (pid mode), as the unit would."""
        self.write_launcher()
        from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_unit import secret_config
        options = self.options(**opts)
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(self.server_env(drill))
        env["INVOCATION_ID"] = launch_id
        argv = self.argv(options)
        if api_key:     # as the unit does: the key in a --config file, not in argv
            secrets = self.tmp / "secrets.yaml"
            secrets.write_text(secret_config(api_key))
            argv += ["--config", str(secrets)]
        proc = subprocess.Popen(["sh", str(self.launcher), str(self.log_dir), "sglang"] + argv, env=env, cwd=str(self.tmp),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.started.append(proc.pid)
        self.proc = proc
        return proc

    def record(self):
        for pid in [p for p in list(self.started) if alive(p)]:
            for c in descendants(pid):
                if c not in self.started:
                    self.started.append(c)

    def state(self):
        return json.loads((self.root / "var/lib/kpro-lab/state.json").read_text())

    def used(self):
        return [g["mem_used_mib"] for g in self.state()["gpus"]]

    def cleanup(self):
        self.record()
        for pid in reversed(self.started):
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for pid in self.started:
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
        deadline = time.time() + 5
        while time.time() < deadline and any(alive(p) for p in self.started):
            time.sleep(0.05)


@pytest.fixture
def serve_lab(tmp_path, monkeypatch, fakenvml):
    lab = ServeLab(tmp_path, monkeypatch)
    yield lab
    lab.cleanup()
