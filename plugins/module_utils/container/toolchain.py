# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What SGLang compiles at its first forward pass, and whether the container can: the runtime toolchain.

SGLang 0.5.11 on an RTX A6000 (sm_86) compiles kernels when the first batch runs (CUDA graph capture at start, or the
first request with graphs off), not at import, so a container that lacks a compiler fails only after the model has
been loaded. The rules, each from the real source (docs/runtime-toolchain.md has the details):

- Triton 3.6.0 builds its C launcher with ``$CC``, else ``gcc``, else ``clang`` from PATH (``runtime/build.py:26-33``:
  "Failed to find C compiler"), against the Python headers of the running Python (``runtime/build.py:34-41``:
  ``sysconfig.get_paths(scheme)["include"]``, ``posix_local`` read as ``posix_prefix``). Qwen3.5/3.6's linear-attention
  layers are Triton kernels (sglang ``server_args.py:585``, ``linear_attn_backend = "triton"``).
- FlashInfer 0.6.8.post1 JIT-compiles what ``flashinfer-cubin`` does not ship (attention and sampling on sm_86: sglang
  ``server_args.py:2458-2462, 2511-2513``) with nvcc found as ``$CUDA_HOME``/``$CUDA_PATH``, else ``nvcc`` on PATH, else
  ``/usr/local/cuda`` (``flashinfer/jit/cpp_ext.py:48-64``), driven by ``ninja`` from PATH (``cpp_ext.py:315-323``);
  nvcc compiles the host side with ``g++``.

The CUDA compiler comes from the lock (the ``nvidia-cuda-nvcc`` wheel of the toolkit release torch is built for), so it
is pinned and hashed like the rest of the venv. Its wheel puts the toolkit in ``site-packages/nvidia/cu<major>/`` with
``lib/`` and no ``lib64/``, and only ``libcudart.so.13`` (flashinfer #5064), where FlashInfer and tvm-ffi link
``-L$cuda_home/lib64 -lcudart``: ``CUDA_HOME`` is therefore ``<venv>/cuda``, a directory of relative links this module
keeps (``bin``, ``include``, ``lib`` into the wheel's tree, ``lib64/`` with the unversioned names), valid in a
hard-linked copy of the venv too (the rollback's kept venvs).

Standard library only: the look runs in the container.
"""

from __future__ import annotations

import glob
import json
import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

CUDA_LINK_DIR = "cuda"   # <venv>/cuda: CUDA_HOME of the server
CUDA_LINKS = ("bin", "include", "lib")   # lib64 is a directory of links (wanted_links)
# -lcuda: the driver's library, which the NVIDIA userspace installs (stage 4); the CUDA wheels have no stubs
DRIVER_LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The compile caches, each moved by its library's own variable into one directory the role names.
CACHE_VARIABLES = (
    ("TRITON_CACHE_DIR", "triton"),            # triton 3.6.0 knobs.py: cache_dir, default ~/.triton/cache
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),  # flashinfer jit/env.py:51-55: <base>/.cache/flashinfer
    ("TVM_FFI_CACHE_DIR", "tvm-ffi"),          # sglang 0.5.11 jit_kernel (activation, ...) built by tvm-ffi, default ~/.cache/tvm-ffi
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),   # torch/_inductor/runtime/cache_dir_utils.py (torch.compile, off by default)
    ("CUDA_CACHE_PATH", "nv"),                 # the CUDA driver's PTX JIT cache (ComputeCache)
)

# piece: (what needs it, where the rule is, what provides it)
PIECES = {
    "c_compiler": ("Triton's C launcher", "triton 3.6.0 runtime/build.py:26-33 ($CC, else gcc, else clang on PATH)",
                   "the Debian package gcc (sglang_install_runtime_packages)"),
    "python_headers": ("Triton's C launcher", "triton 3.6.0 runtime/build.py:34-41 (Python.h in sysconfig's include)",
                       "the Debian package python3-dev, the headers of the venv's Python (sglang_install_runtime_packages)"),
    "nvcc": ("FlashInfer's JIT of attention and sampling kernels",
             "flashinfer 0.6.8.post1 jit/cpp_ext.py:48-64 ($CUDA_HOME, else nvcc on PATH, else /usr/local/cuda)",
             "the nvidia-cuda-nvcc wheel of torch's CUDA release in the venv's lock, linked as CUDA_HOME <venv>/cuda"),
    "host_cxx": ("nvcc's host compiler", "nvcc compiles the host code of FlashInfer's .cu sources with g++ from PATH",
                 "the Debian package g++ (sglang_install_runtime_packages)"),
    "ninja": ("FlashInfer's JIT build", "flashinfer 0.6.8.post1 jit/cpp_ext.py:315-323 (ninja from PATH)",
              "the ninja wheel in the venv (SGLang requires it) with <venv>/bin on the server's PATH"),
}

# Run by the venv's Python: where each piece is, by the libraries' own rules. argv: nothing; the environment is the
# server's. One JSON line.
LOOK_PY = r"""
import json, os, re, shutil, subprocess, sysconfig
path = os.environ.get("PATH", "")
cc = os.environ.get("CC") or shutil.which("gcc", path=path) or shutil.which("clang", path=path)
scheme = sysconfig.get_default_scheme()
scheme = "posix_prefix" if scheme == "posix_local" else scheme
inc = sysconfig.get_paths(scheme=scheme)["include"]
home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
if home is None:
    nvcc = shutil.which("nvcc", path=path)
    home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else ("/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None)
release = None
if home:
    try:
        out = subprocess.run([os.path.join(home, "bin", "nvcc"), "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True, timeout=60).stdout
        release = (re.findall(r"release (\d+\.\d+),", out) or [None])[0]   # flashinfer jit/cpp_ext.py get_cuda_version
    except (OSError, subprocess.SubprocessError):
        pass
print(json.dumps(dict(c_compiler=cc, python_headers=os.path.join(inc, "Python.h") if os.path.isfile(os.path.join(inc, "Python.h")) else None,
                      python_include=inc, cuda_home=home, nvcc=release, host_cxx=shutil.which("g++", path=path),
                      ninja=shutil.which("ninja", path=path))))
"""


def cuda_home(venv):
    return os.path.join(venv, CUDA_LINK_DIR)


def runtime_environment(venv, cache_dir=None):
    """The server's environment for what it compiles: the venv's tools and CUDA first on PATH, CUDA_HOME, and (with a
    cache directory) every compile cache in it. The inventory's sglang_server_environment goes over it."""
    env = {"PATH": "%s:%s:%s" % (os.path.join(venv, "bin"), os.path.join(cuda_home(venv), "bin"), BASE_PATH),
           "CUDA_HOME": cuda_home(venv)}
    if cache_dir:
        env.update((name, os.path.join(cache_dir, sub)) for name, sub in CACHE_VARIABLES)
    return env


def count_files(cache_dir):
    """Files under the compile cache directory (None without one): what a launch added is what it compiled."""
    if not cache_dir:
        return None
    return sum(len(files) for _root, _dirs, files in os.walk(cache_dir))


def cache_report(cache_dir, files_before):
    """{dir, files_before, files_after, warm} of a launch that is ready: warm when it added no file to the caches."""
    after = count_files(cache_dir)
    if after is None or files_before is None:
        return None
    return {"dir": cache_dir, "files_before": files_before, "files_after": after, "warm": after == files_before}


def toolkit_dir(venv):
    """The nvidia-cuda-nvcc wheel's toolkit in the venv (site-packages/nvidia/cu<major>), the newest major when several;
    None without one."""
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "cu[0-9]*", "bin", "nvcc")),
                   key=lambda p: int(p.split(os.sep)[-3][2:]))
    return os.path.dirname(os.path.dirname(found[-1])) if found else None


def torch_cuda_major(venv):
    """The CUDA major of the venv's torch (``torch/version.py``: ``cuda = '13.0'``); "" without torch or a CPU build."""
    for path in glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "torch", "version.py")):
        with open(path) as f:
            for line in f:
                if line.startswith("cuda") and "=" in line:
                    value = line.split("=", 1)[1].strip().strip("'\"")
                    return value.split(".")[0] if value[:1].isdigit() else ""
    return ""


def wanted_links(venv, toolkit, driver_libcuda=DRIVER_LIBCUDA):
    """{link path: target} of <venv>/cuda: bin, include and lib as relative links into the wheel's toolkit; lib64 a real
    directory with a link per file of lib, and the unversioned name (libcudart.so) a versioned library lacks, since
    FlashInfer and tvm-ffi link ``-L$CUDA_HOME/lib64 -lcudart`` (flashinfer jit/cpp_ext.py:221-226) and the wheel ships only
    libcudart.so.13 (flashinfer #5064); lib64/stubs/libcuda.so -> the driver's libcuda.so.1 for ``-lcuda`` when it exists."""
    base = cuda_home(venv)
    out = dict((os.path.join(base, name), os.path.relpath(os.path.join(toolkit, name), base)) for name in CUDA_LINKS)
    libdir = os.path.join(toolkit, "lib")
    names = sorted(os.listdir(libdir)) if os.path.isdir(libdir) else []
    for name in names:
        out[os.path.join(base, "lib64", name)] = os.path.join("..", "lib", name)
        stem = name.split(".so.")[0] + ".so"
        if ".so." in name and stem not in names:
            out.setdefault(os.path.join(base, "lib64", stem), name)
    if driver_libcuda and os.path.exists(driver_libcuda):
        out[os.path.join(base, "lib64", "stubs", "libcuda.so")] = driver_libcuda
    return out


def link_changes(venv, toolkit, driver_libcuda=DRIVER_LIBCUDA):
    """[(link path, target)] of <venv>/cuda that are missing or point elsewhere, and (path, None) for a link of lib64
    that is no longer wanted (a file the wheel dropped)."""
    wanted = wanted_links(venv, toolkit, driver_libcuda)
    out = [(link, target) for link, target in sorted(wanted.items())
           if not (os.path.islink(link) and os.readlink(link) == target)]
    lib64 = os.path.join(cuda_home(venv), "lib64")
    for top, _dirs, files in os.walk(lib64):
        out += [(os.path.join(top, f), None) for f in sorted(files) if os.path.join(top, f) not in wanted]
    return out


def make_links(changes):
    """Create, replace or remove the links: each through a temporary name and a rename, so a reader never sees none."""
    for link, target in changes:
        if target is None:
            os.unlink(link)
            continue
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.isdir(link) and not os.path.islink(link):
            raise Failure("runtime_toolchain_missing", "%s is a directory, not the link into the CUDA wheel" % link,
                          remedy="Remove it (rm -rf %s) and re-run the container stage." % link)
        tmp = "%s.kpro-tmp" % link
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.rename(tmp, link)


def look(python, environment, run_command):
    """What the venv's Python finds with the server's environment and nothing else (LOOK_PY's dict): ``env -i`` starts
    it with exactly that environment, as systemd starts the unit. ``run_command``: AnsibleModule.run_command's shape."""
    argv = ["env", "-i"] + ["%s=%s" % kv for kv in sorted(environment.items())] + [python, "-c", LOOK_PY]
    rc, out, err = run_command(argv)
    if rc != 0:
        raise Failure("runtime_toolchain_missing", "%s could not look for the runtime toolchain: %s" % (python, (err or out).strip()[-500:]),
                      remedy="Re-run the container stage (--tags container): the venv may be incomplete.")
    return json.loads(out.strip().splitlines()[-1])


def problems(found, cuda_major=None):
    """[(piece, what is wrong)] for the pieces the look did not find; nvcc also when its release is not torch's CUDA."""
    out = [(piece, "not found") for piece in PIECES if piece != "nvcc" and not found.get(piece)]
    release = found.get("nvcc")
    if not release:
        out.append(("nvcc", "no nvcc under CUDA_HOME %s" % found.get("cuda_home")))
    elif cuda_major and release.split(".")[0] != str(cuda_major):
        out.append(("nvcc", "nvcc %s under %s, but torch is built for CUDA %s" % (release, found.get("cuda_home"), cuda_major)))
    return sorted(out, key=lambda item: list(PIECES).index(item[0]))


# the Debian package of sglang_install_runtime_packages that provides a piece (nvcc and ninja come with the venv's lock)
PACKAGES = {"c_compiler": "gcc", "host_cxx": "g++", "python_headers": "python3-dev"}


def provided(found_problems, would_install, linking):
    """Check mode: ([pieces a package the run installs provides, or the links it makes], [the other problems])."""
    def comes(piece):
        return PACKAGES.get(piece) in would_install or (piece == "nvcc" and linking)
    return [p for p, _w in found_problems if comes(p)], [(p, w) for p, w in found_problems if not comes(p)]


def refusal(found_problems, venv, toolkit):
    """The failure naming each missing piece, what needs it (with the source) and what provides it; None when none."""
    if not found_problems:
        return None
    evidence = ["%s: %s - needed by %s (%s); provided by %s" % ((piece, why) + PIECES[piece]) for piece, why in found_problems]
    if toolkit is None:
        evidence.append("%s has no nvidia/cu*/bin/nvcc: its lock has no nvidia-cuda-nvcc (regenerate it: make sglang-lock)" % venv)
    names = ", ".join(piece for piece, _why in found_problems)
    return Failure("runtime_toolchain_missing",
                   "the container cannot compile what SGLang compiles at its first forward pass (%s missing); the server "
                   "would fail after loading the model." % names, evidence=evidence,
                   remedy="Re-run the container stage (--tags container), which installs sglang_install_runtime_packages "
                          "and syncs %s with its lock (the CUDA compiler is in it); %s" % (venv, "; ".join(
                              "%s: %s" % (piece, PIECES[piece][2]) for piece, _why in found_problems)))
