# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two-GPU check before a tensor-parallel launch (issue 27): peer access, a GPU-to-GPU copy and an NCCL
all-reduce, run in the SGLang venv with the server's environment, bounded by a timeout.

TP over PCIe with ACS or the IOMMU in the way hangs NCCL or copies zeros (NVIDIA/nccl #2079, #631;
tinygrad/open-gpu-kernel-modules #18); without this check the gate waits out its stall budget and says ``timeout``.
Here the hang is ``gpu_p2p_hang`` after at most ``timeout`` seconds (the child's process group is SIGKILLed by its
PID, never by name), wrong data is ``gpu_p2p_wrong_result``, each with the evidence (peer access per pair, the
copies, the sums, the environment used) and the remedies. A pass is stamped in the state dir, keyed by
:func:`stamp_key`: the driver, the kernel, the GPUs, the NCCL environment and the venv's lock; a matching stamp
skips the check (the idempotent re-run runs nothing).

The script (:data:`SCRIPT`) is real PyTorch, one process: ``torch.cuda.device_count()``,
``torch.cuda.can_device_access_peer(i, j)``, ``Tensor.to("cuda:j")`` (a device-to-device copy; through host memory
when NCCL_P2P_DISABLE=1, as NCCL's traffic then goes) compared on the host, and
``torch.cuda.nccl.all_reduce(list_of_tensors)`` (one tensor per GPU; torch/cuda/nccl.py:
``def all_reduce(inputs, outputs=None, op=SUM, streams=None, comms=None)``, in place when ``outputs`` is None). It
prints one JSON line per step, so a hang still shows how far it got.

What only a run on real GPUs can confirm (the lab's torch is a stand-in, tests/lab/torch_standin):
- that single-process ``torch.cuda.nccl.all_reduce`` takes the transport SGLang's NCCL communicator takes (P2P over
  PCIe, or SHM with NCCL_P2P_DISABLE=1), so that a host where it hangs or sums wrong is one where TP hangs or is
  wrong, and one where it passes is not (NCCL can choose another path in a multi-process group);
- that an ACS/IOMMU host shows the failure within the timeout at 4 MiB per GPU (the default 60 s includes the CUDA
  and NCCL init: seconds on a healthy host), and that SIGKILL ends a process stuck in an NCCL kernel (a process in
  uninterruptible sleep is reported as not ended);
- that NCCL_P2P_DISABLE=1 cures it on such a host; the copy is then made through host memory, so CUDA P2P that
  SGLang's own custom all-reduce uses is not tested with it set: the remedy says to set disable_custom_all_reduce too;
- the torch API against the v2.11.0 tag itself: it was read in pytorch's main-line torch/cuda/nccl.py (the same
  signature since torch 1.x); the tag's tree could not be fetched here;
- the check's cost on GPUs a running server holds (a CUDA context and NCCL buffers on each GPU, a few hundred MiB).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write, load_json, read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.nvml import read_proc_driver_version

STAMP_NAME = "gpu-p2p.json"
# the environment that decides NCCL's and CUDA's paths: in the stamp's key, shown in the evidence with its values
KEY_ENV_PREFIXES = ("NCCL_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
KILL_WAIT_S = 10
ELEMENTS = 1 << 20  # float32 per GPU: 4 MiB, past NCCL's small-message protocol

REMEDY = (
    "NCCL_P2P_DISABLE: \"1\" in sglang_server_environment, with disable_custom_all_reduce: true in sglang_server_options "
    "(SGLang's custom all-reduce uses CUDA P2P itself); cost: the all-reduce goes through host memory, lower TP throughput. "
    "Or let the GPUs really talk: disable ACS on the PCIe switches / root ports in the BIOS, or boot with "
    "pcie_acs_override=downstream,multifunction (a kernel with the ACS override patch; cost: devices are no longer isolated "
    "from each other, IOMMU groups merge, weaker security for VFIO guests); and check the IOMMU mode: iommu=pt "
    "(intel_iommu=on iommu=pt or amd_iommu=on iommu=pt) on the kernel command line. The check runs again on the next run "
    "(no pass is stamped); sglang_server_p2p_check: false skips it knowingly.")

SCRIPT = r"""
import json, os, sys, time
t0 = time.time()
def emit(step, **kw):
    kw.update(step=step, elapsed_s=round(time.time() - t0, 3))
    sys.stdout.write(json.dumps(kw, sort_keys=True) + "\n")
    sys.stdout.flush()
step = "import"
try:
    import torch
    import torch.cuda.nccl
    step = "devices"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    emit("devices", torch=str(torch.__version__), device_count=n)
    if n < 2:
        emit("done")
        sys.exit(0)
    step = "peer_access"
    peer = dict(("%d->%d" % (i, j), bool(torch.cuda.can_device_access_peer(i, j))) for i in range(n) for j in range(n) if i != j)
    emit(step, peer_access=peer)
    step = "copy"
    direct = os.environ.get("NCCL_P2P_DISABLE", "") != "1"
    copies = {}
    for i in range(n):
        j = (i + 1) % n
        src = torch.full((N,), float(i + 1), dtype=torch.float32, device="cuda:%d" % i)
        dst = src.to("cuda:%d" % j) if direct else src.cpu().to("cuda:%d" % j)
        torch.cuda.synchronize(j)
        got = dst.cpu().tolist()
        copies["%d->%d" % (i, j)] = {"expected": float(i + 1), "wrong": sum(1 for v in got if v != i + 1), "first": got[0]}
    emit(step, copies=copies, copy_path="direct" if direct else "host")
    step = "all_reduce"
    tensors = [torch.full((N,), float(i + 1), dtype=torch.float32, device="cuda:%d" % i) for i in range(n)]
    expected = float(n * (n + 1) // 2)
    emit("all_reduce_start", expected=expected)
    torch.cuda.nccl.all_reduce(tensors)
    sums = []
    for i, t in enumerate(tensors):
        torch.cuda.synchronize(i)
        got = t.cpu().tolist()
        sums.append({"device": i, "expected": expected, "wrong": sum(1 for v in got if v != expected), "first": got[0]})
    emit("done", all_reduce=sums)
except Exception as e:
    emit("error", at=step, error="%s: %s" % (type(e).__name__, e))
    sys.exit(3)
""".replace("(N,)", "(%d,)" % ELEMENTS)


# ---- the stamp ---------------------------------------------------------------------------------------------------

def key_environment(environment):
    """The part of the server's environment that decides NCCL's and CUDA's paths (names and values)."""
    return dict((k, str(v)) for k, v in sorted((environment or {}).items()) if k.startswith(KEY_ENV_PREFIXES))


def stamp_key(driver, kernel, gpus, environment, venv_lock):
    """What a pass depends on: the driver version, the kernel release, the GPUs (bus id and UUID, in bus order), the
    NCCL/CUDA environment and the venv's lock (a new torch brings a new NCCL)."""
    ids = sorted("%s %s" % (g.get("pci_bus_id") or g.get("bdf") or "?", g.get("uuid") or "?") for g in gpus or [])
    return {"driver": driver or None, "kernel": kernel or None, "gpus": ids, "environment": key_environment(environment),
            "venv_lock": venv_lock or None}


def key_digest(key):
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def host_identity(proc_root, facts):
    """(driver version, kernel release, gpus) of this host: /proc/driver/nvidia/version (else NVML's driver version),
    /proc/sys/kernel/osrelease, NVML's GPUs (``facts``: nvml.gpu_facts(); none when NVML is unavailable)."""
    kmod = read_proc_driver_version(proc_root)
    driver = (kmod or {}).get("version") or (facts or {}).get("driver_version")
    kernel = read_text(os.path.join(proc_root, "sys", "kernel", "osrelease"), strip=True)
    gpus = (facts or {}).get("gpus") if (facts or {}).get("available") else []
    return driver, kernel, gpus


def stamp_path(state_dir):
    return os.path.join(state_dir, STAMP_NAME)


def stamp_matches(path, key):
    data = load_json(path, default={})
    return isinstance(data, dict) and data.get("key") == key


def write_stamp(path, key, result, now=None):
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        os.makedirs(d, 0o755)
    data = {"key": key, "sha256": key_digest(key), "passed": result, "time": int(now if now is not None else time.time())}
    atomic_write(path, (json.dumps(data, sort_keys=True, indent=1) + "\n").encode("utf-8"), mode=MODE_DEFAULT,
                 default_mode=0o644, unique_tmp=True)


# ---- the run -----------------------------------------------------------------------------------------------------

def child_environment(base, environment):
    """The server's environment for the check: ``base`` (the module's) without its own NCCL/CUDA settings, then
    ``environment`` (sglang_server_environment, values as strings), as the unit would have it."""
    env = dict((k, v) for k, v in (base or {}).items() if not k.startswith(KEY_ENV_PREFIXES))
    env.update((k, str(v)) for k, v in (environment or {}).items())
    return env


def shown_environment(environment):
    """The environment for the evidence: NCCL/CUDA values, and only the names of the rest (they may be secrets)."""
    env = environment or {}
    return {"nccl_cuda": key_environment(env), "others": sorted(k for k in env if not k.startswith(KEY_ENV_PREFIXES))}


def kill_group(pid):
    """SIGKILL the check's process group (its own session: the group's id is the child's PID)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(argv, env, timeout, kill_wait=KILL_WAIT_S):
    """Run ``argv`` in a session of its own; after ``timeout`` seconds its process group is killed by the child's PID.
    Returns {rc, timed_out, ended, stdout, stderr, elapsed_s, pid}; the output up to the kill is kept."""
    t0 = time.monotonic()
    # not run_command: it has no timeout, and the child must be a session of its own to kill its group
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pylint: disable=ansible-bad-function
                            env=env, cwd="/", start_new_session=True)
    timed_out, ended = False, True
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=kill_wait)
        except subprocess.TimeoutExpired:     # stuck in the kernel (uninterruptible): reported, not waited for
            out, err, ended = b"", b"", False
    return {"rc": proc.returncode, "timed_out": timed_out, "ended": ended, "pid": proc.pid,
            "stdout": (out or b"").decode("utf-8", "replace"), "stderr": (err or b"").decode("utf-8", "replace"),
            "elapsed_s": round(time.monotonic() - t0, 3)}


# ---- the decision ------------------------------------------------------------------------------------------------

def parse_output(stdout):
    """The script's JSON lines merged into one dict (later steps win); ``steps``: the steps reached, in order."""
    out = {"steps": []}
    for line in (stdout or "").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out["steps"].append(d.get("step"))
            out.update(d)
    return out


def wrong_parts(data):
    """What came back wrong: ["copy 0->1: 1048576 of 1048576 values wrong (first 0.0, expected 1.0)", ...]."""
    out = []
    for pair, c in sorted((data.get("copies") or {}).items()):
        if c.get("wrong"):
            out.append("copy %s (%s): %d of %d values wrong (first %s, expected %s)"
                       % (pair, data.get("copy_path"), c["wrong"], ELEMENTS, c.get("first"), c.get("expected")))
    for s in data.get("all_reduce") or []:
        if s.get("wrong"):
            out.append("all-reduce on GPU %s: %d of %d values wrong (first %s, expected the sum %s)"
                       % (s.get("device"), s["wrong"], ELEMENTS, s.get("first"), s.get("expected")))
    return out


def evidence(data, run, env_shown):
    peer = ", ".join("%s %s" % (p, "yes" if v else "no") for p, v in sorted((data.get("peer_access") or {}).items()))
    out = ["GPUs visible to torch %s: %s" % (data.get("torch", "?"), data.get("device_count", "?")),
           "peer access (torch.cuda.can_device_access_peer): %s" % (peer or "not reached"),
           "steps reached: %s" % (", ".join(s for s in data["steps"] if s) or "none"),
           "elapsed: %.1f s (exit status %s)" % (run["elapsed_s"], run["rc"]),
           "environment: %s (other variables set: %s)" % (json.dumps(env_shown["nccl_cuda"], sort_keys=True),
                                                          ", ".join(env_shown["others"]) or "none")]
    tail = [ln for ln in run["stderr"].splitlines() if ln.strip()][-8:]
    return out + (["stderr: " + ln for ln in tail] if tail else [])


def check(python, environment, timeout, base_env):
    """Run the script with ``python`` (the venv's) and the server's ``environment``; the result when it passed."""
    shown = shown_environment(environment)
    try:
        run = run_bounded([python, "-c", SCRIPT], child_environment(base_env, environment), timeout)
    except OSError as e:
        raise Failure("library_missing", "cannot run the SGLang venv's Python %s: %s" % (python, e),
                      "Install the venv first (the sglang_install stage).", ["environment: %s" % json.dumps(shown, sort_keys=True)])
    return decide(run, shown, timeout)


def decide(run, env_shown, timeout):
    """The check's result (the parsed output) when it passed; raises the phase's Failure otherwise."""
    data = parse_output(run["stdout"])
    ev = evidence(data, run, env_shown)
    details = {"check": dict((k, v) for k, v in data.items() if k != "step")}
    if run["timed_out"]:
        where = "the NCCL all-reduce" if data.get("step") == "all_reduce_start" else "step after '%s'" % (data.get("step") or "start")
        ended = "" if run["ended"] else "; the check's process did not end after SIGKILL (stuck in the kernel: reboot)"
        raise Failure("gpu_p2p_hang", "the two-GPU check did not finish within %d s: it hung in %s%s" % (timeout, where, ended),
                      REMEDY, ev, **details)
    if data.get("step") == "error" or run["rc"] != 0 or data.get("step") != "done":
        error = data.get("error") or "exit status %s without a result" % run["rc"]
        if data.get("at") == "import":
            raise Failure("library_missing", "torch cannot be imported in the SGLang venv: %s" % error,
                          "Reinstall the venv (the sglang_install stage).", ev, **details)
        raise Failure("nccl_error", "the two-GPU check failed at %s: %s" % (data.get("at") or data.get("step"), error),
                      REMEDY, ev, **details)
    wrong = wrong_parts(data)
    if wrong:
        raise Failure("gpu_p2p_wrong_result", "the two-GPU check got wrong data: %s" % "; ".join(wrong), REMEDY, wrong + ev, **details)
    return details["check"]
