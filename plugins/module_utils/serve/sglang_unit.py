# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SGLang server as a systemd unit: one options dict -> flags, the unit text, its fingerprint.

Pure functions, standard library only (they run on the target's Python 3.9+).

- :func:`render_flags` turns one dict of SGLang options (SGLang's own option names with
  underscores: ``model_path``, ``tp_size``, ``mem_fraction_static`` ...) into the argv of
  ``python -m sglang.launch_server``, in a fixed order. The API key never appears in it:
  it is in the ``--config`` file (mode 0600, :func:`secret_config`) the server reads at start.
  Control characters in values are refused (:class:`OptionError` naming the option or variable).
- :func:`render_unit` gives the unit text: ``Type=simple``, ``KillMode=control-group`` (stopping
  the unit ends the scheduler/detokenizer children too), ``Restart=on-failure`` with a bounded
  rate (:data:`RESTART_DEFAULTS`), and ``ExecStart`` wrapped by the launcher (:data:`LAUNCHER_SCRIPT`) that starts every
  launch in a fresh log file named after systemd's ``$INVOCATION_ID`` and headed by
  ``# kpro-launch-id: <id>`` (:func:`sglang_log.launch_header`), so a stale log can never be
  read as the current one.
- :func:`config_fingerprint` is what "restart only when changed" compares.
- :func:`unknown_options`, :func:`range_problems`, :func:`gpus_needed`, :func:`parse_proc_net_tcp`,
  :func:`port_taken` are the checks made before the running server is touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_multinode as multinode
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_options
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_log import LAUNCH_HEADER

LAUNCHER_PATH = "/usr/local/lib/kpro-gpu-serving/sglang-launch"
LOG_DIR = "/var/log/sglang"
ENV_FILE_DIR = "/etc/kpro-gpu-serving"
# systemd.exec(5) "Environment=": no $ expansion, specifiers (%) are expanded; systemd.syntax(7) quoting.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
RESTART_DEFAULTS = {"restart": "on-failure", "restart_sec": 30, "start_limit_interval_sec": 3600, "start_limit_burst": 3}

# The order of the well-known options in ExecStart (the option table's); every other option follows sorted by name,
# then ``extra`` verbatim.
FLAG_ORDER = sglang_options.FLAG_ORDER
# Options that are not SGLang flags.
NOT_FLAGS = sglang_options.NOT_FLAGS

_OPTION_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")

# The launcher the role installs at LAUNCHER_PATH. POSIX sh; arguments: <log_dir> <name> <command...>.
# @LAUNCH_HEADER@ is sglang_log.LAUNCH_HEADER, the one definition of the header.
_LAUNCHER_TEMPLATE = r"""#!/bin/sh
# kpro.gpu_serving: start one launch of a server with its own, launch-identified log.
#   sglang-launch <log_dir> <name> <command> [args...]
# The log is <log_dir>/<name>-<launch id>.log, headed by "@LAUNCH_HEADER@ <launch id>";
# <log_dir>/<name>.log points at the newest. The launch id is systemd's $INVOCATION_ID
# (new for every start of the unit), or a timestamp + PID when run outside systemd.
# Older logs beyond $KPRO_SGLANG_KEEP_LOGS (default 10) are removed.
set -eu
if [ "$#" -lt 3 ]; then
    echo "usage: sglang-launch <log_dir> <name> <command> [args...]" >&2
    exit 64
fi
log_dir=$1
name=$2
shift 2
id=${INVOCATION_ID:-}
if [ -z "$id" ]; then
    id=$(date -u +%Y%m%dT%H%M%SZ)-$$
fi
mkdir -p "$log_dir"
log=$log_dir/$name-$id.log
umask 027
printf '@LAUNCH_HEADER@ %s\n' "$id" > "$log"
ln -sfn "$name-$id.log" "$log_dir/.$name.log.new"
mv -f "$log_dir/.$name.log.new" "$log_dir/$name.log"
keep=${KPRO_SGLANG_KEEP_LOGS:-10}
ls -1t "$log_dir/$name"-*.log 2>/dev/null | tail -n +$((keep + 1)) | while IFS= read -r old; do
    [ "$old" = "$log" ] || rm -f "$old"
done
# The server's output reaches the log through sed, which masks secrets (the server_args=ServerArgs(... api_key='...')
# line of sglang/srt/entrypoints/engine.py:188, from 0.5.19 server_args={... 'api_key': '...'} (engine.py:1098, a dict
# that prints the key too), Bearer tokens, --api-key values). sed runs detached (not a child of
# the server, whose kill_process_tree would end it before its last lines) and ignores SIGTERM, so it writes until the
# server's last process closes the FIFO; it stays in the unit's cgroup. The server is exec'd: MainPID stays the server.
fifo=$log_dir/.$name-$id.fifo
rm -f "$fifo"
mkfifo -m 600 "$fifo"
( ( trap '' TERM INT HUP; exec 0<"$fifo"; rm -f "$fifo"
    exec sed -u -e "s/\(api_key\(=\|': \)\)'[^']*'/\1'<redacted>'/g" -e 's/\(api_key\(=\|'"'"': \)\)"[^"]*"/\1"<redacted>"/g' \
        -e 's/\(Bearer \)[^ "'"'"',]*/\1<redacted>/g' -e 's/\(--api-key[ =]\)[^ ]*/\1<redacted>/g' >> "$log" ) & )
exec "$@" > "$fifo" 2>&1
"""
LAUNCHER_SCRIPT = _LAUNCHER_TEMPLATE.replace("@LAUNCH_HEADER@", LAUNCH_HEADER)


class OptionError(ValueError):
    """An options dict that cannot be rendered (the message names the key)."""


def _flag(name, version=None):
    return sglang_options.flag(name, version)


def _value_words(name, value):
    if isinstance(value, bool):
        raise OptionError("option %s: a boolean renders as a bare flag" % name)
    if isinstance(value, (list, tuple)):
        return [_scalar(name, v) for v in value]
    if isinstance(value, dict):
        return [json.dumps(value, sort_keys=True, separators=(",", ":"))]
    return [_scalar(name, value)]


def _scalar(name, value):
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list, tuple)):
        raise OptionError("option %s: nested lists are not SGLang values" % name)
    return str(value)


def _ordered_names(options):
    names = [k for k in FLAG_ORDER if k in options]
    names += sorted(k for k in options if k not in FLAG_ORDER and k not in NOT_FLAGS)
    return names


def render_flags(options, version=None):
    """One dict of SGLang options -> the argv after ``-m sglang.launch_server`` of SGLang ``version`` (None: 0.5.11;
    an option whose flag a release renamed gets that release's flag, sglang_options.RENAMED).

    Keys are SGLang option names with underscores. ``None`` and ``False`` are omitted,
    ``True`` is a bare flag, a list gives one flag followed by its values (``nargs='+'``),
    a dict is passed as compact JSON (``json_model_override_args``). ``api_key`` is refused (it goes
    through :func:`secret_config`). ``extra`` (a list of
    strings) is appended verbatim. The order is fixed (:data:`FLAG_ORDER`, then by name).
    """
    options = dict(options or {})
    argv = []
    for name in _ordered_names(options):
        if not _OPTION_NAME_RE.match(name):
            raise OptionError("option %r is not an SGLang option name (lower case with underscores, e.g. tp_size)" % name)
        value = options[name]
        if value is None or value is False:
            continue
        if name == "api_key":
            raise OptionError("option api_key: the key goes to the server through --config <secret file> (secret_config)")
        if value is True:
            argv.append(_flag(name, version))
            continue
        words = _value_words(name, value)
        if not words:
            continue
        argv += [_flag(name, version)] + [_no_control("option %s" % name, w) for w in words]
    extra = options.get("extra")
    if extra:
        if isinstance(extra, str):
            raise OptionError("option extra: give a list of arguments, not one string")
        argv += [_no_control("option extra", str(x)) for x in extra]
    return argv


def _no_control(what, text):
    """Refuse control characters (a newline would end the unit's line: systemd.syntax(7) has no escape for it in
    an unquoted word, and SGLang has no use for one)."""
    m = _CONTROL_RE.search(text)
    if m:
        raise OptionError("%s: the value contains the control character %r; newlines and other control characters are "
                          "refused (they would inject lines into the unit file). Remove it." % (what, m.group(0)))
    return text


def secret_config(api_key):
    """The YAML text of the server's ``--config`` file holding the API key (mode 0600, root only).

    SGLang has no environment variable for the key; 0.5.11 reads ``--config <file.yaml>`` at start
    (sglang/srt/server_args.py:7280 prepare_server_args -> server_args_config_parser.py ConfigArgumentMerger),
    so the key is in neither the unit nor the process's argv. A JSON string is a YAML double-quoted scalar."""
    if api_key in (None, False, ""):
        return None
    return "# Managed by kpro.gpu_serving (sglang_service). Mode 0600: holds the API key.\napi_key: %s\n" % json.dumps(str(api_key))


def api_key_from_config(text):
    """The API key in a ``--config`` file's text as :func:`secret_config` writes it (a YAML ``api_key:`` line, its value a
    JSON string or a plain scalar); None without one. The gate reads it there so that the key is never a task argument
    (a background task's arguments stay in a file on the target for the whole run)."""
    for line in (text or "").splitlines():
        if line.startswith("api_key:"):
            value = line.split(":", 1)[1].strip()
            if value.startswith('"'):
                return json.loads(value)
            return value.strip("'") or None
    return None


def _env_value(value, name="environment"):
    value = _no_control("environment variable %s" % name, str(value))
    return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')


def render_env(env):
    """EnvironmentFile text: ``KEY="value"`` lines, sorted."""
    lines = ["# Managed by kpro.gpu_serving (sglang_service). Mode 0600: holds secrets."]
    for k in sorted(env or {}):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise OptionError("environment variable name %r is not valid" % k)
        lines.append("%s=%s" % (k, _env_value(env[k], k)))
    return "\n".join(lines) + "\n"


_SAFE_WORD_RE = re.compile(r"^[A-Za-z0-9_@%+=:,./${}-]+$")


def systemd_quote(word, expand=False):
    """Quote one ExecStart word for systemd: ``%`` -> ``%%``, ``$`` -> ``$$`` unless ``expand``,
    double quotes around words with spaces or quotes."""
    text = str(word).replace("%", "%%")
    if not expand:
        text = text.replace("$", "$$")
    if text and _SAFE_WORD_RE.match(text):
        return text
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def environment_assignment(name, value):
    """One ``Environment=`` value: ``%`` -> ``%%`` (specifiers are expanded there), ``$`` kept (no variable
    expansion in Environment=, systemd.exec(5)), double quotes with C escapes when needed (systemd.syntax(7));
    control characters refused, naming the variable."""
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(name)):
        raise OptionError("environment variable name %r is not valid" % name)
    text = "%s=%s" % (name, _no_control("environment variable %s" % name, str(value)))
    text = text.replace("%", "%%")
    if _SAFE_WORD_RE.match(text) and "{" not in text:
        return text
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def exec_start(venv, options, name, launcher=LAUNCHER_PATH, log_dir=LOG_DIR, python=None, secret_file=None, sglang_version=None):
    """The ExecStart argv (words) and its systemd-quoted line (``--config <secret_file>`` carries the API key); the flags
    are the installed ``sglang_version``'s."""
    py = python or ("%s/bin/python" % venv.rstrip("/"))
    words = [launcher, log_dir, name, py, "-m", "sglang.launch_server"] + render_flags(options, sglang_version)
    if secret_file:
        words += ["--config", secret_file]
    for w in words:
        _no_control("ExecStart word", w)
    # a lone ";" separates commands in ExecStart (systemd.service(5)); "\;" is the literal
    line = " ".join("\\;" if w == ";" else systemd_quote(w) for w in words)
    return words, line


def unit_stem(unit):
    """``sglang.service`` -> ``sglang`` (the log file names)."""
    return unit[:-len(".service")] if unit.endswith(".service") else unit


def render_unit(unit, venv, options, **kw):
    """The unit file text (deterministic for the same arguments); see :func:`render_service`."""
    return render_service(unit, venv, options, **kw)[0]


def render_service(unit, venv, options, env_file=None, launcher=LAUNCHER_PATH, log_dir=LOG_DIR, environment=None,
                   timeout_stop_sec=120, user=None, group=None, working_directory=None, description=None, after=None,
                   python=None, limit_nofile=65536, secret_file=None, restart=None, sglang_version=None):
    """(unit file text, its ExecStart line): the one place ExecStart is built (:func:`exec_start`).

    Deterministic for the same arguments. ``restart``: dict of :data:`RESTART_DEFAULTS` keys."""
    stem = unit_stem(unit)
    rs = dict(RESTART_DEFAULTS, **(restart or {}))
    line = exec_start(venv, options, stem, launcher=launcher, log_dir=log_dir, python=python, secret_file=secret_file,
                      sglang_version=sglang_version)[1]
    model = (options or {}).get("served_model_name") or (options or {}).get("model_path") or "model"
    out = [
        "# Managed by kpro.gpu_serving (sglang_service); changes here are overwritten.",
        "# Every start logs to %s/%s-<InvocationID>.log (first line: %s <InvocationID>);" % (log_dir, stem, LAUNCH_HEADER),
        "# %s/%s.log points at the newest." % (log_dir, stem),
        "[Unit]",
        "Description=%s" % _no_control("description", description or "SGLang server (%s)" % model).replace("%", "%%"),
        "After=%s" % " ".join(after or ["network-online.target"]),
        "Wants=network-online.target",
        # a crashed server comes back, at most start_limit_burst starts per interval (systemd.unit(5))
        "StartLimitIntervalSec=%d" % int(rs["start_limit_interval_sec"]),
        "StartLimitBurst=%d" % int(rs["start_limit_burst"]),
        "",
        "[Service]",
        "Type=simple",
    ]
    if user:
        out.append("User=%s" % user)
    if group:
        out.append("Group=%s" % group)
    if working_directory:
        out.append("WorkingDirectory=%s" % working_directory)
    if env_file:
        out.append("EnvironmentFile=%s" % env_file)
    for k in sorted(environment or {}):
        out.append("Environment=%s" % environment_assignment(k, environment[k]))
    out += [
        "ExecStart=%s" % line,
        "KillMode=control-group",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=%s" % int(timeout_stop_sec),
        "Restart=%s" % rs["restart"],
        "RestartSec=%d" % int(rs["restart_sec"]),
    ]
    if limit_nofile:
        out.append("LimitNOFILE=%d" % int(limit_nofile))
    out += [
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(out) + "\n", line


def hard_nofile(limits_text):
    """The hard "Max open files" of a /proc/<pid>/limits text (None: unlimited or not found).

    systemd fails a unit at step LIMITS (exit 205) when LimitNOFILE= exceeds the hard limit
    it may raise to, as in an unprivileged container whose init got a lower one."""
    for line in (limits_text or "").splitlines():
        if line.startswith("Max open files"):
            parts = line[len("Max open files"):].split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def config_fingerprint(unit_text, env_text):
    """sha256 over the unit and the environment file: a different value means "restart"."""
    h = hashlib.sha256()
    for part in (unit_text or "", env_text or ""):
        data = part.encode("utf-8")
        h.update(b"%d:" % len(data))
        h.update(data)
    return h.hexdigest()


# The SGLang options the memory plan reads, by SGLang's own names: the option table's "sized" rows.
PLAN_OPTIONS = sglang_options.names(sglang_options.SIZED)


def plan_options(options):
    """The SGLang options the memory plan reads (:data:`PLAN_OPTIONS`), by SGLang's names; unset ones left out."""
    o = options or {}
    return dict((k, o[k]) for k in PLAN_OPTIONS if o.get(k) is not None and o.get(k) is not False)


# --------------------------------------------------------------------------------------------
# The unit at runtime: properties, its processes, exit status
# --------------------------------------------------------------------------------------------

UNIT_PROPERTIES = ("ActiveState", "SubState", "MainPID", "ExecMainStatus", "ExecMainCode", "InvocationID", "ControlGroup",
                   "NRestarts")
ALIVE_STATES = frozenset(["active", "activating", "reloading", "deactivating"])


def parse_show(text):
    """``systemctl show -p A,B`` output (``A=x`` lines) -> dict."""
    out = {}
    for line in (text or "").splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def systemctl_show(run_command, systemctl, unit, props=UNIT_PROPERTIES):
    """The unit's properties; {} when systemctl fails (the caller says what that means)."""
    rc, out, err = run_command([systemctl, "show", "-p", ",".join(props), unit])
    if rc != 0:
        return {"_error": (err or out or "").strip(), "_rc": rc}
    return parse_show(out)


def exit_status(props):
    """The main process's exit status from ExecMainStatus/ExecMainCode: a signal death as 128+N
    (SIGKILL = 137, what a failed SGLang startup ends with); None while it runs or when unknown."""
    if not props or props.get("ActiveState") in ALIVE_STATES:
        return None
    try:
        status = int(props.get("ExecMainStatus") or 0)
    except ValueError:
        return None
    code = (props.get("ExecMainCode") or "").strip()
    # ExecMainCode is the siginfo si_code: 1 CLD_EXITED, 2 CLD_KILLED, 3 CLD_DUMPED
    if code in ("2", "3", "killed", "dumped"):
        return 128 + status
    if status < 0:          # a supervisor that reports -N for a signal (Python's Popen)
        return 128 - status
    return status


def pid_alive(pid, proc_root="/proc"):
    """True when ``pid`` exists and is not a zombie."""
    if not pid:
        return False
    try:
        with open("%s/%d/stat" % (proc_root, int(pid))) as f:
            data = f.read()
        return data[data.rindex(")") + 2:].split()[0] not in ("Z", "X")
    except (IOError, OSError, ValueError, IndexError):
        return False


def descendants(pid, proc_root="/proc"):
    """PIDs below ``pid`` (recursive), from procfs."""
    kids = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, name, "stat")) as f:
                data = f.read()
            ppid = int(data[data.rindex(")") + 2:].split()[1])
        except (IOError, OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [int(pid)]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.append(c)
                todo.append(c)
    return sorted(out)


def cgroup_pids(control_group, cgroup_root="/sys/fs/cgroup"):
    """PIDs in a cgroup and its sub-cgroups (v2 unified, or v1's name=systemd hierarchy); None when
    the cgroup directory is not found."""
    if not control_group or not control_group.startswith("/"):
        return None
    for base in (cgroup_root, os.path.join(cgroup_root, "unified"), os.path.join(cgroup_root, "systemd")):
        top = os.path.join(base, control_group.lstrip("/"))
        if not os.path.isfile(os.path.join(top, "cgroup.procs")):
            continue
        pids = set()
        for dirpath, dummy_dirs, files in os.walk(top):
            if "cgroup.procs" not in files:
                continue
            try:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    pids.update(int(x) for x in f.read().split() if x.strip().isdigit())
            except (IOError, OSError):
                continue
        return sorted(pids)
    return None


def unit_pids(props, cgroup_root="/sys/fs/cgroup", proc_root="/proc"):
    """The unit's processes: its cgroup's members, else MainPID and its descendants.

    Returns (pids, source) with source ``cgroup`` or ``mainpid``.
    """
    pids = cgroup_pids(props.get("ControlGroup"), cgroup_root)
    if pids is not None:
        return [p for p in pids if pid_alive(p, proc_root)], "cgroup"
    try:
        main = int(props.get("MainPID") or 0)
    except ValueError:
        main = 0
    if main <= 0 or not pid_alive(main, proc_root):
        return [], "mainpid"
    return [main] + descendants(main, proc_root), "mainpid"


def launch_log_path(log_dir, unit, launch_id):
    return os.path.join(log_dir, "%s-%s.log" % (unit_stem(unit), launch_id))


def gpu_holders(facts, our_pids=(), proc_root="/proc"):
    """Every process NVML lists on a GPU: dict(gpu, pid, name, used_mib, ours, visible)."""
    ours = set(int(p) for p in our_pids or ())
    out = []
    for gpu in (facts or {}).get("gpus") or []:
        for p in gpu.get("processes") or []:
            pid = p.get("pid")
            out.append({"gpu": gpu.get("index"), "pid": pid, "name": p.get("name") or "?", "used_mib": p.get("used_mib"),
                        "ours": pid in ours, "visible": pid_alive(pid, proc_root) if pid else False,
                        "cmdline": (p.get("cmdline") or "")[:200]})
    return out


def used_mib(facts):
    """Per-GPU memory.used (MiB) in NVML index order, or None."""
    if not facts or not facts.get("available"):
        return None
    return [g.get("memory_used_mib") for g in facts.get("gpus") or []]


# --------------------------------------------------------------------------------------------
# Validation before the running server is touched
# --------------------------------------------------------------------------------------------

# Run as <venv>/bin/python -c FLAGS_PROBE <argv>: the installed SGLang's own option names (one JSON line), then its own
# parse of the argument vector without starting anything, as 0.5.11 prepare_server_args does (sglang/srt/server_args.py:
# 7276-7289: the parser "sglang serve", ServerArgs.add_cli_args, a --config file merged, parse_args); a refusal is
# argparse's "sglang serve: error: ..." on stderr and exit status 2.
FLAGS_PROBE = (
    "import argparse, json, sys\n"
    "from sglang.srt.server_args import ServerArgs\n"
    "p = argparse.ArgumentParser(prog='sglang serve')\n"
    "ServerArgs.add_cli_args(p)\n"
    "print(json.dumps(sorted(s for a in p._actions for s in a.option_strings if s.startswith('--'))), flush=True)\n"
    "argv = sys.argv[1:]\n"
    "if '--config' in argv:\n"
    "    from sglang.srt.server_args_config_parser import ConfigArgumentMerger\n"
    "    argv = ConfigArgumentMerger(p).merge_config_with_args(argv)\n"
    "p.parse_args(argv)\n"
)


def parse_error(rc, err):
    """argparse's refusal in the probe's stderr (its last ``error:`` line), else None (rc 0: parsed)."""
    if rc == 0:
        return None
    lines = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
    found = [ln for ln in lines if ": error: " in ln]
    return (found or lines or ["exit status %s" % rc])[-1][:500]


def unknown_options(options, flags, version=None):
    """Option keys whose flag (SGLang ``version``'s) the installed SGLang does not have: [(key, flag, close matches)]."""
    import difflib
    known = set(flags)
    out = []
    for key in sorted(options or {}):
        if key in NOT_FLAGS or (options[key] is None or options[key] is False):
            continue
        flag = _flag(key, version).split("=")[0]
        if flag not in known:
            close = difflib.get_close_matches(flag, sorted(known), n=3, cutoff=0.75)
            out.append((key, flag, [c[2:].replace("-", "_") for c in close]))
    return out


def range_problems(options, version=None):
    """[(key, message)] for values SGLang ``version`` would refuse or misread (the option table's types, ranges and
    choices, the multi-node rules), checked before the old server stops."""
    o = options or {}
    out = sglang_options.problems(o, version)
    if not out and float(o.get("pp_size") or 1) > 1 and o.get("speculative_algorithm"):
        # server_args.py:6786-6789 (check_server_args), an AssertionError before any GPU is touched
        msg = ("pp_size=%s with speculative_algorithm=%s: SGLang refuses it (\"Pipeline parallelism is not compatible with "
               "overlap schedule, speculative decoding\"); give pp_size 1 or no speculative decoding" % (o["pp_size"], o["speculative_algorithm"]))
        out.append(("pp_size", msg))
    return out + multinode.problems(o)


def gpus_needed(options):
    """GPUs one server needs on this node: tp_size x pp_size (x dp_size without dp-attention), from base_gpu_id;
    over several nodes (nnodes) each one's share (sglang_multinode.layout)."""
    o = options or {}
    try:
        n = multinode.layout(o)["gpus_per_node"]
    except (TypeError, ValueError):     # a bad nnodes is refused by range_problems
        n = int(o.get("tp_size") or 1) * int(o.get("pp_size") or 1)
    if not o.get("enable_dp_attention"):
        n *= int(o.get("dp_size") or 1)
    return n + int(o.get("base_gpu_id") or 0)


def parse_proc_net_tcp(text):
    """Listening sockets (state 0A) of a /proc/net/tcp or tcp6 text: [(port, inode)]."""
    out = []
    for line in (text or "").splitlines()[1:]:
        f = line.split()
        if len(f) < 10 or f[3] != "0A":
            continue
        try:
            out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[9])))
        except (ValueError, IndexError):
            continue
    return out


def socket_inodes(pids, proc_root="/proc"):
    """The socket inodes the given processes hold open (/proc/PID/fd -> socket:[inode])."""
    out = set()
    for pid in pids or ():
        d = "%s/%d/fd" % (proc_root, int(pid))
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            try:
                target = os.readlink(os.path.join(d, n))
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    return out


def port_taken(port, listeners, own_inodes):
    """True when some socket that is not one of ours listens on ``port``."""
    return any(p == int(port) and ino not in own_inodes for p, ino in listeners)


def nrestarts(props):
    """systemd's NRestarts (automatic restarts since the last manual start), or None."""
    try:
        return int((props or {}).get("NRestarts"))
    except (TypeError, ValueError):
        return None
