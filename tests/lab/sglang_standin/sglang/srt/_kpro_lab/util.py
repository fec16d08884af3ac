"""Log formatting (SGLang and uvicorn formats), process titles, drills, timing."""

import ctypes
import os
import signal
import time

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_level = 20
_http_level = 20

KNOWN_DRILLS = (
    "kv_cache_oom", "weights_oom", "init_failed_before_gpu", "host_oom_killed", "weights_load_failed", "nccl_error", "cuda_graph_failed",
    "port_in_use", "warmup_failed", "degenerate_output", "degenerate_loop", "leftover_child",
    "slow_load", "hang",
    # output drills, read at every request (generate.py)
    "dropped_draft_tokens", "duplicated_tokens", "wrong_answer_tp", "reasoning_only",
    "p2p_hang", "p2p_wrong_sum",  # GPU-to-GPU drills of the torch stand-in (tests/lab/torch_standin); the server ignores them
)


def set_levels(log_level, log_level_http=None):
    global _level, _http_level
    _level = _LEVELS.get((log_level or "info").lower(), 20)
    _http_level = _LEVELS.get((log_level_http or log_level or "info").lower(), 20)


def levels():
    return (_level, _http_level)


def _ts():
    now = time.time()
    s = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    if os.environ.get("SGLANG_LOG_MS", "").lower() in ("1", "true", "yes"):
        s += ".%03d" % int((now % 1) * 1000)
    return s


def _write(fd, text):
    data = text.encode("utf-8", "replace")
    while data:
        n = os.write(fd, data)
        data = data[n:]


def log(msg, prefix="", level=20):
    """An SGLang logger line: ``[%(asctime)s{prefix}] %(message)s`` on stderr."""
    if level < _level:
        return
    _write(2, "[%s%s] %s\n" % (_ts(), prefix, msg))


def bare(msg):
    """A message from before configure_logger (Python's last-resort handler)."""
    _write(2, msg + "\n")


def raw(text):
    _write(2, text)


def uvlog(msg, level="INFO"):
    """uvicorn's ``[%(asctime)s] %(levelprefix)s %(message)s``."""
    if _LEVELS.get(level.lower(), 20) < _http_level:
        return
    _write(2, "[%s] %s:%s %s\n" % (_ts(), level, " " * (8 - len(level)), msg))


def access(client, request_line, status, phrase):
    if 20 < _http_level:
        return
    _write(1, '[%s] INFO:     %s:%d - "%s" %d %s\n' % (_ts(), client[0], client[1], request_line, status, phrase))


# ---- processes ---------------------------------------------------------------------

def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def set_pdeathsig(sig=signal.SIGTERM):
    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def set_proc_title(title):
    """Like setproctitle on Linux: /proc/self/comm via prctl(PR_SET_NAME) (15 chars) and
    the argv area rewritten in place, so /proc/PID/cmdline starts with the title.
    Returns what worked."""
    done = []
    libc = _libc()
    if libc is not None:
        if libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0) == 0:
            done.append("comm")
    try:
        with open("/proc/self/stat") as f:
            data = f.read()
        fields = data[data.rindex(")") + 2:].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])
        size = arg_end - arg_start
        if arg_start and size > 1:
            raw_title = title.encode()[:size - 1]
            ctypes.memmove(arg_start, raw_title + b"\0" * (size - len(raw_title)), size)
            done.append("cmdline")
    except (OSError, ValueError, IndexError):
        pass
    return done


def children_of(pid):
    """Descendants of ``pid`` (recursive), from /proc."""
    kids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                data = f.read()
            ppid = int(data[data.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


# ---- drills and speed -------------------------------------------------------------

def speed():
    try:
        v = float(os.environ.get("KPRO_LAB_SGLANG_SPEED", "1"))
        return v if v > 0 else 1.0
    except ValueError:
        return 1.0


def sleep(seconds):
    if seconds > 0:
        time.sleep(seconds / speed())


def drill_sources():
    root = os.environ.get("KPRO_LAB_ROOT", "/")
    return [os.path.join(root, "etc/kpro-lab/sglang-drill"), os.path.join(root, "var/lib/kpro-lab/sglang-drill")]


def read_drills():
    """{name: arg or None} from $KPRO_LAB_SGLANG_DRILL, else the first drill file found.
    Names are separated by commas or whitespace; ``name:arg`` passes an argument."""
    text = os.environ.get("KPRO_LAB_SGLANG_DRILL")
    if text is None:
        for path in drill_sources():
            try:
                with open(path) as f:
                    text = f.read()
                break
            except OSError:
                continue
    drills = {}
    for word in (text or "").replace(",", " ").split():
        if word.startswith("#"):
            break
        name, _sep, arg = word.partition(":")
        drills[name.strip()] = arg.strip() or None
    unknown = [d for d in drills if d not in KNOWN_DRILLS]
    return drills, unknown


def fake_traceback(frames, exc_line, pkg_dir=None):
    """Render a traceback whose frames live in the installed sglang package."""
    if pkg_dir is None:
        import sglang
        pkg_dir = os.path.dirname(os.path.abspath(sglang.__file__))
    site = os.path.dirname(pkg_dir)
    lines = ["Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        full = path if path.startswith("/") else os.path.join(site, path)
        lines.append('  File "%s", line %d, in %s' % (full, lineno, func))
        lines.append("    " + code)
    lines.append(exc_line)
    return "\n".join(lines) + "\n"
