"""PVE tasks: UPIDs, forked workers, task logs (pve-common PVE/UPID.pm, PVE/RESTEnvironment.pm).

A task is a real forked process; its UPID carries the worker's pid and /proc start time
(``pstart``), and "running" means that process is alive with that start time, exactly as
``GET /nodes/<node>/tasks/<upid>/status`` decides on PVE. The log is
``/var/log/pve/tasks/<last hex digit of starttime>/<UPID>``; its last line is ``TASK OK`` or
``TASK ERROR: <message>``, which is what ``exitstatus`` reports. Finished tasks are appended
to ``/var/log/pve/tasks/index`` (``<UPID> <endtime hex> <status>``).
"""

import os
import re
import sys
import threading
import time
import traceback

import pve
from pve import PVEError, param_exc

TASKDIR = "var/log/pve/tasks"
UPID_RE = re.compile(r"^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
                     r"([0-9A-Fa-f]{8}):([^:\s/]+):([^:\s/]*):([^:\s/]+):$")


def encode(d):
    return "UPID:%s:%08X:%08X:%08X:%s:%s:%s:" % (d["node"], d["pid"], d["pstart"], d["starttime"], d["type"], d["id"],
                                                 d["user"])


def decode(upid, noerr=False):
    """(task dict, log file path) or (None, None) with noerr."""
    m = UPID_RE.match(upid or "")
    if not m:
        if noerr:
            return None, None
        raise PVEError("unable to parse worker upid '%s'" % upid)
    res = {"node": m.group(1), "pid": int(m.group(3), 16), "pstart": int(m.group(4), 16),
           "starttime": int(m.group(5), 16), "type": m.group(6), "id": m.group(7), "user": m.group(8)}
    subdir = m.group(5)[7:8]
    return res, pve.path(os.path.join(TASKDIR, subdir, upid))


def proc_stat(pid):
    """(starttime in clock ticks, state letter) of a live process, else (None, None)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None, None
    rest = data[data.rindex(")") + 2:].split()
    return int(rest[19]), rest[0]


def is_running(task):
    start, state = proc_stat(task["pid"])
    return start is not None and start == task["pstart"] and state not in ("Z", "X")


def read_status(upid):
    """PVE::UPID::read_status."""
    _task, filename = decode(upid)
    try:
        with open(filename, "rb") as f:
            lines = f.read().decode("utf-8", errors="replace").rstrip("\n").split("\n")
        line = lines[-1] if lines else ""
    except OSError as e:
        return "unable to get last line from task log - %s" % e
    if line == "TASK OK":
        return "OK"
    m = re.match(r"^TASK ERROR: (.+)$", line)
    if m:
        return m.group(1)
    m = re.match(r"^TASK (WARNINGS: \d+)$", line)
    if m:
        return m.group(1)
    return "unexpected status"


def status_is_error(status):
    return not (status == "OK" or re.match(r"^WARNINGS: \d+$", status or ""))


def task_status(upid):
    task, filename = decode(upid, noerr=True)
    if not task:
        raise param_exc({"upid": "unable to parse worker upid"})
    if not os.path.isfile(filename):
        raise param_exc({"upid": "no such task"})
    res = dict(task)
    res["upid"] = upid
    res["status"] = "running" if is_running(task) else "stopped"
    if res["status"] == "stopped":
        res["exitstatus"] = read_status(upid)
    return res


def task_log(upid, start=0, limit=50):
    """(total line count, [{'n': 1-based line number, 't': text}]) as PVE::Tools::dump_logfile."""
    task, filename = decode(upid, noerr=True)
    if not task:
        raise param_exc({"upid": "unable to parse worker upid"})
    try:
        with open(filename, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return 1, [{"n": 1, "t": "unable to open file - No such file or directory"}]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out = [{"n": i + 1, "t": t} for i, t in enumerate(lines) if i >= start][:limit]
    if not out and not lines:
        out = [{"n": 1, "t": "no content"}]
    return len(lines), out


def list_tasks(limit=50):
    """Most recent first: finished (index) and running (log without end) tasks."""
    res = []
    top = pve.path(TASKDIR)
    ended = {}
    try:
        with open(os.path.join(top, "index")) as f:
            for line in f:
                parts = line.rstrip("\n").split(" ", 2)
                if len(parts) == 3:
                    ended[parts[0]] = (int(parts[1], 16), parts[2])
    except OSError:
        pass
    for sub in sorted(os.listdir(top)) if os.path.isdir(top) else []:
        d = os.path.join(top, sub)
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            task, _fn = decode(name, noerr=True)
            if not task:
                continue
            task["upid"] = name
            if name in ended:
                task["endtime"], task["status"] = ended[name]
            elif is_running(task):
                task["status"] = "running"
            else:
                task["status"] = read_status(name)
            res.append(task)
    res.sort(key=lambda t: t["starttime"], reverse=True)
    return res[:limit]


def _reap(pid):
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def fork_worker(dtype, vmid, user, func, sync=False, out=None):
    """Run ``func(upid, log)`` in a forked worker; return the UPID.

    ``log(text)`` appends a line to the task log (and, with ``sync``, to ``out``/stdout, like
    PVE's CLI tee). Async (the API server): the parent returns at once and a thread reaps the
    worker. Sync (pct, pvesh): wait for the worker, print an error on stderr as PVE's CLI does,
    and return the UPID (``sync_status`` then gives the exit status).
    """
    node = pve.nodename()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # worker
        code = 0
        try:
            os.close(go_w)
            os.setsid()
            upid = b""
            while True:
                chunk = os.read(go_r, 4096)
                if not chunk:
                    break
                upid += chunk
            os.close(go_r)
            upid = upid.decode()
            _task, filename = decode(upid)
            fd = os.open(filename, os.O_WRONLY | os.O_APPEND)
            outfd = None
            if sync:
                outfd = (out or sys.stdout).fileno()

            def log(text):
                data = (text.rstrip("\n") + "\n").encode("utf-8", errors="replace")
                os.write(fd, data)
                if outfd is not None:
                    os.write(outfd, data)

            try:
                func(upid, log)
                final = "TASK OK"
            except PVEError as e:
                final = "TASK ERROR: " + e.msg.strip().replace("\n", " ")
                code = 255
            except Exception as e:  # a bug in the fake: say so in the log, like a perl die
                for line in traceback.format_exc().splitlines():
                    os.write(fd, (line + "\n").encode())
                final = "TASK ERROR: %s" % (str(e).strip().replace("\n", " ") or type(e).__name__)
                code = 255
            os.write(fd, ((final if final == "TASK OK" else "\n" + final) + "\n").encode("utf-8", errors="replace"))
            os.close(fd)
            status = read_status(upid)
            with open(pve.path(os.path.join(TASKDIR, "index")), "a") as f:
                f.write("%s %08X %s\n" % (upid, int(time.time()), status))
            if sync and status_is_error(status):
                os.write(2, (status + "\n").encode("utf-8", errors="replace"))
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    # parent
    os.close(go_r)
    pstart = None
    for _ in range(200):
        pstart, _state = proc_stat(pid)
        if pstart is not None:
            break
        time.sleep(0.005)
    upid = encode({"node": node, "pid": pid, "pstart": pstart or 0, "starttime": int(time.time()), "type": dtype,
                   "id": str(vmid), "user": user})
    _task, filename = decode(upid)
    os.makedirs(os.path.dirname(filename), exist_ok=True)
    with open(filename, "a"):
        pass
    os.write(go_w, upid.encode())
    os.close(go_w)
    if sync:
        _reap(pid)
    else:
        threading.Thread(target=_reap, args=(pid,), daemon=True).start()
    return upid


def wait(upid, timeout=60, interval=0.05):
    """Block until the task stopped; return its exit status (for tests and the CLI)."""
    task, _fn = decode(upid)
    deadline = time.monotonic() + timeout
    while is_running(task):
        if time.monotonic() > deadline:
            raise PVEError("timeout waiting for task %s" % upid)
        time.sleep(interval)
    return read_status(upid)
