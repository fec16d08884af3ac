"""The SGLang stand-in's first-forward toolchain (tests/lab/sglang_standin/sglang/srt/_kpro_lab/toolchain.py).

Each test quotes the line of triton 3.6.0, flashinfer-python 0.6.8.post1 or sglang 0.5.11 it follows. The compiles are
real (gcc, the nvcc stand-in), in the test's directory: TRITON_CACHE_DIR, FLASHINFER_WORKSPACE_BASE and CUDA_HOME
point there, so nothing is written under the home directory.
"""

import os
import shutil
import stat
import subprocess
import sys
import types
import zipfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
STANDIN = os.path.join(REPO, "tests", "lab", "sglang_standin")
NVCC = os.path.join(STANDIN, "nvidia_cuda_nvcc", "nvcc")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)
from sglang.srt._kpro_lab import scheduler, toolchain, util  # noqa: E402

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="needs gcc and g++")


def args(**kw):
    a = dict(attention_backend="flashinfer", model_dtype="bfloat16", kv_cache_dtype="auto", sampling_backend=None)
    a.update(kw)
    return types.SimpleNamespace(**a)


FACTS = types.SimpleNamespace(head_dim=256, v_head_dim=256)


@pytest.fixture
def tc(tmp_path, monkeypatch):
    """Caches and CUDA_HOME in tmp_path; PATH = a directory with links to gcc/g++/c++ only; simulated time recorded."""
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").symlink_to(NVCC)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("gcc", "g++", "c++", "as", "ld", "which"):
        path = shutil.which(name)
        if path:
            (tools / name).symlink_to(path)
    for var in ("CC", "CXX", "CUDA_PATH", "FLASHINFER_NVCC", "FLASHINFER_CUDA_ARCH_LIST", "TRITON_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache" / "triton"))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "cache" / "flashinfer"))
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(toolchain, "DEFAULT_CUDA_HOME", str(tmp_path / "no-usr-local-cuda"))
    slept = []
    monkeypatch.setattr(util, "sleep", slept.append)
    ns = types.SimpleNamespace(tmp=tmp_path, cuda=cuda, tools=tools, slept=slept)
    return ns


def test_no_c_compiler_is_tritons_runtime_error_wrapped_by_the_capture(tc, monkeypatch):
    """triton/runtime/build.py:26-33: ``cc = os.environ.get("CC")`` ... ``raise RuntimeError("Failed to find C compiler.
    Please specify via CC environment variable or set triton.knobs.build.impl.")``; sglang cuda_graph_runner.py:715-718
    ``except RuntimeError as e: raise Exception(f"Capture cuda graph failed: {e}\\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}")``."""
    monkeypatch.setenv("PATH", str(tc.tmp / "empty"))
    t = toolchain.Toolchain(args(attention_backend="triton"), FACTS)
    with pytest.raises(toolchain.FirstForwardError) as ei:
        t.capture()
    e = ei.value
    msg = "Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."
    assert e.exc_line == "RuntimeError: " + msg and e.runtime_error
    text = toolchain.render(toolchain.CAPTURE_OUTER, e, scheduler._CAPTURE_FAILED_MSG)
    assert 'triton/runtime/build.py", line 32, in _build\n    raise RuntimeError(' in text
    assert "\nDuring handling of the above exception, another exception occurred:\n" in text
    assert ("Exception: Capture cuda graph failed: %s\nPossible solutions:\n1. set --mem-fraction-static" % msg) in text
    assert not os.path.exists(tc.tmp / "cache" / "flashinfer")


@needs_gcc
def test_compiler_without_python_headers_is_gccs_error_and_a_bare_calledprocesserror(tc, monkeypatch, capfd):
    """build.py:39 ``py_include_dir = sysconfig.get_paths(scheme=scheme)["include"]``, build.py:48
    ``subprocess.check_call(cc_cmd, stdout=subprocess.DEVNULL)`` (gcc's stderr reaches the log); a CalledProcessError is
    no RuntimeError, so cuda_graph_runner.py:715 does not wrap it."""
    empty = tc.tmp / "include"
    empty.mkdir()
    monkeypatch.setattr(toolchain, "python_include_dir", lambda: str(empty))
    t = toolchain.Toolchain(args(attention_backend="triton"), FACTS)
    with pytest.raises(toolchain.FirstForwardError) as ei:
        t.capture()
    e = ei.value
    assert "Python.h: No such file or directory" in capfd.readouterr().err
    assert e.exc_line.startswith("subprocess.CalledProcessError: Command '['%s', " % shutil.which("gcc", path=str(tc.tools)))
    assert "'-O3', '-shared', '-fPIC', '-Wno-psabi', '-o'" in e.exc_line and "'-I%s'" % empty in e.exc_line
    assert e.exc_line.endswith("]' returned non-zero exit status 1.") and not e.runtime_error
    text = toolchain.render(toolchain.CAPTURE_OUTER, e, scheduler._CAPTURE_FAILED_MSG)
    assert "Capture cuda graph failed" not in text and "During handling" not in text
    assert 'subprocess.py", line 413, in check_call\n    raise CalledProcessError(retcode, cmd)' in text
    assert text.index("cuda_graph_runner.py\", line 714") < text.index("triton/runtime/build.py\", line 48")


def test_no_nvcc_is_flashinfers_runtime_error(tc, monkeypatch):
    """flashinfer/jit/cpp_ext.py:49-63: CUDA_HOME or CUDA_PATH, else ``which nvcc``, else /usr/local/cuda if it exists,
    else ``raise RuntimeError(f"Could not find nvcc and default {cuda_home=} doesn't exist")``."""
    monkeypatch.delenv("CUDA_HOME")
    t = toolchain.Toolchain(args(), FACTS)
    with pytest.raises(toolchain.FirstForwardError) as ei:
        t.capture()
    e = ei.value
    assert e.exc_line == "RuntimeError: Could not find nvcc and default cuda_home=%r doesn't exist" % toolchain.DEFAULT_CUDA_HOME
    text = toolchain.render(toolchain.CAPTURE_OUTER, e, scheduler._CAPTURE_FAILED_MSG)
    assert 'flashinfer/jit/cpp_ext.py", line 216, in generate_ninja_build_for_op\n    cuda_home = get_cuda_path()' in text
    assert "Exception: Capture cuda graph failed: Could not find nvcc and default cuda_home=" in text
    # nvcc found on PATH: cuda_home = dirname(dirname(which nvcc)) (cpp_ext.py:53-57)
    monkeypatch.setenv("PATH", "%s:%s" % (tc.cuda / "bin", tc.tools))
    assert toolchain.get_cuda_path() == str(tc.cuda)


@needs_gcc
def test_warm_cache_compiles_nothing_and_costs_no_time(tc):
    """build.py:80-84 ``cache_path = cache.get_file(...)`` / ``if cache_path is not None: return _load_module_from_path``;
    flashinfer jit/core.py:264-265 ``is_compiled``: ``self.get_library_path().exists()`` (ninja has nothing to do)."""
    first = toolchain.Toolchain(args(), FACTS)
    first.capture()
    first.request(greedy=False)
    decode = "batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_256_head_dim_vo_256_posenc_0_" \
             "use_swa_False_use_logits_cap_False"
    prefill = decode.replace("batch_decode", "batch_prefill") + "_f16qk_False"
    assert first.compiled == ["triton", decode, prefill, "sampling"]
    assert tc.slept == [toolchain.COLD_MODULE_S] * 3
    jit = tc.tmp / "cache" / "flashinfer" / ".cache" / "flashinfer" / "0.6.8.post1" / "86" / "cached_ops"
    for name in (decode, prefill, "sampling"):
        assert (jit / name / (name + ".so")).is_file()
    import sysconfig
    sos = sorted(p.name for p in (tc.tmp / "cache" / "triton").glob("*/*.so"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert sos == sorted(["__triton_launcher" + suffix, "cuda_utils" + suffix])
    del tc.slept[:]
    second = toolchain.Toolchain(args(), FACTS)     # a second start: another process, the same caches
    second.capture()
    second.request(greedy=False)
    assert second.compiled == [] and tc.slept == []


@needs_gcc
def test_tensor_core_decode_uses_the_prefill_module(tc):
    """sglang flashinfer_backend.py:1702-1705 ``elif kv_cache_dtype in (torch.float16, torch.half, torch.bfloat16): return
    gqa_group_size >= 4``; flashinfer decode.py:1072 (tensor cores) ``self._cached_module = get_batch_prefill_module(``."""
    t = toolchain.Toolchain(args(), types.SimpleNamespace(head_dim=256, v_head_dim=256, heads=24, kv_heads=4))
    t.capture()
    assert t.compiled[0] == "triton" and t.compiled[1].startswith("batch_prefill_with_kv_cache_") and len(t.compiled) == 2
    t.request(greedy=True)
    assert len(t.compiled) == 2     # the request's prefill needs the same module


@needs_gcc
def test_a_changed_kernel_option_needs_a_new_compile(tc):
    """jit/attention/modules.py:66-87 / 372-396: the URI holds dtype_q, dtype_kv, head dims (and fa3's _sm90), so
    --kv-cache-dtype fp8_e4m3 is another module; Triton's launchers do not change (build.py:77 key = sha256(src + ...))."""
    toolchain.Toolchain(args(), FACTS).capture()
    t = toolchain.Toolchain(args(kv_cache_dtype="fp8_e4m3"), FACTS)
    t.capture()
    assert len(t.compiled) == 1 and "_dtype_kv_e4m3_" in t.compiled[0]   # fp8 KV: tensor-core decode (the prefill module)
    t2 = toolchain.Toolchain(args(), types.SimpleNamespace(head_dim=128, v_head_dim=128))
    t2.capture()
    assert len(t2.compiled) == 1 and "_head_dim_qk_128_" in t2.compiled[0]


@needs_gcc
def test_greedy_requests_need_no_sampling_module(tc):
    """sglang layers/sampler.py:111-113: ``if sampling_info.is_all_greedy: batch_next_token_ids = torch.argmax(logits, -1)``;
    the FlashInfer sampling module (flashinfer/sampling.py:53-54) is built by the first sampled request."""
    t = toolchain.Toolchain(args(attention_backend="triton"), FACTS)
    t.request(greedy=True)
    assert t.compiled == ["triton"]
    t.request(greedy=False)
    assert t.compiled == ["triton", "sampling"]


@needs_gcc
def test_nvcc_without_host_compiler_fails_the_ninja_build(tc, monkeypatch):
    """nvcc without gcc prints ``gcc: No such file or directory`` / ``nvcc fatal   : Failed to preprocess host compiler
    properties.`` (NVlabs/DeepIM-PyTorch#7); cpp_ext.py:340-344 ``msg = "Ninja build failed."`` ... ``raise RuntimeError(msg) from e``."""
    toolchain.Toolchain(args(attention_backend="triton"), FACTS).request(greedy=True)      # Triton's launchers cached (with gcc)
    monkeypatch.setenv("PATH", str(tc.tmp / "empty"))
    t = toolchain.Toolchain(args(attention_backend="triton"), FACTS)
    with pytest.raises(toolchain.FirstForwardError) as ei:
        t.request(greedy=False)
    e = ei.value
    assert e.exc_line.startswith("RuntimeError: Ninja build failed. Ninja output:\n") and e.runtime_error
    assert "gcc: No such file or directory\nnvcc fatal   : Failed to preprocess host compiler properties.\n" in e.exc_line
    text = toolchain.render(toolchain.REQUEST_OUTER, e)
    assert "The above exception was the direct cause of the following exception:" in text
    assert "subprocess.CalledProcessError: Command '['ninja', '-v', '-C'" in text


def test_nvcc_standin_version_and_get_cuda_version(tc):
    """cpp_ext.py:72-79: ``subprocess.check_output([nvcc, "--version"], text=True)``, ``re.findall(r"release (\\d+\\.\\d+),", txt)``."""
    out = subprocess.check_output([str(tc.cuda / "bin" / "nvcc"), "--version"], universal_newlines=True)
    assert out.startswith("nvcc: NVIDIA (R) Cuda compiler driver\n")
    assert "Cuda compilation tools, release 13.0, V13.0.88\n" in out
    assert toolchain.get_cuda_version() == "13.0"


def test_defaults_without_the_variables(tmp_path, monkeypatch):
    """triton knobs.py:343-353: ``TRITON_CACHE_DIR``, else ``os.path.join(TRITON_HOME or expanduser("~/"), ".triton", "cache")``;
    flashinfer jit/env.py:51-55: ``os.getenv("FLASHINFER_WORKSPACE_BASE", pathlib.Path.home())`` / ".cache" / "flashinfer"."""
    for var in ("TRITON_CACHE_DIR", "TRITON_HOME", "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert toolchain.triton_cache_dir() == os.path.join(str(tmp_path), ".triton", "cache")
    assert toolchain.jit_dir() == os.path.join(str(tmp_path), ".cache", "flashinfer", "0.6.8.post1", "86", "cached_ops")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/srv/c/triton")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", "/srv/c/flashinfer")
    assert toolchain.triton_cache_dir() == "/srv/c/triton"
    assert toolchain.jit_dir() == "/srv/c/flashinfer/.cache/flashinfer/0.6.8.post1/86/cached_ops"


def test_nvcc_wheel_layout_is_the_real_ones(tmp_path):
    """The real nvidia_cuda_nvcc-13.0.88 RECORD: ``nvidia/cu13/bin/nvcc``, ``nvidia/cu13/include/fatbinary_section.h``;
    top_level.txt ``nvidia``; WHEEL tags py3-none-manylinux2014_x86_64 / manylinux_2_17_x86_64."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("kpro_lab_sglang_build_wheel", os.path.join(STANDIN, "build_wheel.py"))
    build_wheel = importlib.util.module_from_spec(spec)     # not "build_wheel" in sys.modules: the torch stand-in has one too
    spec.loader.exec_module(build_wheel)
    whl = build_wheel.build_nvcc(str(tmp_path / "a"))
    again = build_wheel.build_nvcc(str(tmp_path / "b"))
    assert os.path.basename(whl) == "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    with open(whl, "rb") as f1, open(again, "rb") as f2:
        assert f1.read() == f2.read()
    with zipfile.ZipFile(whl) as z:
        info = z.getinfo("nvidia/cu13/bin/nvcc")
        assert stat.S_IMODE(info.external_attr >> 16) == 0o755
        names = z.namelist()
        assert "nvidia/cu13/include/fatbinary_section.h" in names and "nvidia/__init__.py" not in names
        wheel = z.read("nvidia_cuda_nvcc-13.0.88.dist-info/WHEEL").decode()
        assert "Tag: py3-none-manylinux2014_x86_64\nTag: py3-none-manylinux_2_17_x86_64\n" in wheel


# ---- through the server (the Lab fixture of test_sglang_standin.py: a temporary state, model and caches) ----------

from test_sglang_standin import GOOD, lab, order_ok  # noqa: E402,F401  (lab: the fixture)


@needs_gcc
def test_server_without_a_c_compiler_fails_in_graph_capture(lab):
    """sglang 0.5.11 cuda_graph_runner.py:711-718 (the capture's RuntimeError wrapped), scheduler.py's exception handler
    (``Scheduler hit an exception``), then the main process's SIGQUIT handler kills the tree (137)."""
    lab.start(GOOD, extra={"PATH": str(lab.bindir)})       # nvidia-smi only: no gcc, no clang, no CC
    rc, _out = lab.wait(60)
    text = lab.text()
    assert rc == -9, text[-3000:]
    order_ok(text, ["Capture cuda graph begin.", "Scheduler hit an exception: Traceback (most recent call last):",
                    "RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl.",
                    "During handling of the above exception, another exception occurred:",
                    "Exception: Capture cuda graph failed: Failed to find C compiler.",
                    "Received sigquit from a child process. It usually means the child failed."])
    assert "Capture cuda graph end." not in text and "Uvicorn running" not in text


@needs_gcc
def test_server_with_graphs_off_compiles_at_the_warmup_and_a_second_start_compiles_nothing(lab, tmp_path):
    """With --disable-cuda-graph the first forward is the warmup request (http_server.py's _execute_server_warmup): no nvcc
    there (CUDA_HOME without bin/nvcc) is FlashInfer's ``Ninja build failed`` out of the request's prefill plan."""
    empty = tmp_path / "no-cuda"
    (empty / "bin").mkdir(parents=True)
    lab.start(GOOD + ["--disable-cuda-graph", "--attention-backend", "flashinfer"], extra={"CUDA_HOME": str(empty)})
    rc, _out = lab.wait(60)
    text = lab.text()
    assert rc == -9, text[-3000:]
    order_ok(text, ["Uvicorn running", "Scheduler hit an exception: Traceback (most recent call last):",
                    "The above exception was the direct cause of the following exception:",
                    "flashinfer/prefill.py\", line 1999, in plan", "RuntimeError: Ninja build failed. Ninja output:",
                    "/bin/nvcc: not found", "Received sigquit from a child process."])
    assert "Capture cuda graph failed" not in text and "fired up and ready to roll" not in text
    # with the nvcc stand-in: the warmup compiles, the server comes up; a second start finds everything cached
    lab.start(GOOD + ["--disable-cuda-graph", "--attention-backend", "flashinfer"])
    assert lab.wait_for(lambda: "The server is fired up and ready to roll!" in lab.text(), 60), lab.text()[-3000:]
    jit = tmp_path / "cache" / "flashinfer" / ".cache" / "flashinfer" / "0.6.8.post1" / "86" / "cached_ops"
    built = sorted(p.name for p in jit.glob("*/*.so"))
    # GQA group 24/4 = 6 with a bf16 cache: tensor-core decode, so the prefill module serves both (one .so)
    assert len(built) == 1 and built[0].startswith("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16"), built
    stamp = [p.stat().st_mtime_ns for p in sorted(jit.glob("*/*.so"))]
    lab.proc.kill()
    lab.proc.wait(10)
    lab.wait_baseline(10)
    lab.start(GOOD + ["--disable-cuda-graph", "--attention-backend", "flashinfer"])
    assert lab.wait_for(lambda: "The server is fired up and ready to roll!" in lab.text(), 60), lab.text()[-3000:]
    assert [p.stat().st_mtime_ns for p in sorted(jit.glob("*/*.so"))] == stamp
