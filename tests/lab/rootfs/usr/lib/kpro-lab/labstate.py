"""The lab's simulated hardware and kernel state: one JSON document, one lock.

Every fake on the simulated Proxmox node (the FUSE sysfs, /proc overlays, modprobe,
the NVIDIA installer stand-in, libnvidia-ml, nvidia-smi, pct/pvesh, the PVE API, the
SGLang stand-in) reads and writes the hardware through this module, so that they all
agree on what the "machine" looks like. Standard library only: it runs with the
node's own /usr/bin/python3 and with the controller's venv python.

Layout: ``<root>/var/lib/kpro-lab/state.json``; ``<root>`` is ``/`` on the node and the
node's merged root directory when used from outside (the FUSE daemon, tests).
After every change the derived files that C code and shell fakes read are rendered
again by the renderers registered with :func:`register_renderer` (for example
``nvml.conf`` for the fake libnvidia-ml).
"""

import contextlib
import copy
import fcntl
import json
import os

STATE_REL = "var/lib/kpro-lab/state.json"
LOCK_REL = "var/lib/kpro-lab/state.lock"

_RENDERERS = []


def register_renderer(func):
    """Register ``func(root, state)``, called after each committed change."""
    _RENDERERS.append(func)
    return func


def _root(root):
    return root if root is not None else os.environ.get("KPRO_LAB_ROOT", "/")


def state_path(root=None):
    return os.path.join(_root(root), STATE_REL)


def load(root=None):
    """Return a copy of the current state (no lock needed: writers rename atomically)."""
    with open(state_path(root)) as f:
        return json.load(f)


def save(state, root=None):
    """Write ``state`` atomically. Call under :func:`modify`'s lock."""
    path = state_path(root)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.write("\n")
    os.rename(tmp, path)
    for func in _RENDERERS:
        func(_root(root), state)


@contextlib.contextmanager
def locked(root=None):
    """Hold the state lock (exclusive) for a read-modify-write."""
    lock_path = os.path.join(_root(root), LOCK_REL)
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lf, fcntl.LOCK_UN)


@contextlib.contextmanager
def modify(root=None):
    """``with modify() as st: st[...] = ...`` — saved (and rendered) on clean exit only."""
    with locked(root):
        state = load(root)
        before = copy.deepcopy(state)
        yield state
        if state != before:
            save(state, root)
