"""The stand-in's "CUDA driver": GPU memory accounted in the lab state.

The lab state is ``$KPRO_LAB_ROOT/var/lib/kpro-lab/state.json`` (KPRO_LAB_ROOT defaults to
``/``). If the lab's own ``labstate.py`` is importable (``$KPRO_LAB_LIBDIR``, default
``/usr/lib/kpro-lab``), every change goes through ``labstate.modify()`` so the registered
renderers (nvml.conf for the fake libnvidia-ml) run; otherwise an equivalent locked
read-modify-write (same lock file, atomic rename) is used and nothing is rendered.

Each process entry this module writes is
``{"pid": <pid as seen by the outermost visible PID namespace>, "name": ..., "used_mib": int,
"standin": {"ns_pid", "pid_ns", "start_time"}}``; ``gpus[i].mem_used_mib`` moves by the same
deltas. ``reap()`` removes entries of processes that no longer exist (a real driver frees
memory when a process dies; a SIGKILLed process cannot clean up after itself).
"""

import contextlib
import copy
import fcntl
import importlib.util
import json
import os
import sys
import threading

STATE_REL = "var/lib/kpro-lab/state.json"
LOCK_REL = "var/lib/kpro-lab/state.lock"

_labstate = None
_labstate_tried = False
_depth = 0
_pending = []


def lab_root():
    return os.environ.get("KPRO_LAB_ROOT", "/")


def _get_labstate():
    global _labstate, _labstate_tried
    if _labstate_tried:
        return _labstate
    _labstate_tried = True
    if os.environ.get("KPRO_LAB_SGLANG_NO_LABSTATE") == "1":
        return None
    libdir = os.environ.get("KPRO_LAB_LIBDIR", "/usr/lib/kpro-lab")
    path = os.path.join(libdir, "labstate.py")
    if not os.path.isfile(path):
        return None
    if libdir not in sys.path:
        sys.path.append(libdir)  # labstate imports its renderers (nvml_render) from its own directory
    if "labstate" in sys.modules:
        _labstate = sys.modules["labstate"]
        return _labstate
    try:
        spec = importlib.util.spec_from_file_location("labstate", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["labstate"] = mod
        _labstate = mod
    except Exception:  # a broken lab library must not look like a working GPU
        _labstate = None
    return _labstate


def backend():
    """'labstate' (renderers run) or 'standalone' (plain locked JSON write)."""
    return "labstate" if _get_labstate() is not None else "standalone"


def state_path():
    return os.path.join(lab_root(), STATE_REL)


def load():
    with open(state_path()) as f:
        return json.load(f)


def load_or_empty():
    """The state, or no GPUs at all when there is no lab state (no driver, no devices)."""
    try:
        return load()
    except (OSError, ValueError):
        return {"gpus": []}


@contextlib.contextmanager
def _own_modify():
    root = lab_root()
    lock_path = os.path.join(root, LOCK_REL)
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        try:
            with open(state_path()) as f:
                state = json.load(f)
            before = copy.deepcopy(state)
            yield state
            if state != before:
                path = state_path()
                tmp = "%s.tmp.%d" % (path, os.getpid())
                with open(tmp, "w") as f:
                    json.dump(state, f, indent=1, sort_keys=True)
                    f.write("\n")
                os.rename(tmp, path)
        finally:
            fcntl.flock(lf, fcntl.LOCK_UN)


def _in_main_thread():
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def modify():
    """Locked read-modify-write of the lab state (saved only when changed)."""
    global _depth
    main = _in_main_thread()
    if main:
        _depth += 1
    try:
        ls = _get_labstate()
        cm = ls.modify(lab_root()) if ls is not None else _own_modify()
        with cm as state:
            yield state
    finally:
        if main:
            _depth -= 1
            if _depth == 0:
                while _pending:
                    _pending.pop(0)()


def run_unlocked(func):
    """Run ``func`` now, or (from a signal handler that interrupted a locked section of
    the main thread) as soon as that section ends: a nested flock would deadlock."""
    if _in_main_thread() and _depth > 0:
        _pending.append(func)
    else:
        func()


# ---- process identity -------------------------------------------------------------

def _start_time(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(")") + 2:].split()[19]


def identity():
    pid = os.getpid()
    outer = pid
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    outer = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return {"pid": outer, "ns_pid": pid, "pid_ns": ns, "start_time": _start_time(pid)}


def _alive(ident):
    st = _start_time(ident["ns_pid"])
    if st is None:
        return False
    if ident.get("start_time") and st != ident["start_time"]:
        return False
    try:
        with open("/proc/%d/stat" % ident["ns_pid"]) as f:
            data = f.read()
        if data[data.rindex(")") + 2:].split()[0] in ("Z", "X"):
            return False
    except OSError:
        return False
    return True


def gpu_used_mib(gpu):
    """Used memory by the lab's rule (nvml_render): ``mem_used_mib`` when set, else the reserved
    memory plus the processes' (the lab node's state leaves it unset)."""
    if gpu.get("mem_used_mib") is not None:
        return int(gpu["mem_used_mib"])
    return int(gpu.get("mem_reserved_mib") or 0) + sum(int(p.get("used_mib") or 0) for p in gpu.get("processes") or [])


def _adjust(gpu, delta_mib):
    """Move an explicit ``mem_used_mib`` by a process's delta; a derived one follows the processes."""
    if gpu.get("mem_used_mib") is not None:
        gpu["mem_used_mib"] = max(int(gpu.get("mem_reserved_mib") or 0), int(gpu["mem_used_mib"]) + delta_mib)


def _same_ns(entry_ident, my_ns):
    return entry_ident.get("pid_ns") == my_ns


def _reap_state(state, my_ns):
    removed = []
    for gpu in state.get("gpus", []):
        keep = []
        for proc in gpu.get("processes", []):
            ident = proc.get("standin")
            if ident and _same_ns(ident, my_ns) and not _alive(ident):
                _adjust(gpu, -int(proc.get("used_mib", 0)))
                removed.append((proc.get("pid"), proc.get("name"), proc.get("used_mib")))
            else:
                keep.append(proc)
        gpu["processes"] = keep
    return removed


def reap():
    """Remove memory held by stand-in processes (of this PID namespace) that are gone."""
    my_ns = identity()["pid_ns"]
    with modify() as state:
        return _reap_state(state, my_ns)


# ---- allocation -------------------------------------------------------------------

class OutOfMemory(Exception):
    def __init__(self, gpu_index, request_mib, free_mib, total_mib, processes):
        super().__init__("out of memory")
        self.gpu_index = gpu_index
        self.request_mib = request_mib
        self.free_mib = free_mib
        self.total_mib = total_mib
        self.processes = processes


def _find(gpu, ident):
    for proc in gpu.setdefault("processes", []):
        si = proc.get("standin") or {}
        if si.get("ns_pid") == ident["ns_pid"] and si.get("pid_ns") == ident["pid_ns"]:
            return proc
    return None


def gpu_info(gpu_index):
    gpu = load()["gpus"][gpu_index]
    return gpu


def free_mib(gpu_index):
    gpu = gpu_info(gpu_index)
    return gpu["mem_total_mib"] - gpu_used_mib(gpu)


def set_usage(gpu_index, used_mib, name, ident=None, check=True):
    """Set this process's usage on one GPU to ``used_mib`` (MiB, rounded). Raises
    OutOfMemory (state unchanged) when the increase does not fit in the free memory."""
    ident = ident or identity()
    used_mib = int(round(used_mib))
    with modify() as state:
        _reap_state(state, ident["pid_ns"])
        gpu = state["gpus"][gpu_index]
        proc = _find(gpu, ident)
        old = int(proc["used_mib"]) if proc else 0
        delta = used_mib - old
        free = gpu["mem_total_mib"] - gpu_used_mib(gpu)
        if check and delta > 0 and delta > free:
            raise OutOfMemory(gpu_index, delta, free, gpu["mem_total_mib"],
                              [(p.get("pid"), p.get("used_mib")) for p in gpu.get("processes", [])])
        _adjust(gpu, delta)
        if used_mib <= 0:
            if proc:
                gpu["processes"].remove(proc)
        elif proc:
            proc["used_mib"] = used_mib
            proc["name"] = name
        else:
            gpu["processes"].append({"pid": ident["pid"], "name": name, "used_mib": used_mib, "standin": ident})
    return used_mib


def release(ns_pids=None):
    """Drop every entry of this process (or of the given PIDs in our PID namespace)."""
    me = identity()
    pids = set(ns_pids) if ns_pids is not None else {me["ns_pid"]}
    with modify() as state:
        for gpu in state.get("gpus", []):
            keep = []
            for proc in gpu.get("processes", []):
                si = proc.get("standin") or {}
                if si.get("pid_ns") == me["pid_ns"] and si.get("ns_pid") in pids:
                    _adjust(gpu, -int(proc.get("used_mib", 0)))
                else:
                    keep.append(proc)
            gpu["processes"] = keep


def main(argv=None):
    """``python -m sglang.srt._kpro_lab.gpustate reap|show``"""
    argv = sys.argv[1:] if argv is None else argv
    cmd = argv[0] if argv else "show"
    if cmd == "reap":
        for pid, name, mib in reap():
            print("reaped pid %s (%s): %s MiB" % (pid, name, mib))
        return 0
    if cmd == "show":
        for i, gpu in enumerate(load().get("gpus", [])):
            procs = [(p["pid"], p["name"], p["used_mib"]) for p in gpu.get("processes", [])]
            print("%d %s %d/%d MiB %s" % (i, gpu.get("name"), gpu_used_mib(gpu), gpu["mem_total_mib"], procs))
        return 0
    sys.stderr.write("usage: python -m sglang.srt._kpro_lab.gpustate reap|show\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
