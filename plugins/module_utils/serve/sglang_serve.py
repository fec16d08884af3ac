# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve stage of one SGLang unit, in one direction (the work behind the sglang_service module).

    options --render()--> unit, environment, secret file (ExecStart built once, sglang_unit.render_service)
            --restart decision (sglang_restart.restart_reasons, on the fingerprint; lock_reasons, on the venv's lock)
            --checks before the running server is touched (sglang_restart.setting_problems, sglang_prestop: the model
              directory, host, environment, and the installed SGLang's own parse of the argument vector)
            --plan_launch()--> the memory plan, once (sglang_plan.plan), refused when it does not fit
            --launch: stop, wait until NVML shows the memory released, start, the launch id
    and the module's result carries the plan to the gate (sglang_gate's ``plan``).

The SGLang options keep SGLang's own names the whole way. Known failures raise
:class:`failure.Failure`; the module reports them once.
"""

from __future__ import annotations

import json
import os
import signal
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_options
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_prestop as sp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_restart as sr
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import toolchain
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write, read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.nvml import gpu_facts
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_log import read_launch_header
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_plan import load_json, plan as memory_plan

# How long a port held by a process that is not this unit's is looked at again before the launch is refused.
PORT_GRACE_S = 5.0


def write_atomic(path, text, mode, dir_mode=0o755):
    """Replace ``path`` with ``text``, its mode exactly ``mode`` (fileio.atomic_write, the collection's one writer),
    creating its directory first."""
    d = os.path.dirname(path)
    if not os.path.isdir(d):
        os.makedirs(d, dir_mode)
    atomic_write(path, text.encode("utf-8"), mode=MODE_DEFAULT, default_mode=mode, unique_tmp=True)


def model_weights_index(model_dir):
    """model.safetensors.index.json (dict), else the total size of the *.safetensors files (bytes)."""
    idx_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(idx_path):
        return load_json(idx_path)
    return sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir) if f.endswith(".safetensors"))


def unplanned_warnings(options):
    """What the memory plan does not account for: options without a row in the option table, and rows whose effect on
    memory it does not model (sglang_options.unplanned)."""
    unknown, unmodelled = sglang_options.unplanned(options)
    out = ["the memory plan does not know whether option(s) %s change GPU memory: no row in the option table "
           "(module_utils/serve/sglang_options.py)" % ", ".join(unknown)] if unknown else []
    return out + ["the memory plan does not model option %s: %s" % (k, sglang_options.ROWS[k].why) for k in unmodelled]


def plan_launch(options, model_dir, gpu_total_mib, baseline_mib=None, overrides=None, warn=None, environment=None, version=None):
    """The SGLang options -> the memory plan of this launch (sglang_plan.plan over the GPUs it will use; its remedies name
    SGLang ``version``'s flags), or None (with a warning) when the model's files are not there or the plan cannot be made."""
    warn = warn or (lambda msg: None)
    if not model_dir or not os.path.isdir(model_dir):
        warn("memory plan skipped: model directory %r not found (set model_dir)" % model_dir)
        return None
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        warn("memory plan skipped: %s not found" % cfg_path)
        return None
    tp = su.multinode.layout(options)["gpus_per_node"]     # this node's GPUs (tp_size x pp_size over nnodes nodes)
    base_gpu = int(options.get("base_gpu_id") or 0)
    sel = list(range(base_gpu, min(len(gpu_total_mib), base_gpu + tp))) or list(range(len(gpu_total_mib)))
    popts = su.plan_options(options)
    popts.update(overrides or {})
    try:
        res = memory_plan(load_json(cfg_path), model_weights_index(model_dir), popts, gpu_total_mib=[gpu_total_mib[i] for i in sel],
                          gpu_baseline_mib=[baseline_mib[i] for i in sel] if baseline_mib else None, environment=environment,
                          sglang_version=version)
    except (ValueError, KeyError, TypeError) as e:
        warn("memory plan failed: %s" % e)
        return None
    res.pop("model", None)
    for msg in unplanned_warnings(options):
        warn(msg)
        res["warnings"].append(msg)
    return res


def lock_reasons(stored, lock, stamp_mtime=None):
    """Why the running server must restart for its venv: sglang_install syncs the venv in place, so a new SGLang
    version or lock changes neither the unit nor the launcher, only the venv's stamp (``lock``, deployment.venv_lock).
    ``stored``: the running launch's state; one stored before the lock was (no ``lock_sha256``) restarts when the stamp
    was written after that launch started (``stamp_mtime``)."""
    if "lock_sha256" in stored:
        if stored["lock_sha256"] == lock:
            return []
        return ["the venv's lock changed since the running server was started (%s -> %s)" % ((stored["lock_sha256"] or "-")[:12], (lock or "-")[:12])]
    if stored.get("started") and stamp_mtime and stamp_mtime > stored["started"]:
        return ["the venv was synced with another lock (%s) after the running server was started" % (lock or "-")[:12]]
    return []


class Server(object):
    """One SGLang unit on this host: render, decide, check, plan, (re)start or stop. ``result`` is the module's result."""

    def __init__(self, module):
        self.m = module
        p = self.p = module.params
        self.unit = p["unit"] if "." in p["unit"] else p["unit"] + ".service"
        self.stem = su.unit_stem(self.unit)
        self.systemctl = p["systemctl"] or module.get_bin_path("systemctl", required=True)
        self.env_file = p["env_file"] or os.path.join(su.ENV_FILE_DIR, "%s.env" % self.stem)
        self.unit_path = self.rooted(os.path.join(p["unit_dir"], self.unit))
        self.env_path = self.rooted(self.env_file)
        self.secret_path = p["secret_file"] or os.path.join(su.ENV_FILE_DIR, "%s-secrets.yaml" % self.stem)  # the server reads it: not under root
        self.state_file = os.path.join(self.rooted(p["state_dir"]), "%s.json" % self.stem)
        self.link = os.path.join(p["log_dir"], "%s.log" % self.stem)
        self.opts = dict(p["options"] or {})
        self.result = {"changed": False, "restarted": False, "reasons": [], "files_changed": [], "gpu_processes": [],
                       "ended_pids": [], "unit_path": self.unit_path}

    # ---- the host -------------------------------------------------------------------
    def rooted(self, path):
        return os.path.join(self.p["root"], path.lstrip("/")) if self.p["root"] not in (None, "", "/") else path

    def run(self, args):
        """rc 127 and the OS's reason when the program cannot run (a venv without its python, say): Ansible's own
        handling would end the module with "Error executing command." and no stderr."""
        try:
            return self.m.run_command(args, handle_exceptions=False)
        except OSError as e:
            return 127, "", "%s: %s" % (args[0], e.strerror or e)

    def systemctl_do(self, verb, phase="not_started", remedy=None):
        rc, out, err = self.run([self.systemctl, verb, self.unit])
        if rc != 0:
            raise Failure(phase, "systemctl %s %s failed (rc=%s): %s" % (verb, self.unit, rc, (err or out).strip()),
                          remedy=remedy or "See systemctl status %s and journalctl -u %s." % (self.unit, self.unit))

    def show(self):
        props = su.systemctl_show(self.run, self.systemctl, self.unit)
        if "_error" in props:
            raise Failure("not_started", "systemctl show %s failed (rc=%s): %s" % (self.unit, props["_rc"], props["_error"]),
                          remedy="The module needs systemd in the container (systemctl); check that systemd runs as PID 1.")
        return props

    def nvml(self):
        facts = gpu_facts(run_command=self.m.run_command)
        if not facts.get("available"):
            self.result["nvml_reason"] = facts.get("reason")
            phase = "version_mismatch" if facts.get("reason") == "version_mismatch" else "not_started"
            raise Failure(phase, "NVML is not available: %s" % facts.get("msg"), evidence=[facts.get("msg", "")], remedy=facts.get("msg", ""))
        return facts

    def stored(self):
        try:
            with open(self.state_file) as f:
                return json.load(f)
        except (IOError, OSError, ValueError):
            return {}

    def stamp_mtime(self):
        try:
            return os.path.getmtime(os.path.join(self.rooted(self.p["venv"]), dp.LOCK_STAMP))
        except OSError:
            return None

    def holders(self, facts, props):
        ours, _source = su.unit_pids(props, self.p["cgroup_root"])
        return su.gpu_holders(facts, ours), ours

    # ---- options -> unit (once) -----------------------------------------------------
    def limit_nofile(self):
        nofile, hard = self.p["limit_nofile"], su.hard_nofile(read_text(self.rooted("/proc/1/limits")))
        if nofile and hard is not None and nofile > hard:
            self.m.warn("limit_nofile %d is above the hard limit of the container's init (%d): LimitNOFILE=%d is used "
                        "(raise the container's limit, e.g. lxc.prlimit.nofile, to get more)" % (nofile, hard, hard))
            return hard
        return nofile

    def environment(self):
        """The unit's environment: the runtime toolchain's and the compile caches' (toolchain.runtime_environment), then
        the inventory's over it."""
        env = toolchain.runtime_environment(self.p["venv"], self.p.get("compile_cache_dir"))
        env.update(self.p.get("environment") or {})
        return env

    def installed_version(self):
        """The venv's SGLang (its dist-info), else the gate's sglang_version (look), else None (0.5.11's flags)."""
        found = dp.venv_identity(self.rooted(self.p["venv"]))["sglang_version"]
        return found or (self.p.get("look") or {}).get("sglang_version") or None

    def render(self):
        p = self.p
        self.version = self.installed_version()     # the flags rendered and checked are this release's
        refusal = sr.probe_regex_refusal(p["probe_regex"]) or sr.options_refusal(self.opts, p["api_key"])
        if refusal:
            raise refusal
        self.secret_text = su.secret_config(p["api_key"] or None)
        self.result["secret_file"] = self.secret_path if self.secret_text else None  # where the gate reads the key
        try:
            self.unit_text, line = su.render_service(
                self.unit, p["venv"], self.opts, env_file=self.env_file, launcher=p["launcher"], log_dir=p["log_dir"],
                environment=self.environment(), timeout_stop_sec=p["timeout_stop_sec"], user=p["user"], python=p["python"],
                limit_nofile=self.limit_nofile(), secret_file=self.secret_path if self.secret_text else None,
                restart=dict((k, p[k]) for k in su.RESTART_DEFAULTS), sglang_version=self.version)
            self.env_text = su.render_env({})
        except su.OptionError as e:
            raise Failure("not_started", str(e), remedy=sr.REMEDY_OPTION)
        self.fingerprint = su.config_fingerprint(self.unit_text + su.LAUNCHER_SCRIPT, self.env_text + (self.secret_text or ""))
        self.lock = dp.venv_lock(self.rooted(p["venv"]))  # read once: the restart decision and the state of the launch
        self.result["exec_start"] = line

    # ---- checks before the running server is touched --------------------------------
    def known_flags(self):
        """(the installed SGLang's flags, its parser's refusal of this launch's arguments or None), one round trip; the
        flags are None (a warning) when the venv's Python cannot list them."""
        py = self.p["python"] or os.path.join(self.p["venv"], "bin", "python")
        rc, out, err = self.run([py, "-c", su.FLAGS_PROBE] + su.render_flags(self.opts, self.version))
        try:
            return json.loads(out.strip().splitlines()[0]), su.parse_error(rc, err)
        except (ValueError, IndexError):
            err = err or out
        self.m.warn("option names not checked: %s -c could not list the installed SGLang's flags: %s" % (py, (err or "").strip()[-300:]))
        return None, None

    def prestop_problems(self, parse_error):
        """The model directory, the listening address, the environment and SGLang's parse (sglang_prestop)."""
        p = self.p
        unit_env = toolchain.runtime_environment(p["venv"], p.get("compile_cache_dir"))
        return (sp.model_dir_problems(p["model_dir"], self.opts.get("model_path")) + sp.host_problems(self.opts.get("host"))
                + sp.environment_problems(p["environment"], unit_env, p["venv"], su.gpus_needed(self.opts)) + sp.argv_problems(parse_error))

    def port_busy(self, port, our_pids):
        """Whether a socket that is not ours listens on ``port``, looked at again for PORT_GRACE_S: a server that has
        just ended (rank 0 after losing its peer, say) can hold its port a moment after its unit stopped listing it."""
        deadline = time.time() + PORT_GRACE_S
        while True:
            listeners = []
            for name in ("tcp", "tcp6"):
                listeners += su.parse_proc_net_tcp(read_text("/proc/net/%s" % name))
            busy = su.port_taken(port, listeners, su.socket_inodes(our_pids))
            if not busy or time.time() >= deadline:
                return busy
            time.sleep(0.25)

    def check(self, facts, holders, ours):
        """All problems in one failure, before the old server is stopped; then the foreign GPU holders."""
        flags, parse_error = self.known_flags()
        problems, phase = sr.setting_problems(self.opts, flags, len(facts["gpus"]), lambda port: self.port_busy(port, ours),
                                              self.prestop_problems(parse_error), self.version)
        refusal = sr.settings_refusal(problems, phase)
        if refusal:
            raise refusal
        foreign = sr.foreign_holders(holders)
        if foreign:
            raise sr.held_refusal(foreign, su.used_mib(facts), "a process that is not this unit's holds GPU memory")

    def plan(self, facts, baseline):
        """The memory plan, once (None with plan=false or without the model's files); refused when it does not fit."""
        if not self.p["plan"]:
            return None
        res = plan_launch(self.opts, self.p["model_dir"] or self.opts.get("model_path"), [g.get("memory_total_mib") for g in facts["gpus"]],
                          baseline, self.p["plan_overrides"], self.m.warn, self.p["environment"], self.version)
        if res is not None:
            self.result["plan"] = res
            refusal = sr.plan_refusal(res)
            if refusal:
                raise refusal
        return res

    # ---- stop and release -----------------------------------------------------------
    def stop(self, props, our_pids):
        """Stop the unit (control-group kill) and end survivors of its cgroup by PID: the PIDs ended."""
        ended = list(our_pids)
        if props.get("ActiveState") in su.ALIVE_STATES or our_pids:
            self.systemctl_do("stop", "gpu_memory_held", "Stop the unit by hand (systemctl stop %s) and re-run." % self.unit)
            left, src = su.unit_pids(self.show(), self.p["cgroup_root"])
            for pid in left:
                if pid in our_pids or src == "cgroup":
                    try:
                        os.kill(pid, signal.SIGKILL)
                        ended.append(pid)
                    except OSError:
                        pass
        self.result["ended_pids"] = sorted(set(ended))
        return set(ended)

    def stop_and_release(self, props, our_pids):
        """Stop, then poll NVML until the memory is released (bounded by release_timeout): the last GPU facts."""
        t0 = time.time()
        ours = self.stop(props, our_pids)
        deadline = t0 + self.p["release_timeout"]
        while True:
            facts = self.nvml()
            procs = su.gpu_holders(facts)
            over = sr.busy_gpus(facts["gpus"], self.p["idle_used_mib"])
            foreign = sr.foreign_holders(procs, ours)
            if foreign:
                raise sr.held_refusal(foreign, su.used_mib(facts), "a process that is not this unit's holds GPU memory")
            if not procs and not over:
                self.result["released_after_s"] = round(time.time() - t0, 2)
                return facts
            if time.time() >= deadline:
                if procs:
                    raise sr.held_refusal(procs, su.used_mib(facts), "GPU memory still held %ss after this unit was stopped"
                                          % self.p["release_timeout"], ours)
                raise sr.unreleased_refusal(over, self.p["release_timeout"])
            time.sleep(0.25)

    # ---- files ----------------------------------------------------------------------
    def changed_files(self):
        launcher = self.p["launcher"]
        wanted = [(self.unit_path, self.unit_text), (self.env_path, self.env_text), (self.secret_path, self.secret_text)]
        changed = [path for path, text in wanted if read_text(path) != text]
        if read_text(launcher) != su.LAUNCHER_SCRIPT or (os.path.exists(launcher) and not os.access(launcher, os.X_OK)):
            changed.append(launcher)
        if self.unit_path in changed:
            before = read_text(self.unit_path)
            self.result["diff"] = {"before": before or "", "after": self.unit_text, "before_header": self.unit_path,
                                   "after_header": self.unit_path}
        self.result["files_changed"] = changed
        return changed

    def write_files(self):
        changed = self.changed_files()
        if self.m.check_mode or not changed:
            return changed
        if self.env_path in changed:
            write_atomic(self.env_path, self.env_text, 0o600, dir_mode=0o700)
        if self.secret_path in changed:
            if self.secret_text is None:
                os.unlink(self.secret_path)
            else:
                write_atomic(self.secret_path, self.secret_text, 0o600, dir_mode=0o700)
        if self.p["launcher"] in changed:
            write_atomic(self.p["launcher"], su.LAUNCHER_SCRIPT, 0o755)
        if self.unit_path in changed:
            write_atomic(self.unit_path, self.unit_text, 0o644)
            rc, out, err = self.run([self.systemctl, "daemon-reload"])
            if rc != 0:
                raise Failure("not_started", "systemctl daemon-reload failed: %s" % (err or out).strip(),
                              remedy="See journalctl -b for systemd's reason, fix it and re-run.")
        return changed

    def save_state(self, launch_id, plan, baseline):
        data = {"fingerprint": self.fingerprint, "lock_sha256": self.lock, "launch_id": launch_id, "baseline_mib": baseline, "started": time.time(),
                "plan": sr.stored_plan(plan)}
        write_atomic(self.state_file, json.dumps(data, sort_keys=True) + "\n", 0o600)

    # ---- launch ---------------------------------------------------------------------
    def launch_id_after_start(self, props, old_target, timeout=15.0):
        lid = props.get("InvocationID")
        if lid:
            return lid
        # no InvocationID (an old systemd, or a systemctl stand-in): the launcher made an id itself; read its header
        deadline = time.time() + timeout
        while time.time() < deadline:
            target = os.path.realpath(self.link) if os.path.lexists(self.link) else None
            if target and target != old_target:
                lid = read_launch_header(target)
                if lid:
                    return lid
            time.sleep(0.05)
        return None

    def launch(self, props, ours, plan):
        """Stop the running server, wait for its memory, start the unit; the new launch's id and log in the result."""
        old_target = os.path.realpath(self.link) if os.path.lexists(self.link) else None
        facts = self.stop_and_release(props, ours)
        self.result["gpu_used_mib"] = su.used_mib(facts)
        # a start of ours must not count against StartLimitBurst= (systemd 252 src/core/unit.c unit_reset_failed()
        # resets the start rate limit); a failed state from an earlier launch is cleared with it
        self.run([self.systemctl, "reset-failed", self.unit])
        self.result["compile_cache_files"] = toolchain.count_files(self.p.get("compile_cache_dir"))  # the gate compares at ready
        self.systemctl_do("start", remedy="See systemctl status %s and journalctl -u %s; check the ExecStart (venv, launcher)."
                          % (self.unit, self.unit))
        lid = self.launch_id_after_start(self.show(), old_target)
        if not lid:
            raise Failure("not_started", "the unit %s started but no launch id was found (no InvocationID, no new log under %s)"
                          % (self.unit, self.p["log_dir"]), remedy="Check the launcher %s and the log directory." % self.p["launcher"])
        self.result["launch_id"] = lid
        self.result["log_path"] = su.launch_log_path(self.p["log_dir"], self.unit, lid)
        self.save_state(lid, plan, su.used_mib(facts))

    # ---- states ---------------------------------------------------------------------
    def keep(self, props, stored):
        """Nothing asks for a restart: converge the files, report the running launch and its stored plan."""
        self.result["changed"] = bool(self.write_files())
        lid = props.get("InvocationID") or stored.get("launch_id")
        self.result["launch_id"] = lid
        self.result["log_path"] = su.launch_log_path(self.p["log_dir"], self.unit, lid) if lid else None
        if stored.get("plan"):
            self.result["plan"] = stored["plan"]

    def started(self):
        self.render()
        props = self.show()
        facts = self.nvml()
        holders, ours = self.holders(facts, props)
        stored = self.stored()
        reasons = sr.restart_reasons(props, stored.get("fingerprint"), self.fingerprint, self.p["force_restart"])
        if props.get("ActiveState") in sr.RUNNING_STATES:
            reasons += lock_reasons(stored, self.lock, self.stamp_mtime())
        self.result.update(gpu_processes=holders, gpu_used_mib=su.used_mib(facts), reasons=reasons, nrestarts=su.nrestarts(props))
        if not reasons:
            return self.keep(props, stored)
        # a (re)start is needed: refuse early, before touching the running server
        self.check(facts, holders, ours)
        baseline = sr.launch_baseline(holders, ours, su.used_mib(facts), stored.get("baseline_mib"), self.p["idle_used_mib"])
        plan = self.plan(facts, baseline)
        self.write_files()
        self.result.update(changed=True, restarted=True)
        if not self.m.check_mode:
            self.launch(props, ours, plan)
            self.enable()
        return None

    def enable(self):
        want = self.p["enabled"]
        if want is None:
            return
        rc, out, _err = self.run([self.systemctl, "is-enabled", self.unit])
        if (rc == 0 and out.strip() == "enabled") != want:
            self.result["changed"] = True
            if not self.m.check_mode:
                self.run([self.systemctl, "enable" if want else "disable", self.unit])

    def stopped(self):
        props = self.show()
        facts = self.nvml()
        holders, ours = self.holders(facts, props)
        self.result["gpu_processes"] = holders
        if props.get("ActiveState") in su.ALIVE_STATES or ours:
            self.result["changed"] = True
            if not self.m.check_mode:
                facts = self.stop_and_release(props, ours)
        self.result["gpu_used_mib"] = su.used_mib(facts)
        self.enable()
