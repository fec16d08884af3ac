# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One run at a time per container: a lease file on the container's Proxmox node.

``/run/lock/kpro-gpu-serving-<vmid>.lock`` holds its holder as JSON (controller host, the ansible-playbook PID and
that process's start, when it was taken on the node's clock, the node's boot id); empty means free. Every look at it
and every change of it is made under ``flock(2)`` on the file itself, held only for that moment, so two runs never both
find it free; the lease itself outlives the module's process (a run is many tasks, in several plays). It ends with the
run's release, or it is stale and taken over, naming the holder: the node rebooted (boot id; /run is a tmpfs anyway),
it was taken longer ago than ``max_age`` (the longest run), or, as the controller found (:func:`holder_gone`), its
ansible-playbook process on the same controller is gone. The file is emptied, never removed: a process waiting on
the flock of a removed file would take a lock nobody else sees.
"""

from __future__ import annotations

import json
import os
import socket
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

try:
    import fcntl
except ImportError:  # pragma: no cover - the module runs on Linux nodes
    fcntl = None

LOCK_DIR = "/run/lock"


def lock_path(vmid, lock_dir=LOCK_DIR):
    return os.path.join(lock_dir, "kpro-gpu-serving-%d.lock" % int(vmid))


def proc_start(pid, proc="/proc"):
    """The start of process ``pid`` in clock ticks since boot (/proc/PID/stat field 22), None when it is gone: a PID
    alone can be reused."""
    try:
        with open(os.path.join(proc, str(int(pid)), "stat")) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def controller_owner(pid=None, now=time.time):
    """This run, on the controller: the host, the ansible-playbook process (an action plugin runs in a worker forked
    from it: its parent) and that process's start."""
    pid = pid or os.getppid()
    host = socket.gethostname()
    start = proc_start(pid)
    return {"controller": host, "pid": pid, "pid_start": start, "run_id": "%s:%d:%s" % (host, pid, start),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now()))}


def holder_gone(holder, owner, proc="/proc"):
    """Whether ``holder`` is a run of this controller whose ansible-playbook process no longer exists (same PID and
    start). A holder of another controller cannot be looked at from here: only max_age ends it."""
    if not holder or holder.get("controller") != owner["controller"]:
        return False
    return proc_start(holder.get("pid", 0), proc) != holder.get("pid_start")


def describe(holder):
    return "ansible-playbook PID %s on controller %s, started %s" % (
        holder.get("pid"), holder.get("controller"), holder.get("started"))


def boot_id(proc="/proc"):
    with open(os.path.join(proc, "sys", "kernel", "random", "boot_id")) as f:
        return f.read().strip()


def stale_reason(holder, now, max_age, boot):
    """Why ``holder``'s lease is over without a release, else None."""
    if holder.get("boot_id") != boot:
        return "the node rebooted since %s took it" % describe(holder)
    age = now - float(holder.get("taken_at") or 0)
    if age > max_age:
        return "%s took it %d s ago, longer than a run lasts (max_age %d s)" % (describe(holder), age, max_age)
    return None


def _open_locked(path, create):
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0), 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _holder(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 65536).decode("utf-8", "replace").strip()
    try:
        return json.loads(text) if text else None
    except ValueError:
        return {"controller": "?", "pid": "?", "started": "? (unreadable: %r)" % text[:80]}


def _put(fd, text):
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, text.encode("utf-8"))
    os.fsync(fd)


def take(path, owner, max_age, take_over=None, now=time.time, boot=None):
    """One try for ``owner``: (taken, the holder found, why it was taken over). Taken when free, already this run's
    (a later stage of the same run: the lease is renewed), stale, or held by ``take_over`` (the run id the controller
    found gone, and still the holder)."""
    fd = _open_locked(path, create=True)
    try:
        holder, t = _holder(fd), now()
        why = None
        if holder and holder.get("run_id") != owner["run_id"]:
            why = stale_reason(holder, t, max_age, boot) or (
                "%s is gone" % describe(holder) if take_over and take_over == holder.get("run_id") else None)
            if why is None:
                return False, holder, None
        _put(fd, json.dumps(dict(owner, taken_at=t, boot_id=boot), sort_keys=True) + "\n")
        return True, holder, why
    finally:
        os.close(fd)  # closing the file ends the flock


def release(path, owner):
    """Free the lock when this run holds it; True when it did."""
    if not os.path.exists(path):
        return False
    fd = _open_locked(path, create=False)
    try:
        holder = _holder(fd)
        if not holder or holder.get("run_id") != owner["run_id"]:
            return False
        _put(fd, "")
        return True
    finally:
        os.close(fd)


def apply(state, path, owner, max_age, take_over=None):
    """The module's work on the node: take (or renew) or release; the result's fields."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if state == "released":
            return {"released": release(path, owner)}
        taken, holder, why = take(path, owner, max_age, take_over, boot=boot_id())
        return {"taken": taken, "holder": holder, "took_over": why}
    except OSError as e:
        raise Failure("run_locked", "the run's lock %s cannot be used: %s" % (path, e), evidence=[path],
                      remedy="the lock lives on the node's %s (a tmpfs): check that it exists and is writable by the "
                             "run's user" % os.path.dirname(path))
