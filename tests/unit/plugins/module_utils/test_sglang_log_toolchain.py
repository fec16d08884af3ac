# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""runtime_toolchain_missing (issue 27): the first forward died because the container lacks a compiler, header, nvcc or ninja.

Real published logs (tests/unit/fixtures/sglang_logs/runtime_toolchain_missing_*.log, '# split:' in each header). The
candidates were listed in the order the searches found them and split by alternation before their text was read:

  tune:     sglang#1067, vllm#2997, gpustack#1242, flashinfer#1781, flashinfer#3386 (PR), sglang#36058
  held-out: sglang#1117, vllm#15329, vllm#27890, flashinfer#1919, sglang#5389, vllm#36077

Dropped because the stored text of the thread has no error line to quote (only a traceback head, an environment
dump, or the nvcc command line): sglang#1067, vllm#2997, flashinfer#3386 (tune); vllm#27890, vllm#36077 (held-out).
sglang#5389's stored excerpt has the ninja CalledProcessError inside graph capture but not nvcc's
'cuda_fp8.h: No such file or directory' line (only its title names it): scored as a held-out miss, not kept as a
fixture (its excerpt names no missing piece, so no phase of ours can be asserted for it).
Also relabelled: runtime_toolchain_missing_slurmv4_3-14.log (was cuda_graph_failed_slurmv4_3-14.log: 'cannot find -lcudart'
inside 'Capture cuda graph failed'); it is in neither half (it was in the suite before the rules were written).

Score with the rules as written from the tune half and the sources (test_held_out_score prints it):
  tune 3/3, held-out 3/4 (the miss: sglang#5389, diagnosed init_failed_before_gpu from its excerpt).
"""

from __future__ import annotations

import glob
import os
import re

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log as sl

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "sglang_logs")
PHASE = "runtime_toolchain_missing"


def read(name):
    with open(os.path.join(FIX, name), encoding="utf-8") as f:
        return f.read()


def _loading_until(marker):
    lines = read("synthetic_ready_tp2_nextn.log").splitlines()
    return "\n".join(lines[:next(i for i, line in enumerate(lines) if marker in line)]) + "\n"


SITE = "/opt/kpro/sglang-venv/lib/python3.11/site-packages"
# SGLang 0.5.11's capture: the scheduler's traceback, re-raised by cuda_graph_runner.py as "Capture cuda graph failed"
CAPTURE_HEAD = (
    "[2026-03-01 10:01:20 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "%s/sglang/srt/model_executor/cuda_graph_runner.py", line 372, in __init__\n'
    "    self.capture()\n"
    '  File "%s/sglang/srt/model_executor/cuda_graph_runner.py", line 526, in capture\n'
    "    _capture_one_stream()\n" % (SITE, SITE))
POSSIBLE = ("Possible solutions:\n"
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n\n"
            "[2026-03-01 10:01:20] Received sigquit from a child process. It usually means the child failed.\n")


def _capture(before, exc):
    """A launch that loaded, began capturing, printed ``before`` (a compiler's output) and died with ``exc``."""
    return _loading_until("Capture cuda graph end") + before + CAPTURE_HEAD + exc + "\n" + POSSIBLE


GCC_CMD = ("Command '['/usr/bin/gcc', '/tmp/tmpq1w2e3/cuda_utils.c', '-O3', '-shared', '-fPIC', '-Wno-psabi', '-o', "
           "'/tmp/tmpq1w2e3/cuda_utils.cpython-311-x86_64-linux-gnu.so', '-lcuda', '-I/usr/include/python3.11']' "
           "returned non-zero exit status 1.")

# (the line the library prints, the source it follows, what the remedy must name)
RULES = [
    # triton 3.6.0 runtime/build.py:33: raise RuntimeError("Failed to find C compiler. Please specify via CC environment
    # variable or set triton.knobs.build.impl.")
    ("RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl.",
     "a C compiler (gcc)", "the Debian package gcc"),
    # triton 3.6.0 runtime/build.py:34-48: gcc compiles cuda_utils.c with -I<sysconfig include>; gcc's own error line
    ("/tmp/tmpq1w2e3/cuda_utils.c:6:10: fatal error: Python.h: No such file or directory",
     "the Python headers (Python.h)", "python3.11-dev"),
    # flashinfer 0.6.8.post1 jit/cpp_ext.py:61-63: raise RuntimeError(f"Could not find nvcc and default {cuda_home=} doesn't exist")
    ("RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist", "the CUDA compiler (nvcc)",
     "nvidia-cuda-nvcc"),
    # flashinfer jit/cpp_ext.py get_cuda_version: subprocess.check_output([nvcc, "--version"]) without the binary
    ("FileNotFoundError: [Errno 2] No such file or directory: '/usr/local/cuda/bin/nvcc'", "the CUDA compiler (nvcc)", "CUDA_HOME"),
    # flashinfer 0.6.8.post1 jit/cpp_ext.py:315-323: subprocess.run(["ninja", "-v", "-C", ...]) without ninja on PATH
    ("FileNotFoundError: [Errno 2] No such file or directory: 'ninja'", "ninja", "the ninja wheel in the venv"),
    # nvcc compiling a FlashInfer .cu: -isystem $cuda_home/include without the headers
    ("/x/flashinfer/data/include/flashinfer/utils.cuh:21:10: fatal error: cuda_fp8.h: No such file or directory",
     "the CUDA headers", "nvidia-cuda-nvcc"),
    # flashinfer jit/cpp_ext.py ldflags "-L$cuda_home/lib64", "-lcudart": the wheel has lib/, no lib64/
    ("/usr/bin/ld: cannot find -lcudart: No such file or directory", "the CUDA runtime's link library (libcudart.so under "
     "$CUDA_HOME/lib64)", "lib64 link"),
    # the same ldflags "-L$cuda_home/lib64/stubs", "-lcuda"
    ("/usr/bin/ld: cannot find -lcuda: No such file or directory", "the driver's link library (libcuda.so)", "nvidia_driver mode=userspace"),
    # CUDA's crt/host_config.h: #error -- unsupported GNU version! gcc versions later than 14 are not supported!
    ("/usr/local/cuda/include/crt/host_config.h:143:2: error: #error -- unsupported GNU version! gcc versions later than 14 are "
     "not supported!", "a host compiler this nvcc supports", "g++"),
    # nvcc without a host compiler on PATH
    ("nvcc fatal   : Failed to preprocess host compiler properties.", "a C++ compiler (g++)", "the Debian package g++"),
    # torch/_inductor cpp_builder: raise exc.InvalidCxxCompiler
    ("torch._inductor.exc.InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: (None, 'g++')",
     "a C++ compiler (g++)", "the Debian package g++"),
    # torch/utils/cpp_extension.py get_cxx_compiler: subprocess.check_output(['which', 'c++'])
    ("subprocess.CalledProcessError: Command '['which', 'c++']' returned non-zero exit status 1.", "a C++ compiler (g++)", "g++"),
]


@pytest.mark.parametrize("line,piece,provider", RULES, ids=[r[1] + ":" + r[0][:30] for r in RULES])
def test_each_rule_names_its_piece_and_what_provides_it(line, piece, provider):
    text = _capture(line + "\n", "Exception: Capture cuda graph failed: " + line.split(": ", 1)[-1])
    res = sl.diagnose(text, exit_status=137, process_alive=False)
    assert res["phase"] == PHASE, (res["phase"], res["remedy"])
    assert res["facts"]["missing"] == piece and piece in res["remedy"] and provider in res["remedy"]
    assert "--tags container" in res["remedy"] and "while capturing CUDA graphs" in res["remedy"]
    assert line in res["evidence"] and res["facts"]["failed_stage"] == "cuda_graph"


def test_capture_wrapper_is_not_cuda_graph_failed():
    # what 0.5.11 prints when gcc lacks Python.h: gcc's line, then the CalledProcessError wrapped by the graph runner
    gcc = "/tmp/tmpq1w2e3/cuda_utils.c:6:10: fatal error: Python.h: No such file or directory\ncompilation terminated.\n"
    text = _capture(gcc, "Exception: Capture cuda graph failed: " + GCC_CMD)
    assert "graph_failed" in sl.parse_log(text)["milestones"]     # the signature cuda_graph_failed is named by
    res = sl.diagnose(text, exit_status=137, process_alive=False, gpu_used_mib=[0, 0])
    assert res["phase"] == PHASE
    assert "python3.11-dev" in res["remedy"] and "--disable-cuda-graph or a lower --mem-fraction-static do not help" in res["remedy"]
    # the evidence keeps the compiler's error, the traceback's head and its exception
    assert gcc.splitlines()[0] in res["evidence"]
    assert any(e.endswith("Scheduler hit an exception: Traceback (most recent call last):") for e in res["evidence"])
    assert any(e.startswith("Exception: Capture cuda graph failed: Command '['/usr/bin/gcc'") for e in res["evidence"])
    assert sl.diagnose(text)["phase"] == PHASE      # the log alone


def test_the_relabelled_real_log_with_the_wrapper():
    res = sl.diagnose(read("runtime_toolchain_missing_slurmv4_3-14.log"))
    assert res["phase"] == PHASE and "libcudart.so" in res["remedy"] and "/usr/bin/ld: cannot find -lcudart" in res["evidence"]


def test_excerpt_with_only_the_traceback_tail():
    # the head (milestones, the traceback's start) cut: only the last frame and the exception
    text = ('  File "%s/triton/runtime/build.py", line 33, in _build\n'
            '    raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable or set '
            'triton.knobs.build.impl.")\n'
            "RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl.\n"
            % SITE)
    res = sl.diagnose(text)
    assert res["phase"] == PHASE and res["facts"]["missing"] == "a C compiler (gcc)"


def test_excerpt_with_only_the_gcc_line_and_the_called_process_error():
    text = ("/tmp/tmpq1w2e3/cuda_utils.c:6:10: fatal error: Python.h: No such file or directory\n"
            "subprocess.CalledProcessError: " + GCC_CMD + "\n")
    res = sl.diagnose(text)
    assert res["phase"] == PHASE and "python3.11-dev" in res["remedy"]


def test_excerpt_with_only_the_called_process_error_still_names_triton_s_toolchain():
    # gcc's own line (printed above the traceback) cut off: the launcher build failed, the remedy names both suspects
    res = sl.diagnose("subprocess.CalledProcessError: " + GCC_CMD + "\n")
    assert res["phase"] == PHASE and "gcc and python3.11-dev" in res["remedy"] and "not in this excerpt" in res["remedy"]


def test_excerpt_with_the_tail_cut_keeps_the_compiler_line():
    text = _loading_until("Capture cuda graph end") + "/tmp/t/cuda_utils.c:6:10: fatal error: Python.h: No such file or directory\n"
    assert sl.diagnose(text, exit_status=137)["phase"] == PHASE
    assert sl.diagnose(text)["phase"] == PHASE


@pytest.mark.parametrize("prefix", ["sglang-1  | ", "Mar 01 10:01:20 ct129 python3[4242]: "])
def test_collector_prefixes(prefix):
    text = _capture("FileNotFoundError: [Errno 2] No such file or directory: 'ninja'\n",
                    "Exception: Capture cuda graph failed: [Errno 2] No such file or directory: 'ninja'")
    prefixed = "".join(prefix + line + "\n" for line in text.splitlines())
    res = sl.diagnose(prefixed, exit_status=137)
    assert res["phase"] == PHASE and res["facts"]["missing"] == "ninja"
    assert all(e in prefixed.splitlines() or e.startswith(("GPU memory", "exit status", "...")) or "... (" in e for e in res["evidence"])
    assert prefix + "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'" in res["evidence"]


def test_warmup_and_first_request():
    up = read("synthetic_ready_tp2_nextn.log")
    cut = up.index("The server is fired up")
    warm = (up[:up.index("Application startup complete")] + "[2026-03-01 10:01:52] Initialization failed. warmup error: "
            "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist\n")
    res = sl.diagnose(warm, exit_status=137)
    assert res["phase"] == PHASE and "warmup_failed" != res["phase"]
    after = up + "[2026-03-01 10:03:00 TP0] Scheduler hit an exception: RuntimeError: Could not find nvcc\n" \
        "[2026-03-01 10:03:00] Received sigquit from a child process. It usually means the child failed.\n"
    res = sl.diagnose(after, exit_status=137)
    assert cut > 0 and res["phase"] == PHASE


def test_negatives_keep_their_phases():
    # a live server that logged a toolchain line without failing: not a failure (yet)
    text = _loading_until("Capture cuda graph end") + "/tmp/t/cuda_utils.c:6:10: fatal error: Python.h: No such file or directory\n"
    assert sl.diagnose(text, process_alive=True)["phase"] == "loading"
    # a line before ready that did not stop the server: ready stays ready
    up = read("synthetic_ready_tp2_nextn.log")
    first_rank_line = up.index("[2026")
    noisy = up[:first_rank_line] + "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'\n" + up[first_rank_line:]
    assert sl.diagnose(noisy)["phase"] == "ready"
    # SGLang's "Ignore import error ... Command '['/usr/bin/gcc', ...]'" warning is not an exception line
    assert sl.diagnose(read("init_failed_before_gpu_sglang_4253.log"))["phase"] == "init_failed_before_gpu"
    # a bare ninja failure names no missing piece: it stays cuda_graph_failed
    bare = _capture("ninja: build stopped: subcommand failed.\n", "Exception: Capture cuda graph failed: RuntimeError: Ninja build failed.")
    assert sl.diagnose(bare, exit_status=137)["phase"] == "cuda_graph_failed"


def _split(name):
    m = re.search(r"^# split: (\S+)", read(name), re.M)
    return m.group(1) if m else None


def test_held_out_score():
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIX, PHASE + "_*.log")))
    score = {}
    for name in names:
        split = _split(name)
        if split:
            got = sl.diagnose(read(name))["phase"]
            score.setdefault(split, []).append(got == PHASE)
    # sglang#5389 (held-out, not kept: see the module docstring) counts as the miss it is
    score["held-out"].append(False)
    print("runtime_toolchain_missing: tune %d/%d, held-out %d/%d" % (
        sum(score["tune"]), len(score["tune"]), sum(score["held-out"]), len(score["held-out"])))
    assert (sum(score["tune"]), len(score["tune"])) == (3, 3)
    assert (sum(score["held-out"]), len(score["held-out"])) == (3, 4)


# --- known_bad_version: sglang 0.5.11 .. 0.5.12.post1's activation.cuh (compat rule sglang-jit-activation-nvcc) -------
# Not a missing tool: the compiler ran and rejected SGLang's own source (jit_kernel/csrc/elementwise/activation.cuh:94-96,
# fixed by sgl-project/sglang PR #26444 in 0.5.13). Real logs, split like the ones above:
#   tune:     sglang#25487 (known_bad_version_sglang_25487.log)
#   held-out: sglang#25682 (cuda_graph_failed_sglang_25682.log: the stored text keeps only the wrapper's first line, so
#             only the capture failure can be named from it; the held-out miss)

JIT_RULE = "sglang-jit-activation-nvcc"
ACT = SITE + "/sglang/jit_kernel/csrc/elementwise/activation.cuh"
# g++ 12.2 under nvcc 13.0.88, sglang 0.5.11's activation.cuh with sglang's flags (reproduced; the anonymous namespace's
# name shortened), as tvm-ffi's build_ninja carries it: "ninja exited with status 1" + "stdout:" + ninja's output
# (apache-tvm-ffi 0.1.x cpp/extension.py:664-671)
ACT_TYPE_VALUE = ("%s:95:52: error: type/value mismatch at argument 1 in template parameter list for \u2018template<class T, bool "
                  "kUsePDL> template<_GLOBAL__N__5f47_act_cu::ActivationKind kAct, bool kFilterExpert> constexpr const auto "
                  "_GLOBAL__N__5f47_act_cu::ActivationKernel<T, kUsePDL>::activation_kernel<kAct, kFilterExpert>\u2019" % ACT)
ACT_NOTE = "%s:95:52: note:   expected a type, got \u2018_GLOBAL__N__5f47_act_cu::ActivationKind::kSiLU\u2019" % ACT
NINJA_OUT = (
    "ninja exited with status 1\nstdout:\n"
    "[1/2] /opt/kpro/sglang-venv/cuda/bin/nvcc  --generate-dependencies-with-compile --dependency-output cuda_0.o.d -Xcompiler "
    "-fPIC -std=c++17 -O2 -gencode=arch=compute_86,code=sm_86 -DSGL_CUDA_ARCH=860 -std=c++20 -O3 --expt-relaxed-constexpr "
    "--use_fast_math -c /root/.cache/tvm-ffi/sgl_kernel_jit_activation_bf16_t_false_0c05/cuda.cu -o cuda_0.o\n"
    "FAILED: cuda_0.o\n"
    "%s:153:42: error: no matching function for call to \u2018_GLOBAL__N__5f47_act_cu::ActivationKernel<T, kUsePDL>::"
    "select_kernel<true>(const std::string&)\u2019\n"
    "%s:153:42:   required from here\n%s\n   95 |   static auto select_kernel(const std::string& type)\n%s\n"
    "ninja: build stopped: subcommand failed.\n" % (ACT, ACT, ACT_TYPE_VALUE, ACT_NOTE))


def _jit_capture():
    """0.5.11's capture when the activation JIT fails: the RuntimeError, re-raised by cuda_graph_runner.py:715-718."""
    frames = ('  File "%s/sglang/jit_kernel/activation.py", line 34, in _jit_activation_module\n    return load_jit(\n'
              '  File "%s/tvm_ffi/cpp/extension.py", line 671, in build_ninja\n    raise RuntimeError("\\n".join(msg))\n'
              % (SITE, SITE))
    return _capture(frames + "RuntimeError: " + NINJA_OUT + "\n", "Exception: Capture cuda graph failed: " + NINJA_OUT)


def _shown(line, evidence):
    """``line`` among the evidence (a line over 400 characters is shown cut, with its length)."""
    return line in evidence or any(e.startswith(line[:400] + "... (") for e in evidence)


def _rule():
    return next(r for r in sl.COMPAT_RULES if r["id"] == JIT_RULE)


def test_activation_compile_error_is_the_known_bad_version():
    text = _jit_capture()
    assert "graph_failed" in sl.parse_log(text)["milestones"]    # what cuda_graph_failed would be named by
    for res in (sl.diagnose(text, exit_status=137, process_alive=False, gpu_used_mib=[0, 0]), sl.diagnose(text)):
        assert res["phase"] == "known_bad_version", (res["phase"], res["remedy"])
        # the compiler's error and its note, with the file; the rule's reason and remedy, from the table
        assert _shown(ACT_TYPE_VALUE, res["evidence"]) and ACT_NOTE in res["evidence"]
        assert "while capturing CUDA graphs" in res["remedy"] and "PR #26444" in res["remedy"]
        assert _rule()["remedy"] in res["remedy"] and "Pin sglang >= 0.5.13" in res["remedy"]
        assert "--disable-cuda-graph or a lower --mem-fraction-static do not help" in res["remedy"]
        assert "--tags container" not in res["remedy"]      # nothing is missing
        assert res["facts"]["compat_rule"] == JIT_RULE and res["facts"]["prs"] == ["#26444"]
        assert res["facts"]["failed_stage"] == "cuda_graph"


def test_activation_compile_error_alone_and_behind_a_collector():
    # an excerpt with only g++'s lines, and the same log through docker compose / journald
    assert sl.diagnose(ACT_TYPE_VALUE + "\n")["phase"] == "known_bad_version"
    assert sl.diagnose(ACT_NOTE + "\n")["phase"] == "known_bad_version"
    # nvcc's own front end prints file(line): the same error
    assert sl.diagnose("%s(95): error: type/value mismatch at argument 1 in template parameter list\n" % ACT)["phase"] == "known_bad_version"
    for prefix in ("sglang-1  | ", "Mar 01 10:01:20 ct129 python3[4242]: "):
        prefixed = "".join(prefix + line + "\n" for line in _jit_capture().splitlines())
        res = sl.diagnose(prefixed, exit_status=137)
        assert res["phase"] == "known_bad_version" and _shown(prefix + ACT_TYPE_VALUE, res["evidence"])


def test_activation_compile_error_at_warmup():
    # with --disable-cuda-graph the first forward is the warmup request (http_server.py: "Initialization failed. warmup error")
    up = read("synthetic_ready_tp2_nextn.log")
    warm = (up[:up.index("Application startup complete")] + "[2026-03-01 10:01:52] Initialization failed. warmup error: "
            "RuntimeError: " + NINJA_OUT)
    res = sl.diagnose(warm, exit_status=137)
    assert res["phase"] == "known_bad_version" and _shown(ACT_TYPE_VALUE, res["evidence"])
    assert "on its warmup request" in res["remedy"]


def test_a_missing_tool_is_still_runtime_toolchain_missing():
    # tvm-ffi with a CUDA_HOME without nvcc: ninja's 127, the shell's line (extension.py:664-671); no compiler error
    ninja127 = ("ninja exited with status 127\nstdout:\n[1/2] /usr/local/cuda/bin/nvcc -c cuda.cu -o cuda_0.o\nFAILED: cuda_0.o\n"
                "/bin/sh: 1: /usr/local/cuda/bin/nvcc: not found\nninja: build stopped: subcommand failed.\n")
    res = sl.diagnose(_capture("", "Exception: Capture cuda graph failed: " + ninja127), exit_status=137)
    assert res["phase"] == PHASE and res["facts"]["missing"] == "the CUDA compiler (nvcc)"


def test_activation_negatives():
    text = _jit_capture()
    cut = text[:text.index("[2026-03-01 10:01:20 TP0] Scheduler hit an exception")] + ACT_TYPE_VALUE + "\n"
    # the process lives on: not a failure (yet)
    assert sl.diagnose(cut, process_alive=True)["phase"] == "loading"
    # a fixture's header or prose that quotes the error without a file path is not a compiler line
    assert sl.diagnose("# evidence: activation.cuh:95:52: error: type/value mismatch at argument 1 in template parameter list\n",
                       process_alive=True)["phase"] == "loading"
    # another kernel's error in a file of another name: not this rule (a bare ninja failure stays cuda_graph_failed)
    other = _capture("", "Exception: Capture cuda graph failed: ninja exited with status 1\nstdout:\n%s/norm.cuh:95:52: error: "
                     "type/value mismatch at argument 1 in template parameter list\n" % SITE)
    assert sl.diagnose(other, exit_status=137)["phase"] == "cuda_graph_failed"


def test_every_known_bad_log_signature_names_a_rule_of_the_table():
    ids = set(r["id"] for r in sl.COMPAT_RULES)
    assert set(rid for _rx, rid in sl._KNOWN_BAD_LOG) <= ids
    assert _rule()["action"] == "warn" and _rule()["architectures"] == ["*"] and _rule()["pr"] == "#26444"


def test_known_bad_version_held_out_score():
    score = {}
    for name in ("known_bad_version_sglang_25487.log", "cuda_graph_failed_sglang_25682.log"):
        got = sl.diagnose(read(name))["phase"]
        score.setdefault(_split(name), []).append(got == "known_bad_version")
    print("known_bad_version (activation.cuh): tune %d/%d, held-out %d/%d" % (
        sum(score["tune"]), len(score["tune"]), sum(score["held-out"]), len(score["held-out"])))
    assert (sum(score["tune"]), len(score["tune"])) == (1, 1)
    assert (sum(score["held-out"]), len(score["held-out"])) == (0, 1)
