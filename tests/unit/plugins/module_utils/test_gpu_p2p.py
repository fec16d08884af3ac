# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two-GPU check (module_utils/serve/gpu_p2p.py): the stamp's key, the script's output, the phase decision, and the
timeout with real child processes that sleep (their process group is killed by the child's PID)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import gpu_p2p as gp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

GPUS = [{"index": 0, "uuid": "GPU-aaaa", "pci_bus_id": "00000000:17:00.0"}, {"index": 1, "uuid": "GPU-bbbb", "pci_bus_id": "00000000:65:00.0"}]
BANNER = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.126.09  Release Build  (dvs-builder@U16-I3-B03-4-3)\n"
ENV = {"nccl_cuda": {}, "others": []}


def _line(step, **kw):
    kw["step"] = step
    return json.dumps(kw)


def _out(*lines):
    return "\n".join(lines) + "\n"


GOOD = _out(
    _line("devices", torch="2.11.0", device_count=2),
    _line("peer_access", peer_access={"0->1": True, "1->0": True}),
    _line("copy", copy_path="direct", copies={
        "0->1": {"expected": 1.0, "wrong": 0, "first": 1.0}, "1->0": {"expected": 2.0, "wrong": 0, "first": 2.0}}),
    _line("all_reduce_start", expected=3.0),
    _line("done", elapsed_s=2.5, all_reduce=[{"device": 0, "expected": 3.0, "wrong": 0, "first": 3.0},
                                             {"device": 1, "expected": 3.0, "wrong": 0, "first": 3.0}]))


def _run(stdout="", rc=0, timed_out=False, stderr="", ended=True):
    return {"rc": rc, "timed_out": timed_out, "ended": ended, "pid": 4242, "stdout": stdout, "stderr": stderr, "elapsed_s": 2.6}


# ---- the stamp ---------------------------------------------------------------------------------------------------

def test_the_stamp_key_holds_driver_kernel_gpus_nccl_environment_and_the_venv_lock():
    env = {"NCCL_P2P_DISABLE": 1, "CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "secret", "SGLANG_LOG_MS": "1"}
    key = gp.stamp_key("580.126.09", "6.8.12-9-pve", GPUS, env, "ab12")
    assert key == {"driver": "580.126.09", "kernel": "6.8.12-9-pve",
                   "gpus": ["00000000:17:00.0 GPU-aaaa", "00000000:65:00.0 GPU-bbbb"],
                   "environment": {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1"}, "venv_lock": "ab12"}
    # the GPUs' order does not matter; other variables do not count
    assert gp.stamp_key("580.126.09", "6.8.12-9-pve", GPUS[::-1], dict(env, HF_TOKEN="other"), "ab12") == key
    for changed in (gp.stamp_key("580.142", "6.8.12-9-pve", GPUS, env, "ab12"),
                    gp.stamp_key("580.126.09", "6.8.12-11-pve", GPUS, env, "ab12"),
                    gp.stamp_key("580.126.09", "6.8.12-9-pve", GPUS[:1], env, "ab12"),
                    gp.stamp_key("580.126.09", "6.8.12-9-pve", [dict(GPUS[0], uuid="GPU-cccc"), GPUS[1]], env, "ab12"),
                    gp.stamp_key("580.126.09", "6.8.12-9-pve", GPUS, dict(env, NCCL_P2P_DISABLE="0"), "ab12"),
                    gp.stamp_key("580.126.09", "6.8.12-9-pve", GPUS, dict(env, NCCL_IB_DISABLE="1"), "ab12"),
                    gp.stamp_key("580.126.09", "6.8.12-9-pve", GPUS, env, "cd34")):
        assert changed != key


def test_host_identity_reads_proc_and_nvml(tmp_path):
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "driver" / "nvidia" / "version").write_text(BANNER)
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "osrelease").write_text("6.8.12-9-pve\n")
    facts = {"available": True, "driver_version": "580.126.09", "gpus": GPUS}
    assert gp.host_identity(str(tmp_path), facts) == ("580.126.09", "6.8.12-9-pve", GPUS)
    # no /proc/driver/nvidia/version (a container without it): NVML's driver version; NVML unavailable: no GPUs
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gp.host_identity(str(empty), facts) == ("580.126.09", None, GPUS)
    assert gp.host_identity(str(empty), {"available": False, "reason": "no_devices"}) == (None, None, [])


def test_a_written_stamp_matches_its_key_only(tmp_path):
    key = gp.stamp_key("580.126.09", "6.8.12-9-pve", GPUS, {}, "ab12")
    path = gp.stamp_path(str(tmp_path / "state"))
    assert not gp.stamp_matches(path, key)
    gp.write_stamp(path, key, {"device_count": 2}, now=1700000000)
    data = json.loads(open(path).read())
    assert data["key"] == key and data["sha256"] == gp.key_digest(key) and data["time"] == 1700000000
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert gp.stamp_matches(path, key)
    assert not gp.stamp_matches(path, dict(key, environment={"NCCL_P2P_DISABLE": "1"}))
    open(path, "w").write("not json")
    assert not gp.stamp_matches(path, key)


# ---- the environment ---------------------------------------------------------------------------------------------

def test_the_child_gets_the_servers_environment_not_the_modules_nccl_settings():
    base = {"PATH": "/usr/bin", "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "3"}
    env = gp.child_environment(base, {"NCCL_IB_DISABLE": 1, "HF_HOME": "/srv/hf"})
    assert env == {"PATH": "/usr/bin", "NCCL_IB_DISABLE": "1", "HF_HOME": "/srv/hf"}
    assert gp.child_environment(base, {"NCCL_P2P_DISABLE": "1"})["NCCL_P2P_DISABLE"] == "1"
    shown = gp.shown_environment({"NCCL_P2P_DISABLE": "1", "HF_TOKEN": "hf_secret", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert shown == {"nccl_cuda": {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1"}, "others": ["HF_TOKEN"]}
    assert "hf_secret" not in json.dumps(shown)


# ---- the script's output and the decision -------------------------------------------------------------------------

def test_the_output_is_merged_from_the_json_lines_and_noise_is_skipped():
    data = gp.parse_output("NCCL INFO something\n{broken\n" + GOOD + "[]\n")
    assert data["steps"] == ["devices", "peer_access", "copy", "all_reduce_start", "done"]
    assert data["device_count"] == 2 and data["peer_access"] == {"0->1": True, "1->0": True} and data["step"] == "done"
    assert gp.parse_output("") == {"steps": []}


def test_a_good_check_passes_with_its_result():
    check = gp.decide(_run(GOOD), ENV, 60)
    assert check["device_count"] == 2 and check["all_reduce"][1]["first"] == 3.0 and check["copy_path"] == "direct"
    assert "step" not in check and check["elapsed_s"] == 2.5


def test_wrong_sums_and_zeros_copied_are_gpu_p2p_wrong_result():
    bad = GOOD.replace('"wrong": 0, "first": 3.0}]', '"wrong": 1048576, "first": 2.0}]').replace(
        '{"expected": 1.0, "wrong": 0, "first": 1.0}', '{"expected": 1.0, "wrong": 1048576, "first": 0.0}')
    env = gp.shown_environment({"NCCL_DEBUG": "WARN"})
    with pytest.raises(Failure) as e:
        gp.decide(_run(bad), env, 60)
    f = e.value
    assert f.phase == "gpu_p2p_wrong_result"
    assert "copy 0->1 (direct): 1048576 of 1048576 values wrong (first 0.0, expected 1.0)" in f.msg
    assert "all-reduce on GPU 1: 1048576 of 1048576 values wrong (first 2.0, expected the sum 3.0)" in f.msg
    assert "peer access (torch.cuda.can_device_access_peer): 0->1 yes, 1->0 yes" in f.evidence
    assert 'environment: {"NCCL_DEBUG": "WARN"} (other variables set: none)' in f.evidence
    assert "NCCL_P2P_DISABLE" in f.remedy and "pcie_acs_override" in f.remedy and "iommu=pt" in f.remedy
    assert f.details["check"]["all_reduce"][1]["wrong"] == 1048576


def test_a_check_cut_off_by_its_timeout_is_gpu_p2p_hang_with_how_far_it_got():
    partial = "\n".join(GOOD.splitlines()[:4]) + "\n"
    with pytest.raises(Failure) as e:
        gp.decide(_run(partial, rc=-9, timed_out=True), ENV, 30)
    f = e.value
    assert f.phase == "gpu_p2p_hang"
    assert f.msg == "the two-GPU check did not finish within 30 s: it hung in the NCCL all-reduce"
    assert "steps reached: devices, peer_access, copy, all_reduce_start" in f.evidence
    assert "elapsed: 2.6 s (exit status -9)" in f.evidence
    with pytest.raises(Failure) as e:
        gp.decide(_run("", rc=None, timed_out=True, ended=False), ENV, 30)
    assert e.value.phase == "gpu_p2p_hang" and "did not end after SIGKILL" in e.value.msg and "step after 'start'" in e.value.msg


def test_an_error_of_the_script_names_where():
    err = _out(_line("error", at="import", error="ModuleNotFoundError: No module named 'torch'"))
    with pytest.raises(Failure) as e:
        gp.decide(_run(err, rc=3), ENV, 60)
    assert e.value.phase == "library_missing" and "No module named 'torch'" in e.value.msg
    nccl = _out(GOOD.splitlines()[0], _line("error", at="all_reduce", error="RuntimeError: NCCL Error 2: unhandled system error"))
    with pytest.raises(Failure) as e:
        gp.decide(_run(nccl, rc=3, stderr="NCCL WARN Cuda failure 'peer access is not supported'\n"), ENV, 60)
    assert e.value.phase == "nccl_error" and "at all_reduce: RuntimeError: NCCL Error 2" in e.value.msg
    assert "stderr: NCCL WARN Cuda failure 'peer access is not supported'" in e.value.evidence
    with pytest.raises(Failure) as e:
        gp.decide(_run("", rc=-11, stderr="Segmentation fault\n"), ENV, 60)
    assert e.value.phase == "nccl_error" and "exit status -11 without a result" in e.value.msg


def test_fewer_than_two_gpus_is_no_failure():
    one = _out(_line("devices", torch="2.11.0", device_count=1), _line("done"))
    assert gp.decide(_run(one), ENV, 60)["device_count"] == 1


# ---- the bounded run, with real processes -------------------------------------------------------------------------

def _gone(pid, within=5.0):
    """True once ``pid`` no longer runs (gone, or a zombie waiting for its new parent)."""
    end = time.time() + within
    while time.time() < end:
        try:
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


SLEEPER = r"""
import json, subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(json.dumps({"step": "devices", "device_count": 2, "grandchild": kid.pid}), flush=True)
print(json.dumps({"step": "all_reduce_start", "expected": 3.0}), flush=True)
time.sleep(120)
"""


def test_a_check_that_does_not_finish_is_killed_by_its_process_group_and_is_gpu_p2p_hang():
    t0 = time.time()
    run = gp.run_bounded([sys.executable, "-c", SLEEPER], dict(os.environ), 2, kill_wait=5)
    took = time.time() - t0
    assert run["timed_out"] and run["ended"] and run["rc"] == -9 and 2 <= took < 8, (run, took)
    data = gp.parse_output(run["stdout"])
    # the output before the kill is kept; the grandchild (same process group) was killed too
    assert data["steps"] == ["devices", "all_reduce_start"]
    assert _gone(run["pid"]) and _gone(data["grandchild"])
    with pytest.raises(Failure) as e:
        gp.decide(run, ENV, 2)
    assert e.value.phase == "gpu_p2p_hang" and "hung in the NCCL all-reduce" in e.value.msg


def test_a_check_that_finishes_in_time_is_not_killed():
    run = gp.run_bounded([sys.executable, "-c", "import sys; print('{\"step\": \"done\"}'); sys.stderr.write('x\\n')"],
                         dict(os.environ), 20)
    assert not run["timed_out"] and run["rc"] == 0 and run["stderr"] == "x\n" and gp.parse_output(run["stdout"])["step"] == "done"


def test_the_script_runs_with_the_servers_environment(tmp_path):
    """check() runs SCRIPT itself; a fake torch on PYTHONPATH (from the server's environment) records what it saw."""
    fake = tmp_path / "fake" / "torch"
    (fake / "cuda").mkdir(parents=True)
    (fake / "__init__.py").write_text("import os\n__version__ = 'fake'\nfrom torch import cuda\n")
    (fake / "cuda" / "__init__.py").write_text(
        "import os\ndef is_available():\n    return True\n"
        "def device_count():\n    raise RuntimeError('saw NCCL_P2P_DISABLE=%s' % os.environ.get('NCCL_P2P_DISABLE'))\n")
    (fake / "cuda" / "nccl.py").write_text("")
    with pytest.raises(Failure) as e:
        gp.check(sys.executable, {"PYTHONPATH": str(tmp_path / "fake"), "NCCL_P2P_DISABLE": "1"}, 30, {"PATH": os.environ["PATH"]})
    assert e.value.phase == "nccl_error" and "saw NCCL_P2P_DISABLE=1" in e.value.msg
    with pytest.raises(Failure) as e:
        gp.check(str(tmp_path / "no-venv" / "bin" / "python"), {}, 30, {})
    assert e.value.phase == "library_missing" and "cannot run the SGLang venv's Python" in e.value.msg
