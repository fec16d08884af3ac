"""PID 1 of a lab container and its systemd stand-in (kpro lab; standard library only).

Started by the node's container runtime (ct/runtime.py) with the container's /usr/bin/python3.
It reaps every orphan, supervises the services and answers ``systemctl`` (the client in
/usr/bin/systemctl) on the Unix socket /run/kpro-lab-systemd.sock (one JSON request per
connection: {"verb", "units", "flags", "props", ...} -> {"rc", "out", "err"}).

systemd semantics kept (systemd 252, Debian 12):
- units are loaded from /etc/systemd/system, /run/systemd/system, /lib/systemd/system,
  /usr/lib/systemd/system (+ ``<unit>.d/*.conf`` drop-ins; an empty ``ExecStart=`` resets) on
  first use and kept until ``daemon-reload``: a unit file edited without daemon-reload keeps
  its old definition and systemctl warns (NeedDaemonReload=yes), as systemd does; a unit that
  was not found is looked up again on the next request.
- Type=simple|exec|oneshot (+ RemainAfterExit), a minimal Type=forking; ExecStartPre/ExecStart/
  ExecStartPost/ExecStop/ExecStopPost with the prefixes - @ : + !; ``$VAR``/``${VAR}`` from
  Environment=/EnvironmentFile= (files override Environment=), %n %N %p %i %h %t %% specifiers;
  WorkingDirectory= (``-`` optional), User=/Group=, LimitNOFILE= (other Limit*= are ignored);
  StandardOutput=/StandardError=
  append:|file:|truncate:|null|journal (the journal: /run/kpro-lab-systemd/<unit>.journal,
  read by the journalctl stand-in); Restart=no|on-failure|always|on-abnormal with RestartSec=,
  NRestarts, StartLimitBurst=/StartLimitIntervalSec= (5 in 10 s); KillMode=control-group|
  mixed|process|none, KillSignal= (then SIGCONT, as systemd: a stopped process ends at once),
  TimeoutStopSec= then SIGKILL (Result=timeout).
- The service environment is systemd's: PATH, INVOCATION_ID (new 32-hex id per start, also
  the InvocationID property), SYSTEMD_EXEC_PID, HOME/USER/LOGNAME/SHELL only with User=, plus
  the unit's variables -- and the lab's cgroup marker, see below.
- "cgroup": every process of a unit carries KPRO_LAB_CGROUP=/system.slice/<unit> in its
  environment, inherited by all its descendants, and members are found by scanning
  /proc/*/environ of the container's pid namespace, so daemonized or re-parented children are
  still members (a process that clears its environment escapes: a known gap).
  /sys/fs/cgroup/system.slice/<unit>/{cgroup.procs,cgroup.events} are files on a tmpfs
  rewritten by this init every 0.5 s and after every systemctl request (staleness <= 0.5 s).
- Boot: enabled units (``multi-user.target.wants``/``default.target.wants`` links) whose unit
  file is under /etc/systemd/system or /run/systemd/system are started. Package units from
  /lib/systemd/system (ssh, cron ...) are not auto-started: the container shares the node's
  network namespace. /run/systemd/system exists (Ansible's systemd detection) and /proc/1/comm
  is "systemd".
- Shutdown (SIGTERM, SIGINT, SIGPWR, SIGRTMIN+3 from ``stop``): active units are stopped in
  reverse start order, the rest of the processes get SIGTERM, 3 s later SIGKILL, then exit.
"""

import ctypes
import datetime
import errno
import json
import os
import grp
import pwd
import resource
import select
import signal
import socket
import threading
import time
import uuid

SOCK = "/run/kpro-lab-systemd.sock"
RUN = "/run/kpro-lab-systemd"
CGROOT = "/sys/fs/cgroup"
MARK = "KPRO_LAB_CGROUP"
UNIT_DIRS = ["/etc/systemd/system", "/run/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system"]
BOOT_DIRS = ("/etc/systemd/system", "/run/systemd/system")
EXEC_KEYS = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop", "ExecStopPost", "ExecReload")
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
CLEAN_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)
EXIT_NAMES = {0: "SUCCESS", 1: "FAILURE", 2: "INVALIDARGUMENT", 3: "NOTIMPLEMENTED", 4: "NOPERMISSION",
              5: "NOTINSTALLED", 6: "NOTCONFIGURED", 7: "NOTRUNNING", 200: "CHDIR", 203: "EXEC",
              209: "STDOUT", 211: "STDERR", 216: "GROUP", 217: "USER"}

LOCK = threading.RLock()          # all unit/runtime state
CHILD_LOCK = threading.Lock()     # fork + registration vs. the reaper
CHILDREN = {}                     # pid -> Child
SHUTDOWN = threading.Event()
UNITS = {}                        # name -> Unit (definition cache, cleared by daemon-reload)
SVC = {}                          # name -> Service (runtime state, survives daemon-reload)
START_ORDER = []
HOSTNAME = socket.gethostname()


def now_us():
    return int(time.time() * 1e6)


def fmt_ts(us):
    if not us:
        return ""
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.timezone.utc).strftime("%a %Y-%m-%d %H:%M:%S UTC")


def fmt_span(sec):
    if sec >= 3600 * 24 * 365:
        return "infinity"
    sec = int(round(sec))
    mins, s = divmod(sec, 60)
    out = ("%dmin" % mins if mins else "") + (" %ds" % s if s else "")
    return out.strip() or "0"


def journal(name, text, ident="systemd", pid=1):
    os.makedirs(RUN, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%b %d %H:%M:%S")
    with open(os.path.join(RUN, name + ".journal"), "a") as f:
        for line in text.splitlines():
            f.write("%s %s %s[%d]: %s\n" % (stamp, HOSTNAME, ident, pid, line))


# --- unit files ------------------------------------------------------------------------

def seconds(text, default):
    if not text:
        return default
    text = text.strip()
    if text == "infinity":
        return float("inf")
    total, num = 0.0, ""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
    try:
        parts = text.replace(" ", "")
        i = 0
        while i < len(parts):
            j = i
            while j < len(parts) and (parts[j].isdigit() or parts[j] == "."):
                j += 1
            num = parts[i:j]
            k = j
            while k < len(parts) and parts[k].isalpha():
                k += 1
            suf = parts[j:k] or "s"
            total += float(num) * units[suf]
            i = k
        return total
    except (KeyError, ValueError):
        return default


class Unit(object):
    """One loaded unit definition."""

    def __init__(self, name):
        self.name = name
        self.path = None
        self.load_state = "not-found"
        self.load_error = None
        self.sections = {}
        self.files = []
        self.masked = False
        self.exec = {}
        self._load()

    def _candidates(self):
        files = []
        for d in UNIT_DIRS:
            p = os.path.join(d, self.name)
            if os.path.lexists(p):
                files.append(p)
                break
        for d in UNIT_DIRS:
            dd = os.path.join(d, self.name + ".d")
            if os.path.isdir(dd):
                files += [os.path.join(dd, f) for f in sorted(os.listdir(dd)) if f.endswith(".conf")]
        return files

    def _stamp(self, files):
        out = []
        for f in files:
            try:
                out.append((f, os.lstat(f).st_mtime_ns, os.stat(f).st_size if os.path.exists(f) else -1))
            except OSError:
                out.append((f, None, None))
        return out

    def _load(self):
        files = self._candidates()
        self.files = self._stamp(files)
        if not files or not os.path.basename(files[0]) == self.name:
            return
        main = files[0]
        self.path = main
        if os.path.islink(main) and os.readlink(main) == "/dev/null":
            self.masked, self.load_state = True, "masked"
            return
        for f in files:
            section, cont = None, ""
            with open(f) as fh:
                for raw in fh:
                    # src/shared/conf-parser.c config_parse(): comment lines are skipped even inside a continuation;
                    # a line ending in an unescaped backslash continues, the backslash becoming a space
                    if raw.lstrip(WHITESPACE)[:1] in ("#", ";"):
                        continue
                    line = cont + raw.rstrip("\n")
                    if (len(line) - len(line.rstrip("\\"))) % 2:
                        cont = line[:-1] + " "
                        continue
                    cont = ""
                    line = line.strip()
                    if not line or line[0] in "#;":
                        continue
                    if line.startswith("[") and line.endswith("]"):
                        section = self.sections.setdefault(line[1:-1], {})
                        continue
                    if section is None or "=" not in line:
                        continue
                    key, val = line.split("=", 1)
                    key, val = key.strip(), val.strip()
                    if val == "":
                        section[key] = []
                    else:
                        section.setdefault(key, []).append(val)
        self.load_state = "loaded"
        table = specifier_table(self.name, self.path)
        for key in EXEC_KEYS:
            try:
                self.exec[key] = [c for line in self.svc.get(key, []) for c in
                                  config_parse_exec(line, table, lambda msg: journal(self.name, "%s: %s" % (main, msg)))]
            except BadSetting as e:
                self.load_state, self.load_error = "bad-setting", str(e)
                return
        if self.type in ("simple", "exec", "notify", "idle", "forking") and len(self.cmds("ExecStart")) > 1:
            self.load_state, self.load_error = "bad-setting", (
                "Service has more than one ExecStart= setting, which is only allowed for Type=oneshot services. Refusing.")
        elif self.type != "oneshot" and not self.cmds("ExecStart") and self.name.endswith(".service"):
            self.load_state, self.load_error = "bad-setting", (
                "Service has no ExecStart=, ExecStop=, or SuccessAction=. Refusing.")

    def cmds(self, key):
        """The parsed commands of an Exec*= setting (config_parse_exec())."""
        return self.exec.get(key, [])

    def changed_on_disk(self):
        return self._stamp(self._candidates()) != self.files

    @property
    def svc(self):
        return self.sections.get("Service", {})

    def get(self, key, default=None, section="Service"):
        vals = self.sections.get(section, {}).get(key)
        return vals[-1] if vals else default

    @property
    def type(self):
        return self.get("Type", "simple")

    def install_links(self):
        inst = self.sections.get("Install", {})
        links = []
        for k, suffix in (("WantedBy", "wants"), ("RequiredBy", "requires")):
            for val in inst.get(k, []):
                for target in val.split():
                    links.append("/etc/systemd/system/%s.%s/%s" % (target, suffix, self.name))
        for val in inst.get("Alias", []):
            links += ["/etc/systemd/system/%s" % a for a in val.split()]
        return links

    def enabled_state(self):
        if self.load_state == "not-found":
            return None
        if self.masked:
            return "masked"
        links = self.install_links()
        if not links:
            return "static"
        return "enabled" if any(os.path.islink(x) for x in links) else "disabled"


def norm(name):
    if "." not in name:
        return name + ".service"
    return name


def unit(name):
    """The loaded definition (loading on demand; not-found units are looked up again)."""
    with LOCK:
        u = UNITS.get(name)
        if u is None or u.load_state == "not-found":
            u = UNITS[name] = Unit(name)
        return u


# --- processes -------------------------------------------------------------------------

class Child(object):
    def __init__(self):
        self.event = threading.Event()
        self.status = None
        self.on_exit = None


def alive(pid):
    if not pid:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def members(name):
    """PIDs carrying the unit's cgroup marker (the cgroup stand-in), live ones only."""
    want = ("%s=/system.slice/%s" % (MARK, name)).encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or d == "1":
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env and alive(int(d)):
            out.append(int(d))
    return sorted(out)


def all_cgroups():
    """{cgroup path: [pids]} for every process of the container but PID 1."""
    out = {}
    pfx = (MARK + "=").encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or d == "1":
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if not alive(int(d)):
            continue
        cg = "/"
        for item in env:
            if item.startswith(pfx):
                cg = item[len(pfx):].decode(errors="replace")
        out.setdefault(cg, []).append(int(d))
    return out


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def kill(pids, sig):
    for pid in pids:
        if pid and pid != 1:
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def kill_and_sigcont(pids, sig):
    """The stop signal as systemd sends it: ``sig``, then SIGCONT (unless ``sig`` is SIGCONT or SIGKILL), so a stopped
    (SIGSTOPped) process gets the signal now instead of at the SIGKILL after TimeoutStopSec. systemd:
    src/basic/process-util.c kill_and_sigcont() ("If this worked, also send SIGCONT, unless we already just sent a
    SIGCONT, or SIGKILL was sent"), called by src/core/unit.c unit_kill_context_one() for the main and control PIDs,
    and cg_kill_recursive(..., CGROUP_SIGCONT|CGROUP_IGNORE_SELF, ...) in unit_kill_context() for the rest of the cgroup."""
    kill(pids, sig)
    if sig not in (signal.SIGCONT, signal.SIGKILL):
        kill(pids, signal.SIGCONT)


def _open_out(spec, name, default_fd=None):
    """StandardOutput=/StandardError= -> an fd (opened as root before dropping privileges)."""
    if spec is None or spec in ("journal", "syslog", "kmsg", "journal+console", "inherit", "tty"):
        path, flags = os.path.join(RUN, name + ".journal"), os.O_APPEND
    elif spec == "null":
        return os.open("/dev/null", os.O_WRONLY)
    else:
        for pfx, fl in (("append:", os.O_APPEND), ("file:", 0), ("truncate:", os.O_TRUNC)):
            if spec.startswith(pfx):
                path, flags = spec[len(pfx):], fl
                break
        else:
            path, flags = os.path.join(RUN, name + ".journal"), os.O_APPEND
    return os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)


def spawn(name, argv, env, cwd, user, group, out_spec, err_spec, on_exit=None):
    """fork + exec one process of the unit. Returns (pid, error text or None); an exec failure
    leaves a child that exits with systemd's code (203/EXEC, 200/CHDIR ...)."""
    os.makedirs(RUN, exist_ok=True)
    path = argv[0] if argv else ""
    if path and "/" not in path:
        for d in SERVICE_PATH.split(":"):
            if os.access(os.path.join(d, path), os.X_OK):
                path = os.path.join(d, path)
                break
    argv0 = env.pop("__ARGV0__", None)
    nofile = env.pop("__NOFILE__", None)
    exec_argv = [os.fsencode(a) for a in ([argv0] + argv[1:] if argv0 else argv)]
    envb = [os.fsencode("%s=%s" % kv) for kv in env.items()]
    uid = gid = groups_name = None
    if user and user not in ("root", "0"):
        try:
            pw = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
            uid, gid, groups_name = pw.pw_uid, pw.pw_gid, pw.pw_name
        except KeyError:
            uid = -1
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid if not group.isdigit() else int(group)
        except KeyError:
            gid = -1
    r, w = os.pipe()
    with CHILD_LOCK:
        pid = os.fork()
        if pid == 0:
            code, what = 1, ""
            try:
                os.close(r)
                os.setsid()
                code, what = 209, "STDOUT"
                fd_out = _open_out(out_spec, name)
                code, what = 211, "STDERR"
                fd_err = fd_out if err_spec in (None, "inherit") else _open_out(err_spec, name)
                fd_in = os.open("/dev/null", os.O_RDONLY)
                os.dup2(fd_in, 0)
                os.dup2(fd_out, 1)
                os.dup2(fd_err, 2)
                code, what = 216, "GROUP"
                if gid == -1 or uid == -1:
                    raise OSError(errno.ESRCH, "user or group not found")
                if gid is not None:
                    os.setgid(gid)
                if uid is not None:
                    os.initgroups(groups_name, gid)
                    code, what = 217, "USER"
                    os.setuid(uid)
                if nofile:
                    code, what = 205, "LIMITS"
                    resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
                code, what = 200, "CHDIR"
                os.chdir(cwd or "/")
                os.umask(0o022)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                for s in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(s, signal.SIG_DFL)
                code, what = 203, "EXEC"
                os.execve(path, exec_argv, dict(kv.split(b"=", 1) for kv in envb))
            except BaseException as e:  # noqa: B902
                try:
                    os.write(w, ("%d %s %s" % (code, what, e)).encode())
                except OSError:
                    pass
            os._exit(code)
        ch = CHILDREN[pid] = Child()
        ch.on_exit = on_exit
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    if data:
        text = data.decode(errors="replace")
        parts = text.split(" ", 2) + ["", ""]
        journal(name, "%s: Failed at step %s spawning %s: %s" % (name, parts[1], path, parts[2]))
        return pid, text
    return pid, None


def wait_child(pid):
    """The exit status of a control process: kept by the reaper until read here, so one that exits before this is
    called (a fast /bin/false under load) is not taken for a success, as systemd never loses it."""
    with CHILD_LOCK:
        ch = CHILDREN.get(pid)
    if ch is None:
        return 0
    ch.event.wait()
    with CHILD_LOCK:
        CHILDREN.pop(pid, None)
    return ch.status


def _gone(proc, my_ns):
    """A GPU state entry of a process of this PID namespace that no longer runs (or is a zombie)."""
    si = proc.get("standin") or {}
    if si.get("pid_ns") != my_ns or not si.get("ns_pid"):
        return False
    try:
        with open("/proc/%d/stat" % si["ns_pid"]) as f:
            data = f.read()
    except OSError:
        return True
    fields = data[data.rindex(")") + 2:].split()
    return fields[0] in ("Z", "X") or bool(si.get("start_time") and fields[19] != si["start_time"])


_VIEW_CHECKED = [None]  # the state.json version whose rendered view was last found current


def _state_version(labstate):
    st = os.stat(labstate.state_path())
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def gpu_release_dead():
    """The driver frees a process's GPU memory when it dies, however it died (SIGKILL included). The lab's
    GPU state is the node's, shared with the container; entries of processes of this container that are
    gone are dropped through labstate (which re-renders NVML). No-op without the lab's state library."""
    try:
        import labstate  # next to this file in the container (the CT seed carries it)
        my_ns = os.readlink("/proc/self/ns/pid")
        version = _state_version(labstate)  # before the load: a newer state is checked again next tick
        st = labstate.load()
        if not any(_gone(p, my_ns) for g in st.get("gpus") or [] for p in g.get("processes") or []):
            # a stand-in SIGKILLed between saving the state and rendering NVML's view leaves that view
            # stale (memory "held" forever by PIDs that are gone); an unchanged modify() renders it again.
            # Once per state version: no lock on every tick
            if version != _VIEW_CHECKED[0] and not labstate.views_current(st):
                with labstate.modify():
                    pass
            _VIEW_CHECKED[0] = version
            return
        with labstate.modify() as st:
            for g in st.get("gpus") or []:
                dead = [p for p in g.get("processes") or [] if _gone(p, my_ns)]
                if g.get("mem_used_mib") is not None:
                    g["mem_used_mib"] = max(int(g.get("mem_reserved_mib") or 0),
                                            int(g["mem_used_mib"]) - sum(int(p.get("used_mib") or 0) for p in dead))
                g["processes"] = [p for p in g.get("processes") or [] if p not in dead]
    except Exception as e:  # noqa: BLE001  (a lab without a GPU state, or a broken one: nothing to free)
        if not isinstance(e, (ImportError, OSError, ValueError)):
            journal("init", "gpu release: %s" % e)


def reap():
    _reap_children()
    # every tick (<= 0.5 s), not only after a reap: a process can die after the reap that followed its
    # parent's death, or be reaped by its own parent; the driver frees the memory either way
    gpu_release_dead()


def _reap_children():
    n = 0
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return n
        if pid == 0:
            return n
        n += 1
        with CHILD_LOCK:  # a main process is done with here; a control process's status waits for wait_child
            ch = CHILDREN.get(pid)
            if ch is not None and ch.on_exit:
                CHILDREN.pop(pid, None)
        if ch is not None:
            ch.status = status
            ch.event.set()
            if ch.on_exit:
                try:
                    ch.on_exit(pid, status)
                except Exception as e:  # noqa: BLE001
                    journal("init", "on_exit %d: %s" % (pid, e))


def decode_status(status):
    """-> (ExecMainCode, ExecMainStatus): 1 exited / 2 killed / 3 dumped, as systemd's CLD_*."""
    if os.WIFEXITED(status):
        return 1, os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return (3 if os.WCOREDUMP(status) else 2), os.WTERMSIG(status)
    return 1, 0


def status_text(code, st):
    if code == 1:
        return "code=exited, status=%d/%s" % (st, EXIT_NAMES.get(st, str(st)))
    try:
        sname = signal.Signals(st).name[3:]
    except ValueError:
        sname = str(st)
    return "code=%s, signal=%s" % ("killed" if code == 2 else "dumped", sname)


# --- services ----------------------------------------------------------------------------

class Service(object):
    def __init__(self, name):
        self.name = name
        self.job = threading.Lock()
        self.active, self.sub = "inactive", "dead"
        self.result = "success"
        self.main_pid = 0
        self.exec_main = {"pid": 0, "code": 0, "status": 0, "start": 0, "exit": 0}
        self.nrestarts = 0
        self.invocation = ""
        self.stopping = False
        self.run_id = 0
        self.ts = {"ActiveEnter": 0, "ActiveExit": 0, "InactiveEnter": 0, "InactiveExit": 0, "StateChange": 0}
        self.starts = []
        self.restart_cancel = threading.Event()
        self.unit = None  # definition the current run was started with

    def set(self, active, sub):
        with LOCK:
            prev = self.active
            t = now_us()
            if active != prev:
                if active == "active":
                    self.ts["ActiveEnter"] = t
                if prev == "active":
                    self.ts["ActiveExit"] = t
                if active in ("inactive", "failed"):
                    self.ts["InactiveEnter"] = t
                if prev in ("inactive", "failed"):
                    self.ts["InactiveExit"] = t
            self.active, self.sub = active, sub
            self.ts["StateChange"] = t


def svc(name):
    with LOCK:
        s = SVC.get(name)
        if s is None:
            s = SVC[name] = Service(name)
        return s


# --- Exec*= command lines, as systemd 252 reads them (systemd.service(5) "Command lines") ---------------------------
# Load time (src/core/load-fragment.c config_parse_exec()): words by extract_first_word(EXTRACT_UNQUOTE|
# EXTRACT_CUNESCAPE) (src/basic/extract-word.c; single and double quotes alike, C escapes inside and outside quotes),
# a lone ";" separates commands and "\;" is a literal ";", the prefixes - @ : + ! of the first word, then the
# specifiers of every word (src/core/unit-printf.c unit_full_printf(), src/shared/specifier.c specifier_printf()).
# Exec time (src/core/execute.c exec_child() -> src/basic/env-util.c replace_env_argv()): "$$" -> "$", "${VAR}"
# anywhere in a word, "$VAR" only as a whole word (split at whitespace); nothing with the ":" prefix.

WHITESPACE = " \t\n\r"
C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
             "'": "'", "s": " "}
HEX = "0123456789abcdefABCDEF"


class BadSetting(ValueError):
    """A setting systemd refuses at load time (the unit's LoadState becomes bad-setting)."""


def _byte(v):
    # an eight-bit escape is a raw byte (escape.c: *eight_bit); surrogateescape keeps it one through os.fsencode
    return chr(v) if v < 0x80 else chr(0xdc00 + v)


def cunescape_one(text, i):
    """src/basic/escape.c cunescape_one(): (character, length) of the escape at text[i:], or None when invalid."""
    c = text[i:i + 1]
    if c in C_ESCAPES and c:
        return C_ESCAPES[c], 1
    n = {"x": 2, "u": 4, "U": 8}.get(c)
    if n:
        h = text[i + 1:i + 1 + n]
        if len(h) != n or any(ch not in HEX for ch in h) or int(h, 16) == 0:
            return None
        v = int(h, 16)
        if c == "U" and (v >= 0x110000 or (v & 0xFFFFF800) == 0xD800 or 0xFDD0 <= v <= 0xFDEF or (v & 0xFFFE) == 0xFFFE):
            return None  # unichar_is_valid()
        return (_byte(v) if c == "x" else chr(v)), n + 1
    o = text[i:i + 3]
    if c and c in "01234567" and len(o) == 3 and all(ch in "01234567" for ch in o) and 0 < int(o, 8) <= 255:
        return _byte(int(o, 8)), 3
    return None


def extract_word(text, i, cunescape=True, relax=False, unescape_relax=False):
    """src/basic/extract-word.c extract_first_word() with EXTRACT_UNQUOTE (+ EXTRACT_CUNESCAPE, EXTRACT_RELAX,
    EXTRACT_UNESCAPE_RELAX): (word, index after it and its separators), (None, len) at the end; ValueError (EINVAL) on
    an unknown escape or unbalanced quotes."""
    n = len(text)
    while i < n and text[i] in WHITESPACE:
        i += 1
    if i >= n:
        return None, n
    out, quote = [], None
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 >= n:
                if unescape_relax and (quote is None or relax):
                    return "".join(out) + "\\", n
                if relax:
                    return "".join(out), n
                raise ValueError("trailing backslash")
            if not cunescape:
                out.append(text[i + 1])
                i += 2
                continue
            esc = cunescape_one(text, i + 1)
            if esc:
                out.append(esc[0])
                i += 1 + esc[1]
            elif unescape_relax:
                out.append("\\" + text[i + 1])
                i += 2
            else:
                raise ValueError("unknown escape")
            continue
        i += 1
        if quote:
            if c == quote:
                quote = None
            else:
                out.append(c)
        elif c in "'\"":
            quote = c
        elif c in WHITESPACE:
            while i < n and text[i] in WHITESPACE:
                i += 1
            return "".join(out), i
        else:
            out.append(c)
    if quote and not relax:
        raise ValueError("unbalanced quoting")
    return "".join(out), n


def extract_word_and_warn(text, i, warn):
    """src/basic/extract-word.c extract_first_word_and_warn(): an unknown escape is kept verbatim (with a warning),
    unbalanced quoting is an error."""
    try:
        return extract_word(text, i)
    except ValueError:
        pass
    try:
        word, j = extract_word(text, i, unescape_relax=True)
    except ValueError:
        raise BadSetting('Unbalanced quoting, ignoring: "%s"' % text)
    warn('Ignoring unknown escape sequences: "%s"' % word)
    return word, j


def _unit_unescape(text):
    """src/basic/unit-name.c unit_name_unescape(): "-" -> "/", "\\xNN" -> the byte."""
    out, i = "", 0
    while i < len(text):
        if text[i] == "-":
            out += "/"
        elif text[i:i + 2] == "\\x" and len(text[i:i + 4]) == 4 and all(c in HEX for c in text[i + 2:i + 4]):
            out += _byte(int(text[i + 2:i + 4], 16))
            i += 3
        else:
            out += text[i]
        i += 1
    return out


def _read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _os_release(key):
    for line in _read("/etc/os-release").splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip().strip('"')
    return ""


def specifier_table(name, fragment=None):
    """src/core/unit-printf.c unit_full_printf_full()'s table (system manager, run by root)."""
    prefix = name.rsplit(".", 1)[0]
    pre, _, inst = prefix.partition("@")
    last = pre.rsplit("-", 1)[-1] if "-" in pre else ""
    host = socket.gethostname()
    return {
        "i": inst, "I": _unit_unescape(inst), "j": last, "J": _unit_unescape(last), "n": name, "N": prefix, "p": pre,
        "P": _unit_unescape(pre), "f": "/" + _unit_unescape(inst or pre).lstrip("/"),
        "y": fragment or "", "Y": os.path.dirname(fragment or ""),
        "c": "/system.slice/" + name, "r": "/system.slice", "R": "/",
        "C": "/var/cache", "d": "/run/credentials/" + name, "E": "/etc", "L": "/var/log", "S": "/var/lib", "t": "/run",
        "h": "/root", "s": "/bin/sh",
        "a": "x86-64", "A": _os_release("IMAGE_VERSION"), "b": _read("/proc/sys/kernel/random/boot_id").replace("-", ""),
        "B": _os_release("BUILD_ID"), "H": host, "l": host.split(".")[0], "q": host, "m": _read("/etc/machine-id"),
        "M": _os_release("IMAGE_ID"), "o": _os_release("ID"), "v": os.uname().release, "w": _os_release("VERSION_ID"),
        "W": _os_release("VARIANT_ID"), "g": "root", "G": "0", "u": "root", "U": "0", "T": "/tmp", "V": "/var/tmp",
    }


def specifier_printf(text, table):
    """src/shared/specifier.c specifier_printf(): "%%" -> "%", a known specifier -> its value, an unknown letter or
    digit -> EBADSLT (BadSetting), any other "%c" and a trailing "%" stay."""
    out, i = "", 0
    while i < len(text):
        c = text[i]
        if c != "%":
            out += c
        elif i + 1 >= len(text):
            out += "%"
        else:
            i += 1
            f = text[i]
            if f == "%":
                out += "%"
            elif f in table:
                out += table[f]
            elif f.isalnum() and f.isascii():
                raise BadSetting("Failed to resolve unit specifiers in %s: Invalid slot" % text)
            else:
                out += "%" + f
        i += 1
    return out


def specifiers(word, name):
    return specifier_printf(word, specifier_table(name))


def _string_is_safe(p):
    # src/basic/string-util.c string_is_safe(): no control characters, quotes, backslash or DEL
    return not any(0 < ord(c) < 32 or c in "\"'\\\x7f" for c in p)


def config_parse_exec(rvalue, table, warn=lambda msg: None):
    """One Exec*= value -> its commands [{"path", "argv", "ignore", "no_expand"}] (src/core/load-fragment.c
    config_parse_exec()). BadSetting where systemd returns -ENOEXEC; with the "-" prefix such a command is dropped
    with the rest of the line (systemd returns 0 there), the commands before it stay."""
    cmds, i, semicolon = [], 0, True
    while semicolon:
        semicolon = False
        try:
            first, i = extract_word_and_warn(rvalue, i, warn)
        except BadSetting as e:  # "if (r <= 0) return 0;": the line is ignored, not refused
            warn(str(e))
            return cmds
        if first is None:
            return cmds
        if first == ";":
            semicolon = True
            continue
        f, flags = first, set()
        while f:
            ch = f[0]
            if ch == "-" and "-" not in flags or ch == "@" and "@" not in flags or ch == ":" and ":" not in flags:
                flags.add(ch)
            elif ch == "+" and not flags & {"+", "!", "!!"}:
                flags.add("+")
            elif ch == "!" and not flags & {"+", "!", "!!"}:
                flags.add("!")
            elif ch == "!" and not flags & {"+", "!!"}:
                flags = (flags - {"!"}) | {"!!"}
            else:
                break
            f = f[1:]
        ignore = "-" in flags

        def bad(msg):
            warn(msg)
            if ignore:
                return True
            raise BadSetting(msg)
        try:
            path = specifier_printf(f, table)
        except BadSetting:
            if bad("Failed to resolve unit specifiers in '%s'%s: Invalid slot" % (f, ", ignoring" if ignore else "")):
                return cmds
        problem = ("Empty path in command line" if not path else
                   "Executable name contains special characters" if not _string_is_safe(path) else
                   "Executable path specifies a directory" if path.endswith("/") else
                   "Neither a valid executable name nor an absolute path"
                   if (path in (".", "..") or "/" in path or len(path) > 255) and not path.startswith("/") else None)
        if problem and bad("%s%s: %s" % (problem, ", ignoring" if ignore else "", path or rvalue)):
            return cmds
        argv = [] if "@" in flags else [path]
        while i < len(rvalue):
            rest = rvalue[i:]
            if rest[0] == ";" and (len(rest) == 1 or rest[1] in WHITESPACE):
                i += 1
                while i < len(rvalue) and rvalue[i] in WHITESPACE:
                    i += 1
                semicolon = True
                break
            if rest[:2] == "\\;" and (len(rest) == 2 or rest[2] in WHITESPACE):
                i += 2
                while i < len(rvalue) and rvalue[i] in WHITESPACE:
                    i += 1
                argv.append(";")
                continue
            try:
                word, i = extract_word_and_warn(rvalue, i, warn)
                if word is None:
                    break
                argv.append(specifier_printf(word, table))
            except BadSetting as e:
                if bad(str(e)):
                    return cmds
        if not argv and bad("Empty executable name or zeroeth argument%s: %s" % (", ignoring" if ignore else "", rvalue)):
            return cmds
        cmds.append({"path": os.path.normpath(path) if path.startswith("/") else path, "argv": argv, "ignore": ignore,
                     "no_expand": ":" in flags, "line": rvalue})
    return cmds


def replace_env(word, env):
    """src/basic/env-util.c replace_env_n() without flags: "${VAR}" -> its value (empty when unset), "$$" -> "$",
    "${VAR:-x}" and a lone "$" or "$VAR" inside a word stay as written."""
    out, i, n = "", 0, len(word)
    while i < n:
        if word[i] == "$" and word[i + 1:i + 2] == "$":
            out += "$"
            i += 2
        elif word[i] == "$" and word[i + 1:i + 2] == "{":
            j = i + 2
            while j < n and word[j] not in "}:":
                j += 1
            if j < n and word[j] == "}":
                out += env.get(word[i + 2:j], "")
                i = j + 1
            else:  # unterminated, or ":" (REPLACE_ENV_ALLOW_EXTENDED unset): no replacement
                out += word[i:j]
                i = j
        else:
            out += word[i]
            i += 1
    return out


def replace_env_argv(argv, env):
    """src/basic/env-util.c replace_env_argv(): a word "$VAR" (not "${" or "$$") becomes the value's words
    (strv_split_full(EXTRACT_RELAX|EXTRACT_UNQUOTE): quotes in the value group, no C escapes), or nothing when unset;
    every other word goes through replace_env()."""
    out = []
    for w in argv:
        if w.startswith("$") and w[1:2] not in ("{", "$"):
            value, i = env.get(w[1:]) if w[1:] else None, 0
            while value is not None:
                word, i = extract_word(value, i, cunescape=False, relax=True)
                if word is None:
                    break
                out.append(word)
            continue
        out.append(replace_env(w, env))
    return out


def parse_environment(rvalue, table):
    """src/core/load-fragment.c config_parse_environ(): words by extract_first_word(EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE),
    specifiers resolved, no $ expansion; a syntax error ends the line (the words before it stay), an invalid
    assignment is skipped."""
    env, i = {}, 0
    while True:
        try:
            word, i = extract_word(rvalue, i)
        except ValueError:
            return env
        if word is None:
            return env
        try:
            word = specifier_printf(word, table)
        except BadSetting:
            continue
        k, eq, v = word.partition("=")
        if eq and k and not k[0].isdigit() and all(c.isalnum() or c == "_" for c in k) and k.isascii():
            env[k] = v


def load_env_file(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            k, v = line.split("=", 1)
            k, v = k.strip(), v.strip()
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
                v = v[1:-1]
                if line.split("=", 1)[1].strip()[0] == '"':
                    v = v.replace('\\"', '"').replace("\\\\", "\\")
            env[k] = v
    return env


def service_env(u, s):
    env = {"PATH": SERVICE_PATH, "INVOCATION_ID": s.invocation, MARK: "/system.slice/%s" % u.name}
    user = u.get("User")
    if user:
        try:
            pw = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
            env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name, SHELL=pw.pw_shell)
        except KeyError:
            pass
    for line in u.svc.get("Environment", []):
        env.update(parse_environment(line, specifier_table(u.name, u.path)))
    for line in u.svc.get("EnvironmentFile", []):
        optional = line.startswith("-")
        path = line.lstrip("-").strip()
        try:
            env.update(load_env_file(path))
        except OSError as e:
            if not optional:
                raise EnvironmentError("Failed to load environment files: %s: %s" % (path, e.strerror))
    env[MARK] = "/system.slice/%s" % u.name
    env["INVOCATION_ID"] = s.invocation
    return env


def run_cmd(u, s, cmd, env, main=False):
    """Run one parsed command (as control process, or the main process when ``main``): the executable is its path,
    argv[0] what the line (or the "@" prefix) gave."""
    argv = cmd["argv"] if cmd["no_expand"] else replace_env_argv(cmd["argv"], env)
    ignore = cmd["ignore"]
    e = dict(env)
    if not argv:
        argv = [cmd["path"]]
    if argv[0] != cmd["path"]:
        e["__ARGV0__"] = argv[0]
    argv = [cmd["path"]] + argv[1:]
    lim = u.get("LimitNOFILE")
    if lim:
        vals = [resource.RLIM_INFINITY if v == "infinity" else int(v) for v in lim.split(":")]
        e["__NOFILE__"] = (vals[0], vals[-1])
    cwd = u.get("WorkingDirectory")
    optional_cwd = bool(cwd and cwd.startswith("-"))
    cwd = (cwd or "/").lstrip("-")
    if cwd == "~":
        cwd = env.get("HOME", "/root")
    if optional_cwd and not os.path.isdir(cwd):
        cwd = "/"
    on_exit = (lambda pid, st, run=s.run_id: main_exited(u.name, run, pid, st)) if main else None
    pid, err = spawn(u.name, argv, e, cwd, u.get("User"), u.get("Group"), u.get("StandardOutput"),
                     u.get("StandardError"), on_exit)
    return pid, err, ignore


def run_sync(u, s, cmds, env):
    """Control processes in order; -> (rc, status) of the first failing non-ignored one, or (0, 0)."""
    for cmd in cmds:
        pid, err, ignore = run_cmd(u, s, cmd, env)
        status = wait_child(pid)
        code, st = decode_status(status or 0)
        if (code != 1 or st != 0) and not ignore:
            return (code, st)
    return (0, 0)


def start(name, out):
    u = unit(name)
    if u.load_state == "not-found":
        out["err"] += "Failed to start %s: Unit %s not found.\n" % (name, name)
        return 5
    if u.masked:
        out["err"] += "Failed to start %s: Unit %s is masked.\n" % (name, name)
        return 1
    if u.load_state == "bad-setting":
        out["err"] += ("Failed to start %s: Unit %s has a bad unit file setting.\nSee system logs and 'systemctl "
                       "status %s' for details.\n" % (name, name, name))
        return 1
    warn_reload(u, out)
    s = svc(name)
    if s.sub == "auto-restart":
        s.restart_cancel.set()
    with s.job:
        return _start_locked(u, s, out, manual=True)


def job_failed(name, out, why="the control process exited with error code"):
    out["err"] += ('Job for %s failed because %s.\nSee "systemctl status %s" and "journalctl -xeu %s" for '
                   'details.\n' % (name, why, name, name))
    return 1


def _start_limit_hit(u, s):
    burst = int(u.get("StartLimitBurst", "5", "Unit") or u.get("StartLimitBurst", "5"))
    interval = seconds(u.get("StartLimitIntervalSec", None, "Unit") or u.get("StartLimitInterval", None, "Unit"), 10.0)
    t = time.time()
    s.starts = [x for x in s.starts if t - x < interval] + [t]
    return burst > 0 and interval > 0 and len(s.starts) > burst


def _start_locked(u, s, out, manual):
    if s.active in ("active", "activating", "reloading") and not (s.sub == "auto-restart" and not manual):
        if s.sub == "auto-restart" and manual:
            s.restart_cancel.set()
        else:
            return 0
    if _start_limit_hit(u, s):
        s.result = "start-limit-hit"
        s.set("failed", "failed")
        journal(u.name, "%s: Start request repeated too quickly.\nFailed to start %s." % (u.name, describe(u)))
        return job_failed(u.name, out, "the start of the service was attempted too often") if out is not None else 1
    if manual:
        s.nrestarts = 0
    left = members(u.name)
    for pid in left:
        journal(u.name, "%s: Found left-over process %d (%s) in control group while starting unit. Ignoring.\n"
                        "%s: This usually indicates unclean termination of a previous run, or service "
                        "implementation deficiencies." % (u.name, pid, comm(pid), u.name))
    with LOCK:
        s.run_id += 1
        s.unit = u
        s.invocation = uuid.uuid4().hex
        s.result = "success"
        s.main_pid = 0
        s.exec_main = {"pid": 0, "code": 0, "status": 0, "start": 0, "exit": 0}
        s.restart_cancel.clear()
    s.set("activating", "start-pre")
    if u.name not in START_ORDER:
        START_ORDER.append(u.name)
    journal(u.name, "Starting %s..." % describe(u))
    try:
        env = service_env(u, s)
    except EnvironmentError as e:
        journal(u.name, "%s: %s" % (u.name, e))
        s.result = "resources"
        s.set("failed", "failed")
        journal(u.name, "%s: Failed with result 'resources'.\nFailed to start %s." % (u.name, describe(u)))
        return job_failed(u.name, out, "of unavailable resources or another system error") if out is not None else 1
    code, st = run_sync(u, s, u.cmds("ExecStartPre"), env)
    if code or st:
        return _start_failed(u, s, out, "exit-code")
    typ = u.type
    if typ == "oneshot":
        s.set("activating", "start")
        for cmd in u.cmds("ExecStart"):
            pid, err, ignore = run_cmd(u, s, cmd, env)
            with LOCK:
                s.exec_main.update(pid=pid, start=now_us())
            status = wait_child(pid)
            code, st = decode_status(status or 0)
            with LOCK:
                s.exec_main.update(code=code, status=st, exit=now_us())
            if (code != 1 or st != 0) and not ignore:
                return _start_failed(u, s, out, "exit-code" if code == 1 else "signal")
        run_sync(u, s, u.cmds("ExecStartPost"), env)
        if u.get("RemainAfterExit", "no").lower() in ("yes", "true", "1", "on"):
            s.set("active", "exited")
        else:
            s.set("active", "exited")
            _kill_rest(u, s)
            s.set("inactive", "dead")
        journal(u.name, "Finished %s." % describe(u))
        return 0
    if typ == "forking":
        pid, err, _ = run_cmd(u, s, u.cmds("ExecStart")[0], env)
        code, st = decode_status(wait_child(pid) or 0)
        if code != 1 or st != 0:
            return _start_failed(u, s, out, "exit-code")
        main = 0
        pidfile = u.get("PIDFile")
        if pidfile:
            try:
                with open(pidfile) as f:
                    main = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                main = 0
        mem = members(u.name)
        main = main or (mem[0] if mem else 0)
        if not main:
            return _start_failed(u, s, out, "protocol")
        with LOCK:
            s.main_pid = main
            s.exec_main.update(pid=main, start=now_us())
        s.set("active", "running")
        threading.Thread(target=_watch_foreign_main, args=(u.name, s.run_id, main), daemon=True).start()
        journal(u.name, "Started %s." % describe(u))
        return 0
    # simple / exec / notify / idle
    pid, err, _ = run_cmd(u, s, u.cmds("ExecStart")[0], env, main=True)
    with LOCK:
        s.exec_main.update(pid=pid, start=now_us())
        if s.exec_main.get("code") == 0:  # not yet reaped
            s.main_pid = pid
            s.set("active", "running")
    if err and typ == "exec":
        return job_failed(u.name, out) if out is not None else 1
    run_sync(u, s, u.cmds("ExecStartPost"), env)
    journal(u.name, "Started %s." % describe(u))
    return 0


def _watch_foreign_main(name, run, pid):
    while alive(pid):
        time.sleep(0.2)
    main_exited(name, run, pid, 0)


def _start_failed(u, s, out, result):
    s.result = result
    _kill_rest(u, s)
    s.set("failed", "failed")
    journal(u.name, "%s: Failed with result '%s'.\nFailed to start %s." % (u.name, result, describe(u)))
    if out is None:
        return 1
    return job_failed(u.name, out, "the service did not take the steps required by its unit configuration"
                      if result == "protocol" else "the control process exited with error code")


def describe(u):
    d = u.get("Description", None, "Unit")
    return "%s - %s" % (u.name, d) if d else u.name


def kill_mode(u):
    return u.get("KillMode", "control-group")


def kill_signal(u):
    name = u.get("KillSignal", "SIGTERM")
    try:
        return int(name)
    except ValueError:
        return getattr(signal, name if name.startswith("SIG") else "SIG" + name, signal.SIGTERM)


def _wait(cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _kill_rest(u, s):
    """After the main process is gone: end the rest of the cgroup per KillMode."""
    mode = kill_mode(u)
    if mode in ("process", "none"):
        return True
    rest = members(u.name)
    if not rest:
        return True
    s.set("deactivating", "stop-sigterm")
    if mode == "mixed":
        kill(rest, signal.SIGKILL)
        return _wait(lambda: not members(u.name), 5)
    kill_and_sigcont(rest, kill_signal(u))
    if _wait(lambda: not members(u.name), seconds(u.get("TimeoutStopSec"), 90.0)):
        return True
    s.set("deactivating", "stop-sigkill")
    kill(members(u.name), signal.SIGKILL)
    _wait(lambda: not members(u.name), 5)
    return False


def main_exited(name, run, pid, status):
    """Reaper callback (main thread): record the exit; the follow-up runs in a worker."""
    s = svc(name)
    code, st = decode_status(status)
    with LOCK:
        if run != s.run_id:
            return
        s.exec_main.update(code=code, status=st, exit=now_us())
        if s.main_pid == pid:
            s.main_pid = 0
        if s.stopping:
            return
    threading.Thread(target=_after_main_exit, args=(name, run, code, st), daemon=True).start()


def _after_main_exit(name, run, code, st):
    s = svc(name)
    with s.job:
        if run != s.run_id or s.stopping:
            return
        u = s.unit
        clean = (code == 1 and st == 0) or (code == 2 and st in CLEAN_SIGNALS)
        for extra in (u.get("SuccessExitStatus") or "").split():
            if (code == 1 and extra.isdigit() and int(extra) == st) or (code != 1 and extra in (signal.Signals(st).name,)):
                clean = True
        if not clean:
            s.result = "exit-code" if code == 1 else ("core-dump" if code == 3 else "signal")
            journal(name, "%s: Main process exited, %s" % (name, status_text(code, st)))
        env = {}
        try:
            env = service_env(u, s)
        except EnvironmentError:
            pass
        if u.cmds("ExecStop"):
            run_sync(u, s, u.cmds("ExecStop"), env)
        _kill_rest(u, s)
        run_sync(u, s, u.cmds("ExecStopPost"), env)
        restart = u.get("Restart", "no")
        again = restart == "always" or (restart == "on-failure" and not clean) or (restart == "on-abnormal" and code != 1)
        if again and not SHUTDOWN.is_set():
            s.set("activating", "auto-restart")
            journal(name, "%s: Scheduled restart job, restart counter is at %d." % (name, s.nrestarts + 1))
            if s.restart_cancel.wait(seconds(u.get("RestartSec"), 0.1)):
                s.set("failed" if s.result != "success" else "inactive", "failed" if s.result != "success" else "dead")
                return
            s.nrestarts += 1
            _start_locked(unit(name), s, None, manual=False)
            return
        if clean:
            s.set("inactive", "dead")
            journal(name, "%s: Deactivated successfully." % name)
        else:
            s.set("failed", "failed")
            journal(name, "%s: Failed with result '%s'." % (name, s.result))


def stop(name, out, verb="stop"):
    u = unit(name)
    if u.load_state == "not-found" and name not in SVC:
        out["err"] += "Failed to %s %s: Unit %s not loaded.\n" % (verb, name, name)
        return 5
    warn_reload(u, out)
    s = svc(name)
    if s.sub == "auto-restart":
        s.restart_cancel.set()
    with s.job:
        return _stop_locked(s.unit or u, s)


def _stop_locked(u, s):
    if s.active in ("inactive", "failed") and not s.main_pid:
        return 0
    with LOCK:
        s.stopping = True
    try:
        journal(u.name, "Stopping %s..." % describe(u))
        env = {}
        try:
            env = service_env(u, s)
            env["MAINPID"] = str(s.main_pid or "")
        except EnvironmentError:
            pass
        s.set("deactivating", "stop")
        if s.active != "failed" and u.cmds("ExecStop") and alive(s.main_pid):
            run_sync(u, s, u.cmds("ExecStop"), env)
        mode, sig = kill_mode(u), kill_signal(u)
        timeout = seconds(u.get("TimeoutStopSec"), 90.0)
        main = s.main_pid
        s.set("deactivating", "stop-sigterm")
        if mode == "control-group":
            kill_and_sigcont(set(members(u.name)) | ({main} if main else set()), sig)
        elif mode in ("process", "mixed"):
            kill_and_sigcont([main], sig)

        def done():
            if mode == "control-group":
                return not members(u.name) and not alive(main)
            return mode == "none" or not alive(main)
        timed_out = not _wait(done, timeout)
        if timed_out:
            journal(u.name, "%s: State 'stop-sigterm' timed out. Killing." % u.name)
            s.set("deactivating", "stop-sigkill")
        if timed_out or mode == "mixed":
            targets = ([main] if mode == "process" else members(u.name) + ([main] if main else []))
            if timed_out:
                for pid in targets:
                    if alive(pid):
                        journal(u.name, "%s: Killing process %d (%s) with signal SIGKILL." % (u.name, pid, comm(pid)))
            kill(targets, signal.SIGKILL)
            _wait(lambda: not alive(main) and (mode == "process" or not members(u.name)), 5)
        if main:
            wait_main = time.time() + 2
            while s.main_pid == main and time.time() < wait_main:
                time.sleep(0.01)
        with LOCK:
            s.main_pid = 0
            if timed_out:
                s.result = "timeout"
        run_sync(u, s, u.cmds("ExecStopPost"), env)
        if timed_out:
            s.set("failed", "failed")
            journal(u.name, "%s: Failed with result 'timeout'." % u.name)
        else:
            s.set("inactive", "dead")
            journal(u.name, "%s: Deactivated successfully.\nStopped %s." % (u.name, describe(u)))
    finally:
        with LOCK:
            s.stopping = False
            s.run_id += 1  # late exits of the old run are ignored
    return 0


def warn_reload(u, out):
    if u.load_state != "not-found" and u.changed_on_disk():
        out["err"] += ("Warning: The unit file, source configuration file or drop-ins of %s changed on disk. Run "
                       "'systemctl daemon-reload' to reload units.\n" % u.name)


# --- enable / disable ---------------------------------------------------------------------

def enable(name, out):
    u = Unit(name)
    if u.load_state == "not-found":
        out["err"] += "Failed to enable unit: Unit file %s does not exist.\n" % name
        return 1
    if u.masked:
        out["err"] += "Failed to enable unit: Unit file %s is masked.\n" % u.path
        return 1
    links = u.install_links()
    if not links:
        out["err"] += ("The unit files have no installation config (WantedBy=, RequiredBy=, Also=,\nAlias= settings in "
                       "the [Install] section, and DefaultInstance= for template\nunits). This means they are not "
                       "meant to be enabled or disabled using systemctl.\n")
    for link in links:
        if os.path.lexists(link):
            continue
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(u.path, link)
        out["err"] += "Created symlink %s \u2192 %s.\n" % (link, u.path)
    return 0


def disable(name, out):
    u = Unit(name)
    if u.load_state == "not-found":
        out["err"] += "Failed to disable unit: Unit file %s does not exist.\n" % name
        return 1
    for link in u.install_links():
        if os.path.islink(link):
            os.unlink(link)
            out["err"] += "Removed \"%s\".\n" % link
    return 0


# --- show / status -------------------------------------------------------------------------

def properties(name):
    u = unit(name)
    s = SVC.get(name) or Service(name)
    d = s.unit or u
    active = s.active
    cg_members = members(name)
    t_stop = seconds(d.get("TimeoutStopSec"), 90.0)
    restart_s = seconds(d.get("RestartSec"), 0.1)
    restart_us = fmt_span(restart_s) if restart_s >= 1 else "%dms" % int(restart_s * 1000)
    pr = {
        "Id": name, "Names": name, "Description": d.get("Description", name, "Unit"),
        "LoadState": u.load_state, "ActiveState": active, "SubState": s.sub,
        "FragmentPath": u.path or "", "UnitFileState": u.enabled_state() or "",
        "UnitFilePreset": "enabled" if u.load_state == "loaded" else "",
        "Type": d.type if u.load_state != "not-found" else "simple",
        "Restart": d.get("Restart", "no"), "KillMode": kill_mode(d), "KillSignal": str(kill_signal(d)),
        "TimeoutStopUSec": fmt_span(t_stop), "RestartUSec": restart_us,
        "MainPID": str(s.main_pid or 0), "ExecMainPID": str(s.exec_main["pid"]),
        "ExecMainCode": str(s.exec_main["code"]), "ExecMainStatus": str(s.exec_main["status"]),
        "ExecMainStartTimestamp": fmt_ts(s.exec_main["start"]), "ExecMainExitTimestamp": fmt_ts(s.exec_main["exit"]),
        "Result": s.result, "NRestarts": str(s.nrestarts), "InvocationID": s.invocation,
        "ControlGroup": "/system.slice/%s" % name if (active in ("active", "activating", "deactivating", "reloading")
                                                      or cg_members) else "",
        "NeedDaemonReload": "yes" if (u.load_state != "not-found" and u.changed_on_disk()) else "no",
        "WorkingDirectory": d.get("WorkingDirectory", "") if u.load_state != "not-found" else "",
        "User": d.get("User", "") if u.load_state != "not-found" else "",
        "TasksCurrent": str(len(cg_members)) if cg_members else "[not set]",
        "MemoryCurrent": "[not set]", "CanStart": "yes" if u.load_state == "loaded" else "no",
        "CanStop": "yes" if u.load_state == "loaded" else "no",
    }
    for k in EXEC_KEYS:
        if d.cmds(k):
            pr[k] = _exec_property(d.cmds(k))
    for k in ("ActiveEnter", "ActiveExit", "InactiveEnter", "InactiveExit", "StateChange"):
        pr[k + "Timestamp"] = fmt_ts(s.ts[k])
    if u.load_state == "not-found":
        pr["LoadError"] = 'org.freedesktop.systemd1.NoSuchUnit "Unit %s not found."' % name
    elif u.load_state == "bad-setting":
        pr["LoadError"] = 'org.freedesktop.systemd1.BadUnitSetting "Unit %s has a bad unit file setting."' % name
    return pr


# The order of `systemctl show`: the D-Bus reply's (src/core/dbus-service.c, then the unit's cgroup, execute and kill
# vtables, src/core/dbus-unit.c last), not the order of -p.
SHOW_SERVICE = ("Type", "Restart", "RestartUSec", "TimeoutStopUSec", "MainPID", "Result", "NRestarts",
                "ExecMainStartTimestamp", "ExecMainExitTimestamp", "ExecMainPID", "ExecMainCode", "ExecMainStatus")
SHOW_UNIT = ("ControlGroup", "MemoryCurrent", "TasksCurrent", "WorkingDirectory", "User", "KillMode", "KillSignal",
             "Id", "Names", "Description", "LoadState", "ActiveState", "SubState", "FragmentPath", "UnitFileState",
             "UnitFilePreset", "StateChangeTimestamp", "InactiveExitTimestamp", "ActiveEnterTimestamp",
             "ActiveExitTimestamp", "InactiveEnterTimestamp", "CanStart", "CanStop", "NeedDaemonReload", "LoadError",
             "InvocationID")
SHOW_ORDER = SHOW_SERVICE + EXEC_KEYS + SHOW_UNIT
FEATURES = ("+PAM +AUDIT +SELINUX +APPARMOR +IMA +SMACK +SECCOMP +GCRYPT -GNUTLS +OPENSSL +ACL +BLKID +CURL +ELFUTILS "
            "+FIDO2 +IDN2 -IDN +IPTC +KMOD +LIBCRYPTSETUP +LIBFDISK +PCRE2 -PWQUALITY +P11KIT +QRENCODE +TPM2 +BZIP2 +LZ4 "
            "+XZ +ZLIB +ZSTD -BPF_FRAMEWORK -XKBCOMMON +UTMP +SYSVINIT default-hierarchy=unified")


def show_text(pr, props, flags):
    """src/systemctl/systemctl-show.c show_one() -> src/shared/bus-print-properties.c: every property in the reply's
    order, empty ones only with -p (which also filters) or --all; --value prints the values alone."""
    show_empty = bool(props) or "-a" in flags or "--all" in flags
    order = [k for k in SHOW_ORDER if k in pr] + [k for k in pr if k not in SHOW_ORDER]
    out = ""
    for k in order:
        if (props and k not in props) or (pr[k] == "" and not show_empty):
            continue
        for v in (pr[k] if isinstance(pr[k], list) else [pr[k]]):
            out += (v + "\n") if "--value" in flags else "%s=%s\n" % (k, v)
    return out


def manager_properties():
    """`systemctl show` without a unit: the manager's properties (src/core/dbus-manager.c), those a container has."""
    with LOCK:
        failed = sum(1 for x in SVC.values() if x.active == "failed")
        n_names = len(UNITS)
    return {"Version": "252.36-1~deb12u1", "Features": FEATURES, "Virtualization": "lxc", "Architecture": "x86-64",
            "Tainted": "", "NNames": str(n_names), "NFailedUnits": str(failed), "NJobs": "0",
            "Environment": "LANG=C.UTF-8 PATH=%s" % SERVICE_PATH, "UnitPath": " ".join(UNIT_DIRS),
            "DefaultStandardOutput": "journal", "DefaultStandardError": "inherit",
            "DefaultTimeoutStopUSec": "1min 30s", "SystemState": "stopping" if SHUTDOWN.is_set() else "running",
            "ExitCode": "0"}


def _exec_property(cmds):
    # src/systemctl/systemctl-show.c print_property() for a(sasbttttuii); the runtime fields are not tracked here
    return ["{ path=%s ; argv[]=%s ; ignore_errors=%s ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; "
            "status=0/0 }" % (c["path"], " ".join(c["argv"]), "yes" if c["ignore"] else "no") for c in cmds]


def status(name, out, lines=10):
    u = unit(name)
    if u.load_state == "not-found" and name not in SVC:
        out["err"] += "Unit %s could not be found.\n" % name
        return 4
    warn_reload(u, out)
    pr = properties(name)
    s = svc(name)
    act = pr["ActiveState"]
    dot = {"active": "\u25cf", "failed": "\u00d7"}.get(act, "\u25cb")
    o = "%s %s\n" % (dot, describe(s.unit or u))
    o += "     Loaded: %s (%s; %s; preset: enabled)\n" % (pr["LoadState"], pr["FragmentPath"], pr["UnitFileState"])
    since = pr["StateChangeTimestamp"]
    ago = ""
    if s.ts["StateChange"]:
        ago = "; %s ago" % fmt_span(time.time() - s.ts["StateChange"] / 1e6)
    if act == "failed":
        o += "     Active: failed (Result: %s)%s\n" % (s.result, " since %s%s" % (since, ago) if since else "")
    else:
        o += "     Active: %s (%s)%s\n" % (act, pr["SubState"], " since %s%s" % (since, ago) if since else "")
    if s.exec_main["pid"] and s.exec_main["exit"]:
        o += "    Process: %d ExecStart=%s (%s)\n" % (s.exec_main["pid"], ((s.unit or u).svc.get("ExecStart") or [""])[0],
                                                      status_text(s.exec_main["code"], s.exec_main["status"]))
    if s.main_pid:
        o += "   Main PID: %d (%s)\n" % (s.main_pid, comm(s.main_pid))
    elif s.exec_main["pid"] and s.exec_main["exit"]:
        o += "   Main PID: %d (%s)\n" % (s.exec_main["pid"], status_text(s.exec_main["code"], s.exec_main["status"]))
    mem = members(name)
    if mem:
        o += "      Tasks: %d\n     CGroup: /system.slice/%s\n" % (len(mem), name)
        for i, pid in enumerate(mem):
            o += "             %s%d %s\n" % ("\u2514\u2500" if i == len(mem) - 1 else "\u251c\u2500", pid, cmdline(pid))
    try:
        with open(os.path.join(RUN, name + ".journal")) as f:
            tail = f.read().splitlines()[-lines:] if lines else []
        if tail:
            o += "\n" + "\n".join(tail) + "\n"
    except OSError:
        pass
    out["out"] += o
    return 0 if act == "active" else 3


# --- cgroup view -----------------------------------------------------------------------------

_CG_LOCK = threading.Lock()


def refresh_cgroups():
    """Rewrite /sys/fs/cgroup from the markers (the tmpfs the runtime mounted)."""
    if not os.path.isdir(CGROOT):
        return
    with _CG_LOCK:
        groups = all_cgroups()
        with LOCK:
            for name, s in SVC.items():
                if s.active in ("active", "activating", "deactivating", "reloading"):
                    groups.setdefault("/system.slice/%s" % name, [])
        groups.setdefault("/init.scope", []).insert(0, 1)
        want = set()
        for cg, pids in groups.items():
            rel = cg.strip("/")
            d = os.path.join(CGROOT, rel) if rel else CGROOT
            want.add(d)
            os.makedirs(d, exist_ok=True)
            _write(os.path.join(d, "cgroup.procs"), "".join("%d\n" % p for p in sorted(pids)))
            _write(os.path.join(d, "cgroup.events"), "populated %d\nfrozen 0\n" % (1 if pids else 0))
        slice_dir = os.path.join(CGROOT, "system.slice")
        if os.path.isdir(slice_dir):
            for entry in os.listdir(slice_dir):
                p = os.path.join(slice_dir, entry)
                if os.path.isdir(p) and p not in want:
                    for f in os.listdir(p):
                        os.unlink(os.path.join(p, f))
                    os.rmdir(p)
        if CGROOT not in want:
            _write(os.path.join(CGROOT, "cgroup.procs"), "")
        _write(os.path.join(CGROOT, "cgroup.controllers"), "cpuset cpu io memory pids\n")


def _write(path, text):
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


# --- requests --------------------------------------------------------------------------

def handle(req):
    out = {"rc": 0, "out": "", "err": ""}
    verb = req.get("verb")
    names = [norm(n) for n in req.get("units", [])]
    flags = req.get("flags", [])
    rc = 0
    if verb in ("daemon-reload", "daemon-reexec"):
        with LOCK:
            UNITS.clear()
    elif verb == "reset-failed":
        for n in names or list(SVC):
            s = SVC.get(n)
            if s:
                # systemd 252 src/core/unit.c unit_reset_failed(): the start rate limit is reset in any state
                s.starts = []
            if s and s.active == "failed":
                s.result = "success"
                s.set("inactive", "dead")
    elif verb == "is-system-running":
        out["out"] = "stopping\n" if SHUTDOWN.is_set() else "running\n"
    elif verb == "kill":
        sig = req.get("signal") or "SIGTERM"
        sig = int(sig) if str(sig).isdigit() else getattr(signal, sig if sig.startswith("SIG") else "SIG" + sig)
        for n in names:
            s = svc(n)
            targets = [s.main_pid] if req.get("whom") == "main" else members(n)
            kill(targets, sig)
    elif verb == "show" and not names:
        out["out"] = show_text(manager_properties(), req.get("props"), flags)
    elif verb == "list-units":
        for n in sorted(SVC):
            s = SVC[n]
            if s.active != "inactive" or "--all" in flags:
                desc = s.unit.get("Description", "", "Unit") if s.unit else ""
                out["out"] += "%s loaded %s %s %s\n" % (n, s.active, s.sub, desc)
    else:
        for n in names:
            if verb == "start":
                rc = start(n, out) or rc
            elif verb == "stop":
                rc = stop(n, out) or rc
            elif verb in ("restart", "try-restart", "reload-or-restart", "force-reload", "condrestart"):
                if verb in ("try-restart", "condrestart") and svc(n).active != "active":
                    continue
                r = stop(n, out, "restart")
                if r == 5 and unit(n).load_state == "not-found":
                    out["err"] = out["err"].replace("Unit %s not loaded." % n, "Unit %s not found." % n)
                    rc = 5
                    continue
                rc = start(n, out) or rc
            elif verb == "reload":
                if svc(n).active != "active":
                    rc = job_failed(n, out, "the unit is not active") or rc
            elif verb == "enable":
                rc = enable(n, out) or rc
                if "--now" in flags and not rc:
                    rc = start(n, out) or rc
            elif verb == "disable":
                rc = disable(n, out) or rc
                if "--now" in flags and not rc:
                    rc = stop(n, out) or rc
            elif verb == "mask":
                link = "/etc/systemd/system/%s" % n
                if os.path.islink(link) and os.readlink(link) == "/dev/null":
                    continue
                if os.path.lexists(link):
                    out["err"] += "Failed to mask unit: File %s already exists.\n" % link
                    rc = 1
                    continue
                os.symlink("/dev/null", link)
                out["err"] += "Created symlink %s \u2192 /dev/null.\n" % link
            elif verb == "unmask":
                link = "/etc/systemd/system/%s" % n
                if os.path.islink(link) and os.readlink(link) == "/dev/null":
                    os.unlink(link)
                    out["err"] += "Removed \"%s\".\n" % link
            elif verb == "is-active":
                act = svc(n).active if n in SVC else "inactive"
                out["out"] += act + "\n"
                rc = rc or (0 if act == "active" else 3)
            elif verb == "is-failed":
                act = svc(n).active if n in SVC else "inactive"
                out["out"] += act + "\n"
                rc = rc or (0 if act == "failed" else 1)
            elif verb == "is-enabled":
                es = Unit(n).enabled_state()
                if es is None:
                    out["err"] += "Failed to get unit file state for %s: No such file or directory\n" % n
                    rc = 1
                    continue
                out["out"] += es + "\n"
                rc = rc or (0 if es in ("enabled", "static", "alias", "indirect", "enabled-runtime") else 1)
            elif verb == "status":
                rc = status(n, out, int(req.get("lines", 10))) or rc
            elif verb == "show":
                out["out"] += ("\n" if n != names[0] else "") + show_text(properties(n), req.get("props"), flags)
            elif verb == "cat":
                u = unit(n)
                if u.load_state == "not-found":
                    out["err"] += "No files found for %s.\n" % n
                    rc = 1
                    continue
                for f, _, _ in u.files:
                    with open(f) as fh:
                        out["out"] += "# %s\n%s\n" % (f, fh.read())
            else:
                out["err"] = "Unknown command verb %s.\n" % verb
                rc = 1
                break
    out["rc"] = rc
    try:
        refresh_cgroups()
    except OSError:
        pass
    return out


def serve_conn(conn):
    try:
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        req = json.loads(data.decode() or "{}")
        try:
            resp = handle(req)
        except Exception as e:  # noqa: BLE001
            resp = {"rc": 1, "out": "", "err": "kpro lab systemd: internal error: %r\n" % (e,)}
        conn.sendall(json.dumps(resp).encode() + b"\n")
    except (OSError, ValueError):
        pass
    finally:
        conn.close()


# --- boot / shutdown / main loop --------------------------------------------------------------

def boot():
    names = []
    for d in BOOT_DIRS:
        for target in ("multi-user.target.wants", "default.target.wants", "graphical.target.wants"):
            wd = os.path.join(d, target)
            if os.path.isdir(wd):
                names += sorted(n for n in os.listdir(wd) if n.endswith(".service"))
    for n in dict.fromkeys(names):
        u = unit(n)
        if u.load_state != "loaded" or not any(u.path.startswith(d + "/") for d in BOOT_DIRS):
            continue
        start(n, {"out": "", "err": ""})


def shutdown():
    for n in reversed(list(START_ORDER)):
        s = SVC.get(n)
        if s and (s.active not in ("inactive", "failed") or s.main_pid):
            try:
                stop(n, {"out": "", "err": ""})
            except Exception as e:  # noqa: BLE001
                journal("init", "shutdown: stopping %s: %s" % (n, e))
    rest = [int(d) for d in os.listdir("/proc") if d.isdigit() and d != "1" and alive(int(d))]
    kill(rest, signal.SIGTERM)
    _wait(lambda: not [p for p in rest if alive(p)], 3)
    kill([p for p in rest if alive(p)], signal.SIGKILL)
    os._exit(0)


def set_comm(name):
    try:
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def main():
    set_comm("systemd")
    os.makedirs("/run/systemd/system", exist_ok=True)
    os.makedirs(RUN, exist_ok=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    shutting = []

    def on_term(*a):
        if not shutting:
            shutting.append(1)
            SHUTDOWN.set()
            threading.Thread(target=shutdown, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGPWR, signal.SIGRTMIN + 3):
        signal.signal(sig, on_term)
    signal.signal(signal.SIGHUP, lambda *a: None)
    if os.path.exists(SOCK):
        os.unlink(SOCK)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    srv.bind(SOCK + ".tmp")
    os.umask(old)
    srv.listen(64)
    threading.Thread(target=boot, daemon=True).start()
    os.rename(SOCK + ".tmp", SOCK)  # the runtime waits for this path: the init is ready
    last = 0.0
    while True:
        try:
            ready, _, _ = select.select([srv, wake_r], [], [], 0.5)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        reap()
        if srv in ready:
            try:
                conn, _ = srv.accept()
                threading.Thread(target=serve_conn, args=(conn,), daemon=True).start()
            except OSError:
                pass
        if time.time() - last >= 0.5:
            last = time.time()
            try:
                refresh_cgroups()
            except OSError:
                pass


if __name__ == "__main__":
    main()
