"""The runtime toolchain look (module_utils/container/toolchain.py): each rule run for real by this machine's Python, in a venv
laid out as the lock's wheels lay it out, with the environment the server's unit gets."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import sysconfig

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import toolchain as tc
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure


def _exe(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


@pytest.fixture()
def venv(tmp_path):
    """A venv of this Python (its own sysconfig), with the nvidia-cuda-nvcc wheel's layout: nvidia/cu13/{bin,include,lib}."""
    v = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True)
    site = v / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages" / "nvidia" / "cu13"
    _exe(str(site / "bin" / "nvcc"), "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                                     "echo 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    os.makedirs(str(site / "include"))
    os.makedirs(str(site / "lib"))
    return str(v)


def _tools(tmp_path, *names):
    """A directory with stand-ins of the named tools (the look only needs them to be executables on PATH)."""
    d = tmp_path / "tools"
    for name in names:
        _exe(str(d / name), "#!/bin/sh\nexit 0\n")
    return str(d)


def _run(argv):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    return p.returncode, p.stdout, p.stderr


def _look(venv, tools, **extra):
    env = tc.runtime_environment(venv)
    env["PATH"] = env["PATH"].replace(tc.BASE_PATH, tools)   # only the tools this test gives, not this machine's
    env.update(extra)
    return tc.look(os.path.join(venv, "bin", "python"), env, _run)


def test_links_make_cuda_home_with_lib64_into_the_wheel(venv, tmp_path):
    # flashinfer 0.6.8.post1 jit/cpp_ext.py:221-226 links "-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda";
    # the CUDA 13 wheel ships lib/ with libcudart.so.13 only (flashinfer #5064): lib64 holds the unversioned name
    toolkit = tc.toolkit_dir(venv)
    assert toolkit.endswith(os.path.join("nvidia", "cu13"))
    for name in ("libcudart.so.13", "libcudart_static.a", "libnvrtc.so.13", "libnvrtc.so"):
        open(os.path.join(toolkit, "lib", name), "w").close()
    libcuda = tmp_path / "libcuda.so.1"
    libcuda.write_text("")
    changes = tc.link_changes(venv, toolkit, str(libcuda))
    home = tc.cuda_home(venv)
    assert sorted(os.path.relpath(link, home) for link, _t in changes) == [
        "bin", "include", "lib", "lib64/libcudart.so", "lib64/libcudart.so.13", "lib64/libcudart_static.a",
        "lib64/libnvrtc.so", "lib64/libnvrtc.so.13", "lib64/stubs/libcuda.so"]
    tc.make_links(changes)
    assert os.path.realpath(os.path.join(home, "lib64", "libcudart.so")) == os.path.realpath(os.path.join(toolkit, "lib", "libcudart.so.13"))
    assert os.path.realpath(os.path.join(home, "lib64", "stubs", "libcuda.so")) == str(libcuda)
    assert all(not os.path.isabs(os.readlink(os.path.join(home, n))) for n in ("bin", "include", "lib", "lib64/libcudart.so"))
    assert tc.link_changes(venv, toolkit, str(libcuda)) == []   # the second run changes nothing
    os.unlink(os.path.join(toolkit, "lib", "libnvrtc.so.13"))  # a file a newer wheel dropped: its link goes
    gone = tc.link_changes(venv, toolkit, str(libcuda))
    assert gone == [(os.path.join(home, "lib64", "libnvrtc.so.13"), None)]
    tc.make_links(gone)
    assert not os.path.lexists(os.path.join(home, "lib64", "libnvrtc.so.13"))


def test_links_stay_valid_in_a_hard_linked_copy_of_the_venv(venv, tmp_path):
    tc.make_links(tc.link_changes(venv, tc.toolkit_dir(venv)))
    copy = str(tmp_path / "kept")
    subprocess.run(["cp", "-al", venv, copy], check=True)
    assert os.path.isfile(os.path.join(tc.cuda_home(copy), "bin", "nvcc"))


def test_everything_found_with_the_units_environment(venv, tmp_path):
    tc.make_links(tc.link_changes(venv, tc.toolkit_dir(venv)))
    found = _look(venv, _tools(tmp_path, "gcc", "g++", "ninja"))
    assert found["nvcc"] == "13.0" and found["cuda_home"] == tc.cuda_home(venv)
    assert found["c_compiler"].endswith("/gcc") and found["host_cxx"].endswith("/g++") and found["ninja"].endswith("/ninja")
    if os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        assert found["python_headers"].endswith("Python.h")
    assert tc.problems(dict(found, python_headers="/x/Python.h"), "13") == []


def test_no_c_compiler_by_tritons_rule(venv, tmp_path):
    # triton 3.6.0 runtime/build.py:26-33: cc = $CC, else which("gcc"), else which("clang"), else
    # "Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."
    tc.make_links(tc.link_changes(venv, tc.toolkit_dir(venv)))
    tools = _tools(tmp_path, "g++", "ninja")
    assert _look(venv, tools)["c_compiler"] is None
    assert _look(venv, _tools(tmp_path, "clang"))["c_compiler"].endswith("/clang")
    assert _look(venv, tools, CC="/opt/cc")["c_compiler"] == "/opt/cc"   # $CC is taken as it is, as triton does


def test_python_headers_by_tritons_scheme_rule(venv, tmp_path):
    # triton 3.6.0 runtime/build.py:34-39: the include dir of sysconfig's default scheme, posix_local read as posix_prefix
    found = _look(venv, _tools(tmp_path, "gcc"))
    scheme = sysconfig.get_default_scheme()
    want = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]
    assert os.path.realpath(found["python_include"]) == os.path.realpath(want)
    assert (found["python_headers"] is not None) == os.path.isfile(os.path.join(want, "Python.h"))


def test_nvcc_by_flashinfers_rule(venv, tmp_path):
    # flashinfer 0.6.8.post1 jit/cpp_ext.py:48-64: CUDA_HOME or CUDA_PATH, else dirname(dirname(which nvcc)),
    # else /usr/local/cuda when it exists, else "Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"
    tools = _tools(tmp_path, "gcc", "g++", "ninja")
    found = _look(venv, tools)                       # CUDA_HOME=<venv>/cuda, not linked yet
    assert found["nvcc"] is None
    assert ("nvcc", "no nvcc under CUDA_HOME %s" % tc.cuda_home(venv)) in tc.problems(found)
    toolkit = tc.toolkit_dir(venv)
    env_home = _look(venv, tools, CUDA_HOME=toolkit)  # the inventory's CUDA_HOME wins, as in flashinfer
    assert env_home["nvcc"] == "13.0" and env_home["cuda_home"] == toolkit


def test_nvcc_of_another_major_than_torch_is_refused():
    found = {"c_compiler": "/usr/bin/gcc", "python_headers": "/usr/include/python3.11/Python.h", "nvcc": "12.8",
             "cuda_home": "/opt/sglang/venv/cuda", "host_cxx": "/usr/bin/g++", "ninja": "/opt/sglang/venv/bin/ninja"}
    assert tc.problems(found, "12") == []
    assert tc.problems(found, "13") == [("nvcc", "nvcc 12.8 under /opt/sglang/venv/cuda, but torch is built for CUDA 13")]


def test_torch_cuda_major_from_torch_version_py(venv):
    assert tc.torch_cuda_major(venv) == ""
    tdir = os.path.join(os.path.dirname(tc.toolkit_dir(venv)), "..", "torch")
    os.makedirs(tdir)
    with open(os.path.join(tdir, "version.py"), "w") as f:
        f.write("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip = None\n")
    assert tc.torch_cuda_major(venv) == "13"


def test_refusal_names_each_piece_its_source_and_provider():
    found = {"c_compiler": None, "python_headers": None, "nvcc": "13.0", "cuda_home": "/v/cuda", "host_cxx": "/usr/bin/g++",
             "ninja": "/v/bin/ninja"}
    e = tc.refusal(tc.problems(found, "13"), "/v", "/v/lib/python3.11/site-packages/nvidia/cu13")
    assert isinstance(e, Failure) and e.phase == "runtime_toolchain_missing"
    assert "c_compiler, python_headers missing" in e.msg
    assert any("runtime/build.py:26-33" in line and "gcc" in line for line in e.evidence)
    assert any("Python.h" in line and "python3-dev" in line for line in e.evidence)
    assert "--tags container" in e.remedy
    assert tc.refusal([], "/v", None) is None


def test_a_venv_without_the_nvcc_wheel_says_to_regenerate_the_lock(tmp_path):
    e = tc.refusal([("nvcc", "no nvcc under CUDA_HOME /v/cuda")], "/v", None)
    assert any("no nvidia-cuda-nvcc" in line and "make sglang-lock" in line for line in e.evidence)


def test_runtime_environment_puts_every_cache_in_one_directory():
    env = tc.runtime_environment("/opt/sglang/venv", "/srv/models/sglang-compile-cache")
    assert env["PATH"].startswith("/opt/sglang/venv/bin:/opt/sglang/venv/cuda/bin:")
    assert env["CUDA_HOME"] == "/opt/sglang/venv/cuda"
    assert env["TRITON_CACHE_DIR"] == "/srv/models/sglang-compile-cache/triton"
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/srv/models/sglang-compile-cache/flashinfer"
    assert set(tc.runtime_environment("/v")) == {"PATH", "CUDA_HOME"}


def test_cache_report_warm_when_a_launch_added_no_file(tmp_path):
    d = tmp_path / "cache"
    assert tc.count_files(str(d)) == 0 and tc.count_files("") is None
    (d / "triton" / "abc").mkdir(parents=True)
    (d / "triton" / "abc" / "cuda_utils.so").write_bytes(b"x")
    assert tc.cache_report(str(d), 0) == {"dir": str(d), "files_before": 0, "files_after": 1, "warm": False}
    assert tc.cache_report(str(d), 1)["warm"] is True
    assert tc.cache_report(str(d), None) is None


def test_look_failure_is_a_phase_not_a_traceback(tmp_path):
    bad = tmp_path / "python"
    _exe(str(bad), "#!/bin/sh\necho boom >&2\nexit 3\n")
    with pytest.raises(Failure) as e:
        tc.look(str(bad), {"PATH": "/usr/bin"}, _run)
    assert e.value.phase == "runtime_toolchain_missing" and "boom" in e.value.msg


def test_look_script_prints_one_json_line(venv, tmp_path):
    out = subprocess.run([os.path.join(venv, "bin", "python"), "-c", tc.LOOK_PY], stdout=subprocess.PIPE,
                         universal_newlines=True, env={"PATH": _tools(tmp_path)}, check=True).stdout
    assert set(json.loads(out)) == {"c_compiler", "python_headers", "python_include", "cuda_home", "nvcc", "host_cxx", "ninja"}
    assert stat.S_ISDIR(os.stat(venv).st_mode)


def test_check_mode_reports_what_the_run_installs_first_and_refuses_the_rest():
    found = [("c_compiler", "not found"), ("python_headers", "not found"), ("nvcc", "no nvcc under CUDA_HOME /v/cuda"),
             ("ninja", "not found")]
    comes, left = tc.provided(found, ["gcc", "python3-dev"], linking=True)
    assert comes == ["c_compiler", "python_headers", "nvcc"] and left == [("ninja", "not found")]
    assert tc.provided(found, [], linking=False) == ([], found)
