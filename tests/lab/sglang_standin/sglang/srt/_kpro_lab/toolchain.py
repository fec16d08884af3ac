"""What the first forward pass needs: Triton's C launchers and FlashInfer's JIT modules.

Real SGLang 0.5.11 (with triton 3.6.0 and flashinfer-python 0.6.8.post1) compiles C/CUDA code at run time, never at
import: at the first kernel launch (CUDA graph capture at startup, "Capture cuda graph begin"; the first request when
graphs are off) and, for FlashInfer's sampling, at the first request that samples. This module does the same with the
real tools, so the lab needs what a real host needs (sources in the wheels unpacked from PyPI):

- Triton (triton/runtime/build.py:20-48 ``_build``, 74-97 ``compile_module_from_src``, runtime/cache.py:36-122, 241-248,
  knobs.py:343-353; backends/nvidia/driver.py:54-62 CudaUtils, 674-688 CudaLauncher): compiler = $CC, else
  ``shutil.which("gcc")``, else ``which("clang")``, else RuntimeError; include = sysconfig's include dir of the running
  Python (``posix_local`` -> ``posix_prefix``); ``subprocess.check_call([cc, src, "-O3", "-shared", "-fPIC",
  "-Wno-psabi", "-o", so, ... "-I"...], stdout=DEVNULL)``; the .so is put in $TRITON_CACHE_DIR (default
  $TRITON_HOME or ~ + /.triton/cache) under base32(sha256(src + platform_key())) by an atomic rename, and loaded.
- FlashInfer (flashinfer/jit/cpp_ext.py:47-64 get_cuda_path, 67-87 get_cuda_version, 158-305 the ninja file, 315-344
  run_ninja; jit/core.py:289-321 build/build_and_load under a FileLock; jit/env.py:51-144 the cache directory
  $FLASHINFER_WORKSPACE_BASE (default $HOME)/.cache/flashinfer/<version>/<arch>/cached_ops/<module>/).

Simulated: the sources are tiny (a real Python extension for Triton, a few lines of C++ for FlashInfer); a cold
FlashInfer module costs COLD_MODULE_S / KPRO_LAB_SGLANG_SPEED seconds on top; the stand-in nvcc (the
``nvidia-cuda-nvcc`` stand-in wheel) compiles with the real host compiler; ninja's part is played here (see the README).
"""

import base64
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid

from sglang.srt._kpro_lab import util

FLASHINFER_VERSION = "0.6.8.post1"
TORCH_CUDA_VERSION = "13.0"   # torch.version.cuda of torch 2.11.0 (the cu130 build sglang 0.5.11 pins), get_cuda_version's fallback
DEFAULT_CUDA_HOME = "/usr/local/cuda"  # cpp_ext.py:59 (a constant here so tests can point it elsewhere)
COLD_MODULE_S = 1.5           # simulated nvcc time per cold FlashInfer module (at KPRO_LAB_SGLANG_SPEED=1)

_T = "triton/"
_FI = "flashinfer/"
_S = "sglang/srt/"

# filename_safe_dtype_map (flashinfer/jit/utils.py:59-66) for the dtypes the stand-in knows
_DTYPE = {"bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


class FirstForwardError(Exception):
    """An exception out of the real libraries at the first forward, as the scheduler would log it.

    frames: the frames from the library's entry (below the caller's frames) to the raise; exc_line: the last line
    ("RuntimeError: ..."); runtime_error: whether it is a RuntimeError (cuda_graph_runner.py:715 wraps only those);
    message: str() of the exception; cause: (frames, exc_line) of the exception it was raised ``from``, or None."""

    def __init__(self, frames, exc_line, runtime_error, message, cause=None):
        Exception.__init__(self, exc_line)
        self.frames = frames
        self.exc_line = exc_line
        self.runtime_error = runtime_error
        self.message = message
        self.cause = cause


# ---- Triton ---------------------------------------------------------------------------------------------------

def triton_cache_dir():
    """knobs.py:343-353: $TRITON_CACHE_DIR, else os.path.join($TRITON_HOME or expanduser("~/"), ".triton", "cache")."""
    d = os.environ.get("TRITON_CACHE_DIR")
    if d:
        return d
    return os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~/"), ".triton", "cache")


def find_c_compiler():
    """build.py:26-33: $CC, else gcc, else clang; None when there is none."""
    cc = os.environ.get("CC")
    if cc is None:
        clang = shutil.which("clang")
        gcc = shutil.which("gcc")
        cc = gcc if gcc is not None else clang
    return cc


def python_include_dir():
    """build.py:34-39: the include directory of the running Python's default scheme (Debian's posix_local as posix_prefix)."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def _platform_key():
    """build.py:59-62."""
    from platform import architecture, machine, system
    return ",".join([machine(), system(), *architecture()])


def _base32(key):
    """runtime/cache.py:241-243."""
    return base64.b32encode(bytes.fromhex(key)).decode("utf-8").rstrip("=")


def _launcher_src(name):
    # a real (tiny) CPython extension: it needs Python.h like triton's driver.c and the generated launchers
    return ("/* kpro-lab stand-in of triton %s (backends/nvidia/driver.c / make_launcher) */\n"
            "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n\n"
            "static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};\n"
            "static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, \"%s\", NULL, -1, methods};\n"
            "PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&mod); }\n" % (name, name, name))


# frames of the first Triton launch (a kernel's JITFunction.run making the driver, whose CudaUtils compiles cuda_utils)
_TRITON_FIRST_LAUNCH = [
    (_T + "runtime/jit.py", 370, "<lambda>", "return lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)"),
    (_T + "runtime/jit.py", 700, "run", "device = driver.active.get_current_device()"),
    (_T + "runtime/driver.py", 28, "active", "self._active = self.default"),
    (_T + "runtime/driver.py", 22, "default", "self._default = _create_driver()"),
    (_T + "runtime/driver.py", 10, "_create_driver", "return active_drivers[0]()"),
    (_T + "backends/nvidia/driver.py", 720, "__init__", "self.utils = CudaUtils()  # TODO: make static"),
    (_T + "backends/nvidia/driver.py", 62, "__init__", "mod = compile_module_from_src("),
]
_TRITON_LAUNCHER = [
    (_T + "runtime/jit.py", 370, "<lambda>", "return lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)"),
    (_T + "runtime/jit.py", 744, "run", "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,"),
    (_T + "compiler/compiler.py", 476, "run", "self._init_handles()"),
    (_T + "compiler/compiler.py", 452, "_init_handles", "self._run = driver.active.launcher_cls(self.src, self.metadata)"),
    (_T + "backends/nvidia/driver.py", 683, "__init__", "mod = compile_module_from_src("),
]
_TRITON_BUILD = (_T + "runtime/build.py", 93, "compile_module_from_src",
                 "so = _build(name, src_path, tmpdir, library_dirs or [], include_dirs or [], libraries or [], ccflags or [])")


def _load(name, path):
    """build.py:65-71."""
    spec = importlib.util.spec_from_file_location(name, path)
    if not spec or not spec.loader:
        raise RuntimeError("Failed to load newly compiled %s from %s" % (name, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_triton_module(name, src, frames):
    """compile_module_from_src (build.py:74-97): the cached .so, else a real compile put by atomic rename.
    Returns True when it compiled. Raises FirstForwardError (frames: the caller's library frames)."""
    key = hashlib.sha256((src + _platform_key()).encode("utf-8")).hexdigest()
    cache_dir = os.path.join(triton_cache_dir(), _base32(key))
    os.makedirs(cache_dir, exist_ok=True)                                   # cache.py:50-55
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    cache_path = os.path.join(cache_dir, name + suffix)
    if os.path.exists(cache_path):
        try:
            _load(name, cache_path)
            return False
        except (RuntimeError, ImportError):
            util.log("Triton cache error: compiled module %s.so could not be loaded" % name, level=30)
    with tempfile.TemporaryDirectory() as tmpdir:
        src_path = os.path.join(tmpdir, name + ".c")
        with open(src_path, "w") as f:
            f.write(src)
        so = _build(name, src_path, tmpdir, frames)
        with open(so, "rb") as f:
            data = f.read()
    # cache.py:98-122: a temp dir per writer, os.replace (atomic), so ranks compiling at once never see a partial file
    temp_dir = os.path.join(cache_dir, "tmp.pid_%d_%s" % (os.getpid(), uuid.uuid4()))
    os.makedirs(temp_dir, exist_ok=True)
    temp_path = os.path.join(temp_dir, name + suffix)
    with open(temp_path, "wb") as f:
        f.write(data)
    os.replace(temp_path, cache_path)
    os.removedirs(temp_dir)
    _load(name, cache_path)
    return True


def _build(name, src, srcdir, frames):
    """build.py:20-48 (no knobs.build.impl; libcuda's -l/-L flags left out: the lab has no libcuda.so.1)."""
    so = os.path.join(srcdir, name + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = find_c_compiler()
    if cc is None:
        msg = "Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."
        raise FirstForwardError(frames + [_TRITON_BUILD, (_T + "runtime/build.py", 32, "_build", "raise RuntimeError(")],
                                "RuntimeError: " + msg, True, msg)
    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    include_dirs = [os.path.join(site, "triton", "backends", "nvidia", "include"), srcdir, python_include_dir()]  # driver.py:14, build.py:41
    cc_cmd = [cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so]
    cc_cmd += ["-I%s" % d for d in include_dirs if d is not None]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        rc = subprocess.call(cc_cmd, stdout=subprocess.DEVNULL)             # gcc's stderr goes to the server log
    except OSError as e:
        # check_call -> Popen: an unrunnable $CC raises FileNotFoundError/PermissionError out of subprocess
        raise FirstForwardError(frames + [_TRITON_BUILD, (_T + "runtime/build.py", 48, "_build",
                                                          "subprocess.check_call(cc_cmd, stdout=subprocess.DEVNULL)")],
                                "%s: %s" % (type(e).__name__, e), False, str(e))
    if rc != 0:
        err = subprocess.CalledProcessError(rc, cc_cmd)
        raise FirstForwardError(frames + [
            _TRITON_BUILD,
            (_T + "runtime/build.py", 48, "_build", "subprocess.check_call(cc_cmd, stdout=subprocess.DEVNULL)"),
            (os.path.abspath(subprocess.__file__), 413, "check_call", "raise CalledProcessError(retcode, cmd)"),
        ], "subprocess.CalledProcessError: %s" % err, False, str(err))
    return so


def triton_launchers(lead):
    """The first launches: CudaUtils' cuda_utils (driver.py:61-68), then one kernel's __triton_launcher (driver.py:683).
    lead: the sglang frames down to the first launch. Returns how many modules were compiled."""
    n = 0
    for name, frames in (("cuda_utils", _TRITON_FIRST_LAUNCH), ("__triton_launcher", _TRITON_LAUNCHER)):
        n += compile_triton_module(name, _launcher_src(name), lead + frames)
    return n


# ---- FlashInfer -----------------------------------------------------------------------------------------------

def get_cuda_path():
    """cpp_ext.py:47-64 (raises RuntimeError with the real text)."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home is not None:
        return cuda_home
    nvcc_path = subprocess.run(["which", "nvcc"], capture_output=True, check=False)
    if nvcc_path.returncode == 0:
        return os.path.dirname(os.path.dirname(nvcc_path.stdout.decode("utf-8").strip()))
    cuda_home = DEFAULT_CUDA_HOME
    if not os.path.exists(cuda_home):
        raise RuntimeError("Could not find nvcc and default %s doesn't exist" % ("cuda_home=%r" % cuda_home))
    return cuda_home


def get_cuda_version():
    """cpp_ext.py:67-87: ``$cuda_home/bin/nvcc --version``; on RuntimeError/FileNotFoundError/CalledProcessError,
    torch.version.cuda."""
    try:
        nvcc = os.path.join(get_cuda_path(), "bin/nvcc")
        txt = subprocess.check_output([nvcc, "--version"], text=True)
        matches = re.findall(r"release (\d+\.\d+),", txt)
        if not matches:
            raise RuntimeError("Could not parse CUDA version from nvcc --version output: %s" % txt)
        return matches[0]
    except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError):
        return TORCH_CUDA_VERSION


def cuda_arch():
    """env.py:130-139: the workspace's arch directory, from CompilationContext.TARGET_CUDA_ARCHS (FLASHINFER_CUDA_ARCH_LIST,
    else the visible GPUs' capability; the lab's GPUs are A6000s, sm_86)."""
    env = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    if env:
        archs = sorted(set(tuple(int(x) for x in re.findall(r"\d+", a)[:2]) for a in env.split()))
        return "_".join("%d%d" % a for a in archs if len(a) == 2)
    return "86"


def jit_dir():
    """env.py:51-55, 139-144: $FLASHINFER_WORKSPACE_BASE (default the home directory)/.cache/flashinfer/<version>/<arch>/cached_ops."""
    base = os.getenv("FLASHINFER_WORKSPACE_BASE", os.path.expanduser("~"))
    return os.path.join(base, ".cache", "flashinfer", FLASHINFER_VERSION, cuda_arch(), "cached_ops")


def _kv_dtype(a):
    kv = getattr(a, "kv_cache_dtype", None)
    return a.model_dtype if kv in (None, "auto") else kv


def attention_modules(a, facts):
    """The JIT URIs of the FlashInfer attention backend for this model (jit/attention/modules.py:66-87 decode,
    372-396 prefill; fa2 on sm_86, so no "_sm90"). TP and page size are plan() arguments, not part of a URI."""
    if getattr(a, "attention_backend", None) != "flashinfer":
        return {}
    q = _DTYPE.get(a.model_dtype, a.model_dtype)
    kv = _DTYPE.get(_kv_dtype(a), _kv_dtype(a))
    common = ("dtype_q_%s_dtype_kv_%s_dtype_o_%s_dtype_idx_i32_head_dim_qk_%d_head_dim_vo_%d_posenc_0_use_swa_False_use_logits_cap_False"
              % (q, kv, q, facts.head_dim, facts.v_head_dim))
    prefill = "batch_prefill_with_kv_cache_" + common + "_f16qk_False"
    # with tensor cores the decode wrapper loads the prefill module (decode.py:1072 get_batch_prefill_module("fa2", ...))
    return {"decode": prefill if use_tensor_cores(a, facts) else "batch_decode_with_kv_cache_" + common, "prefill": prefill}


def use_tensor_cores(a, facts):
    """sglang layers/attention/flashinfer_backend.py:1661-1707 should_use_tensor_core: $SGLANG_FLASHINFER_USE_TENSOR_CORE,
    else (flashinfer 0.6.8 has no _grouped_size_compiled_for_decode_kernels) an fp8 KV cache, or f16/bf16 with a GQA group >= 4."""
    env = os.environ.get("SGLANG_FLASHINFER_USE_TENSOR_CORE")
    if env is not None:
        return env.lower() == "true"
    kv = _kv_dtype(a)
    if kv in ("fp8_e4m3", "fp8_e5m2"):
        return True
    heads, kv_heads = getattr(facts, "heads", None), getattr(facts, "kv_heads", None)
    if kv in ("bfloat16", "float16", "half") and heads and kv_heads:
        return heads // kv_heads >= 4
    return False


def sampling_backend(a):
    """server_args.py:2458-2462: flashinfer when available (it is, with CUDA) unless --sampling-backend says otherwise."""
    return getattr(a, "sampling_backend", None) or "flashinfer"


_CORE = [
    (_FI + "jit/core.py", 318, "build_and_load", "self.build(verbose, need_lock=False)"),
]
_NO_NVCC = [
    (_FI + "jit/core.py", 303, "build", "self.write_ninja()"),
    (_FI + "jit/core.py", 274, "write_ninja", "content = generate_ninja_build_for_op("),
    (_FI + "jit/cpp_ext.py", 216, "generate_ninja_build_for_op", "cuda_home = get_cuda_path()"),
    (_FI + "jit/cpp_ext.py", 61, "get_cuda_path", "raise RuntimeError("),
]


def _lock(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def build_module(name, frames):
    """JitSpec.build_and_load (core.py:309-321) for one module: under <jit_dir>/tmp/<name>.lock, nothing when
    <jit_dir>/<name>/<name>.so exists (ninja has nothing to do), else the ninja file and its commands. True if compiled."""
    jd = jit_dir()
    fd = _lock(os.path.join(jd, "tmp", name + ".lock"))                    # core.py:268-269, 315; get_tmpdir 488-493
    try:
        so = os.path.join(jd, name, name + ".so")
        if os.path.exists(so):
            return False
        try:
            cuda_home = get_cuda_path()
        except RuntimeError as e:
            raise FirstForwardError(frames + _CORE + _NO_NVCC, "RuntimeError: %s" % e, True, str(e))
        _ninja(name, cuda_home, os.path.join(jd, name), so, frames)
        util.sleep(COLD_MODULE_S)
        return True
    finally:
        os.close(fd)


def _ninja(name, cuda_home, build_dir, so, frames):
    """What ``ninja -v -C <build_dir> -f build.ninja`` runs for the module (cpp_ext.py:207-305, 315-344): the nvcc
    compile of each .cu, then the link with $CXX (default c++). The stand-in plays ninja (the lab's venv has no ninja)."""
    os.makedirs(build_dir, exist_ok=True)
    src = os.path.join(build_dir, "..", "..", "generated", name, "kernel.cu")
    src = os.path.normpath(src)
    os.makedirs(os.path.dirname(src), exist_ok=True)
    with open(src, "w") as f:
        f.write("// kpro-lab stand-in of FlashInfer's generated %s\nextern \"C\" int kpro_lab_%s(void) { return 0; }\n"
                % (name, hashlib.sha256(name.encode()).hexdigest()[:12]))
    obj = os.path.join(build_dir, "%s_kernel.cuda.o" % name)   # cpp_ext.py:293: f"{source.parent.name}_{source.stem}{object_suffix}"
    nvcc = os.environ.get("FLASHINFER_NVCC", os.path.join(cuda_home, "bin/nvcc"))
    cuda_cflags = (["-ccbin", os.environ["CC"]] if os.environ.get("CC") is not None else []) + [
        "-isystem", python_include_dir(), "-isystem", os.path.join(cuda_home, "include"),
        "--compiler-options=-fPIC", "--expt-relaxed-constexpr"]
    if tuple(int(x) for x in get_cuda_version().split(".")) >= (12, 8):
        cuda_cflags.append("-static-global-template-stub=false")
    arch = cuda_arch().split("_", maxsplit=1)[0]
    cuda_cflags.append("-gencode=arch=compute_%s,code=sm_%s" % (arch, arch))
    cxx = os.environ.get("CXX", "c++")
    steps = [
        [nvcc, "--generate-dependencies-with-compile", "--dependency-output", obj + ".d"] + cuda_cflags + ["-c", src, "-o", obj],
        [cxx, obj, "-shared", "-o", so + ".tmp"],   # the real ldflags' -L$cuda_home/lib64 -lcudart -lcuda: left out (no CUDA libraries in the lab)
    ]
    ninja_file = os.path.join(build_dir, "build.ninja")
    with open(ninja_file, "w") as f:
        f.write("ninja_required_version = 1.3\nname = %s\ncuda_home = %s\ncxx = %s\nnvcc = %s\n\n# kpro-lab: %s\n# kpro-lab: %s\n"
                % (name, cuda_home, cxx, nvcc, " ".join(steps[0]), " ".join(steps[1])))
    out = ["ninja: Entering directory `%s'\n" % build_dir]
    for i, cmd in enumerate(steps):
        out.append("[%d/%d] %s\n" % (i + 1, len(steps), " ".join(cmd)))
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
            rc, text = r.returncode, r.stdout
        except OSError:
            rc, text = 127, "/bin/sh: 1: %s: not found\n" % cmd[0]
        if rc != 0:
            target = obj if i == 0 else so
            out.append("FAILED: %s\n%s\n%sninja: build stopped: subcommand failed.\n" % (target, " ".join(cmd), text))
            output = "".join(out)
            ninja_cmd = ["ninja", "-v", "-C", build_dir, "-f", ninja_file]
            msg = "Ninja build failed. Ninja output:\n" + output
            cause = ([(_FI + "jit/cpp_ext.py", 332, "run_ninja", "subprocess.run("),
                      (os.path.abspath(subprocess.__file__), 571, "run", "raise CalledProcessError(retcode, process.args,")],
                     "subprocess.CalledProcessError: %s" % subprocess.CalledProcessError(1, ninja_cmd))
            raise FirstForwardError(frames + _CORE + [
                (_FI + "jit/core.py", 304, "build", "run_ninja(self.build_dir, self.ninja_path, verbose)"),
                (_FI + "jit/cpp_ext.py", 344, "run_ninja", "raise RuntimeError(msg) from e"),
            ], "RuntimeError: " + msg.rstrip("\n"), True, msg, cause=cause)
    os.replace(so + ".tmp", so)


# ---- the rank's first forwards --------------------------------------------------------------------------------

# sglang frames (0.5.11) from the scheduler to the libraries
CAPTURE_OUTER = [
    (_S + "model_executor/model_runner.py", 560, "initialize", "self.init_device_graphs()"),
    (_S + "model_executor/model_runner.py", 2150, "init_device_graphs", "self.graph_runner = graph_runners[self.device](self)"),
]
CAPTURE_TRY = (_S + "model_executor/cuda_graph_runner.py", 714, "__init__", "self.capture()")
CAPTURE_RAISE = (_S + "model_executor/cuda_graph_runner.py", 716, "__init__", "raise Exception(")
_CAPTURE_INNER = [
    (_S + "model_executor/cuda_graph_runner.py", 896, "capture", "_capture_one_stream()"),
    (_S + "model_executor/cuda_graph_runner.py", 884, "_capture_one_stream", ") = self.capture_one_batch_size(bs, forward, stream_idx)"),
]
_CAPTURE_RUN = [
    (_S + "model_executor/cuda_graph_runner.py", 1165, "capture_one_batch_size", "run_once()"),
    (_S + "model_executor/cuda_graph_runner.py", 1143, "run_once", "logits_output_or_pp_proxy_tensors = forward("),
]
_CAPTURE_DECODE = [
    (_S + "model_executor/cuda_graph_runner.py", 1107, "capture_one_batch_size", "attn_backend.init_forward_metadata_capture_cuda_graph("),
    (_S + "layers/attention/flashinfer_backend.py", 589, "init_forward_metadata_capture_cuda_graph", "self.indices_updater_decode.update("),
    (_S + "layers/attention/flashinfer_backend.py", 1002, "update_single_wrapper", "self.call_begin_forward("),
    (_S + "layers/attention/flashinfer_backend.py", 1167, "call_begin_forward", "wrapper.begin_forward("),
    (_FI + "decode.py", 1115, "plan", "self._cached_module = get_batch_decode_module("),
    (_FI + "decode.py", 224, "get_batch_decode_module", "mod = gen_batch_decode_module(*args).build_and_load()"),
]
_TC_DECODE_PLAN = [
    (_FI + "decode.py", 1072, "plan", "self._cached_module = get_batch_prefill_module("),
    (_FI + "prefill.py", 454, "get_batch_prefill_module", "module = gen_batch_prefill_module(backend, *args).build_and_load()"),
]
_KV_INDICES_DECODE = (_S + "layers/attention/flashinfer_backend.py", 1129, "call_begin_forward", "create_flashinfer_kv_indices_triton[(bs,)](")
_KV_INDICES_PREFILL = (_S + "layers/attention/flashinfer_backend.py", 1423, "call_begin_forward", "create_flashinfer_kv_indices_triton[(bs,)](")
REQUEST_OUTER = [
    (_S + "managers/scheduler.py", 3804, "run_scheduler_process", "scheduler.event_loop_overlap()"),
    (_S + "managers/scheduler.py", 1565, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
    (_S + "managers/scheduler.py", 2981, "run_batch", "batch_result = self.model_worker.forward_batch_generation("),
]
_REQUEST_FORWARD = [
    (_S + "managers/tp_worker.py", 470, "forward_batch_generation", "out = self.model_runner.forward("),
    (_S + "model_executor/model_runner.py", 3153, "forward", "output = self._forward_raw("),
]
_REQUEST_PREFILL = [
    (_S + "model_executor/model_runner.py", 3055, "forward_extend", "self.attn_backend.init_forward_metadata(forward_batch)"),
    (_S + "layers/attention/flashinfer_backend.py", 450, "init_forward_metadata", "self.indices_updater_prefill.update("),
    (_S + "layers/attention/flashinfer_backend.py", 1483, "call_begin_forward", "wrapper_paged.begin_forward("),
    (_FI + "prefill.py", 1999, "plan", "self._cached_module = get_batch_prefill_module("),
    (_FI + "prefill.py", 454, "get_batch_prefill_module", "module = gen_batch_prefill_module(backend, *args).build_and_load()"),
]
_REQUEST_DECODE = [
    (_S + "model_executor/model_runner.py", 3226, "_forward_raw", "ret = self.forward_decode("),
    (_S + "layers/attention/flashinfer_backend.py", 437, "init_forward_metadata", "self.indices_updater_decode.update("),
    (_S + "layers/attention/flashinfer_backend.py", 1167, "call_begin_forward", "wrapper.begin_forward("),
    (_FI + "decode.py", 1115, "plan", "self._cached_module = get_batch_decode_module("),
    (_FI + "decode.py", 224, "get_batch_decode_module", "mod = gen_batch_decode_module(*args).build_and_load()"),
]
_REQUEST_SAMPLE = [
    (_S + "managers/tp_worker.py", 494, "forward_batch_generation", "batch_result.next_token_ids = self.model_runner.sample("),
    (_S + "model_executor/model_runner.py", 3322, "sample", "next_token_ids = self.sampler("),
    (_S + "layers/sampler.py", 167, "forward", "batch_next_token_ids = self._sample_from_probs("),
    (_S + "layers/sampler.py", 226, "_sample_from_probs", "batch_next_token_ids = top_k_top_p_sampling_from_probs("),
    (_FI + "sampling.py", 1417, "top_k_top_p_sampling_from_probs", "return get_sampling_module().top_k_top_p_sampling_from_probs("),
    (_FI + "sampling.py", 54, "get_sampling_module", "module = gen_sampling_module().build_and_load()"),
]


class Toolchain(object):
    """One rank's view: what this process has built or loaded (the libraries' in-process caches)."""

    def __init__(self, a, facts):
        self.a = a
        self.facts = facts
        self.loaded = set()
        self.compiled = []      # names compiled by this process (tests)

    def _module(self, key, name, frames):
        if name in self.loaded:
            return
        if build_module(name, frames):
            self.compiled.append(name)
        self.loaded.add(key)
        self.loaded.add(name)

    def _triton(self, lead):
        if "triton" in self.loaded:
            return
        if triton_launchers(lead):
            self.compiled.append("triton")
        self.loaded.add("triton")

    def capture(self):
        """CUDA graph capture (decode batches). With FlashInfer attention the first Triton launch is the backend's
        create_flashinfer_kv_indices_triton (flashinfer_backend.py:1129), then its decode plan JIT-builds the decode
        module (1167); otherwise the model's forward launches Triton first. Frames are relative to CAPTURE_TRY."""
        mods = attention_modules(self.a, self.facts)
        if "decode" in mods:
            self._triton(_CAPTURE_INNER + _CAPTURE_DECODE[:3] + [_KV_INDICES_DECODE])
            plan = _CAPTURE_DECODE if mods["decode"].startswith("batch_decode") else _CAPTURE_DECODE[:4] + _TC_DECODE_PLAN
            self._module("decode", mods["decode"], _CAPTURE_INNER + plan)
        self._triton(_CAPTURE_INNER + _CAPTURE_RUN)

    def request(self, greedy=True):
        """A request's forwards (an extend, then decodes) and its sampling; frames relative to REQUEST_OUTER."""
        mods = attention_modules(self.a, self.facts)
        if "prefill" in mods:
            self._triton(_REQUEST_FORWARD + _REQUEST_PREFILL[:2] + [_KV_INDICES_PREFILL])
            self._module("prefill", mods["prefill"], _REQUEST_FORWARD + _REQUEST_PREFILL)
        self._triton(_REQUEST_FORWARD)
        if "decode" in mods:
            self._module("decode", mods["decode"], _REQUEST_FORWARD + _REQUEST_DECODE)
        if not greedy and sampling_backend(self.a) == "flashinfer":
            # sampler.py:111-113: an all-greedy batch is torch.argmax; FlashInfer's sampling JIT is needed by the first sampled one
            self._module("sampling", "sampling", _REQUEST_SAMPLE)


def render(outer, exc, wrap_message=None):
    """The scheduler's traceback text (format_exc) for a FirstForwardError raised below ``outer`` frames.
    wrap_message: cuda_graph_runner.py:713-718 (a RuntimeError becomes ``Exception: Capture cuda graph failed: ...``)."""
    if wrap_message is not None and exc.runtime_error:
        inner = _render_exc(CAPTURE_TRY, exc)
        return (inner + "\nDuring handling of the above exception, another exception occurred:\n\n"
                + util.fake_traceback(outer + [CAPTURE_RAISE], "Exception: Capture cuda graph failed: %s\n%s" % (exc.message, wrap_message)))
    head = outer + ([CAPTURE_TRY] if wrap_message is not None else [])
    return _render_exc(None, exc, head)


def _render_exc(first, exc, head=None):
    frames = (head or []) + ([first] if first else []) + exc.frames
    text = util.fake_traceback(frames, exc.exc_line)
    if exc.cause is not None:
        cause = util.fake_traceback(exc.cause[0], exc.cause[1])
        text = cause + "\nThe above exception was the direct cause of the following exception:\n\n" + text
    return text
