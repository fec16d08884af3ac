# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps of kpro.gpu_serving.lxc_gpu_passthrough: inputs, devices, the plan for the CT config, the write
(file, pct or API) under PVE's lock, and the restart or start. ``module`` is the AnsibleModule; a known failure
is an LxcConfigError or ProxmoxApiError (both Failure, failure.py).
"""

from __future__ import annotations

import ast
import os
import re
import shutil

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import ct_mounts as cm
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import lxc_config as lc
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.device_nodes import made_at_boot
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa


def owned_state(conf):
    main = conf.main
    devn = dict(("dev%d" % n, ln.value) for n, ln, _parsed in sorted(lc.owned_dev_lines(main), key=lambda t: t[0]))
    return devn


def owned_raw(conf, devices, proc_devices):
    majors = set([lc.NVIDIA_MAJOR])
    majors.update(m for n, m in proc_devices.items() if n.startswith("nvidia"))
    majors.update(d["major"] for d in devices if d.get("major") is not None)
    lines = lc.owned_allow_lines(conf.main, majors, lc.char_majors(proc_devices)) + lc.owned_mount_lines(conf.main)
    return [ln.raw.rstrip("\n") for ln in conf.main.lines if any(ln is o for o in lines)]


def unflatten_devices(items):
    """``devices=['/dev/a','/dev/b']`` in an ad hoc ``key=value`` string arrives split on commas; put it back together."""
    if items and all(isinstance(i, str) for i in items):
        joined = ",".join(items).strip()
        if joined.startswith("[") and joined.endswith("]"):
            try:
                value = ast.literal_eval(joined)
            except (ValueError, SyntaxError):
                raise lc.LxcConfigError("devices: cannot read %s as a list of paths" % joined, phase="bad_input")
            if isinstance(value, (list, tuple)):
                return list(value)
        return [i.strip().strip("'\"") for i in items]
    return items


def choose_writer(p, pve_dir):
    """Who makes devN changes: pct on the node, the API without pct, else the file (raw lines always go there)."""
    writer = p["writer"]
    if writer == "auto":
        if p["method"] == "devN" and pve_dir and shutil.which("pct"):
            writer = "pct"
        elif p["method"] == "devN" and pve_dir and has_api_connection(p):
            writer = "api"
        else:
            writer = "file"
    return writer


def api_check(module, p, vmid, writer):
    """Whether this run may use the API (writer=api, restart, ensure_running); refuses what cannot work."""
    if writer == "pct" and not module.get_bin_path("pct"):
        raise lc.LxcConfigError("writer=pct but there is no pct command here: run on the PVE node, or use writer=file/api")
    if not (writer == "api" or p["restart"] or p["ensure_running"]):
        return False
    if not has_api_connection(p):
        raise lc.LxcConfigError(
            "%s needs a PVE API connection: set api_host with api_token_id/api_token_secret or api_password, "
            "or api_backend=local on the node"
            % ("writer=api" if writer == "api" else "restart=true" if p["restart"] else "ensure_running=true"))
    # proxmoxer (and requests/paramiko) must be importable here; the message names the apt packages
    problem = pa.proxmoxer_problem(p["api_backend"], token=bool(p.get("api_token_id")))
    if problem:
        raise pa.ProxmoxApiError(problem, phase="library_missing")
    return True


def node_drift(p, devices, status):
    """Passed nodes whose major:minor in the running CT differs from the host's (read through /proc/<init>/root)."""
    if not status or status.get("status") != "running" or not status.get("pid"):
        return []
    return lc.node_drift(devices, os.path.join(p["proc_root"], "proc", str(int(status["pid"])), "root"))


def plan_kwargs(p):
    return dict(dev_gid=p["dev_gid"], dev_uid=p["dev_uid"], dev_mode=p["dev_mode"],
                remove_other_method=p["remove_other_method"])


def has_api_connection(p):
    return p["api_backend"] == "local" or bool(p.get("api_host"))


def pct_set(module, vmid, devn_set, devn_delete):
    cmd = [module.get_bin_path("pct", required=True), "set", str(vmid)]
    for key in sorted(devn_set):
        cmd += ["--" + key, devn_set[key]]
    if devn_delete:
        cmd += ["--delete", ",".join(devn_delete)]
    rc, out, err = module.run_command(cmd)
    if rc != 0:
        text = (err or out).strip()
        hint, phase = "", "ct_config_refused"
        if "does not exist" in text and "/dev/" in text:
            hint, phase = " Create the node on the host first (nvidia-modprobe; see kpro.gpu_serving.nvidia_driver).", "device_missing"
        elif "locked" in text:
            hint, phase = " The CT is locked by another operation; wait for it, or `pct unlock %s` if the lock is stale." % vmid, "ct_locked"
        raise lc.LxcConfigError("`%s` failed (rc=%d): %s.%s" % (" ".join(cmd), rc, text, hint), phase=phase, evidence=[text])


def check_inputs(p):
    """dev_mode and gpus as PVE takes them; returns the GPU indices or 'all'."""
    if p["dev_mode"] is not None and not re.match(r"^0[0-7]{3}$", p["dev_mode"]):
        raise lc.LxcConfigError("dev_mode %r is not an octal mode like 0666 (PVE's pattern 0[0-7]{3})" % p["dev_mode"], phase="bad_input")
    gpus = p["gpus"]
    if gpus and [g for g in gpus if str(g).lower() != "all"]:
        try:
            return [int(g) for g in gpus]
        except ValueError:
            raise lc.LxcConfigError("gpus must be GPU indices (0, 1, ...) or 'all', got %s" % gpus, phase="bad_input")
    return "all"


def find_devices(p, gpus, pve_dir, warnings):
    """(devices to pass, /proc/devices majors)."""
    try:
        proc_devices = lc.read_proc_devices(p["proc_root"])
    except lc.LxcConfigError as e:
        if p["method"] == "lxc_raw":
            raise
        warnings.append("%s; devN does not need majors, stale raw lines are matched on 195 only" % e)
        proc_devices = {}
    if p["devices"]:
        p["devices"] = unflatten_devices(p["devices"])
        require = p["require_nodes"]
        if require is None:
            require = pve_dir or p["dev_root"] not in ("/", "")
        return lc.normalize_devices(p["devices"], p["dev_root"], require, proc_devices), proc_devices
    devices = lc.discover_devices(p["dev_root"], gpus)
    for d in devices:
        if d["path"].startswith("/dev/nvidia-uvm") and proc_devices and "nvidia-uvm" not in proc_devices:
            raise lc.LxcConfigError("%s exists but nvidia-uvm is not in /proc/devices: load it (`modprobe nvidia-uvm`, "
                                    "`nvidia-modprobe -u -c=0`)" % d["path"], phase="device_missing")
    return devices, proc_devices


def run(module, p, vmid, result, warnings):
    """The whole run: plan the config, then write it and restart or start the CT as asked."""
    ctx = prepare(module, p, vmid, result, warnings)
    new, devn_set, devn_delete, pw = ctx["compute"](ctx["conf"])
    warnings.extend(pw)
    warnings.extend(boot_warnings(p, vmid, ctx["conf"], ctx["devices"], devn_set, devn_delete))
    before, after = ctx["conf"].render(), new.render()
    changed = bool(devn_set or devn_delete or after != before)
    refuse_token_devn(p, ctx["writer"], devn_set or devn_delete)
    # credentials, CA and vmid are proven by an authenticated read before anything is written
    session, node, status = pa.check_access(p, vmid) if ctx["needs_api"] else (None, None, None)
    result.update(changed=changed, devn_set=devn_set, devn_delete=devn_delete, devn=owned_state(new),
                  lxc_lines=owned_raw(new, ctx["devices"], ctx["proc_devices"]))
    if module._diff:
        result["diff"] = dict(before=before, after=after, before_header=result["config_file"], after_header=result["config_file"])
    drift = [] if changed else node_drift(p, ctx["devices"], status)
    restart_for = restart_reason(vmid, changed, drift, result)
    if not restart_for:
        report_lock(p, vmid, ctx["conf"], result, warnings)  # read-only: a lock is reported, not an error
    elif changed or p["restart"]:
        check_lock(ctx["conf"], vmid)  # a write or a restart: a locked CT is an error, nothing was written
    made = host_dir(module, ctx, result)  # before the restart: PVE refuses to start without it
    if module.check_mode or not restart_for:
        result["restart_required"] = bool(restart_for)
        result["changed"] = changed or made or bool(drift and p["restart"])
        ensure_running(module, p, vmid, result, session, node)
        return
    if changed:
        session, node = apply(module, p, vmid, result, ctx, session, node)
    restart(module, p, vmid, result, warnings, session, node, restart_for)


def prepare(module, p, vmid, result, warnings):
    """Inputs, the current config, the writer and the devices; ``compute(conf)`` plans the edits of a config."""
    result["config_file"] = lc.config_path(p["config_dir"], vmid)
    pve_dir = lc.is_pve_config_dir(p["config_dir"])
    gpus = check_inputs(p)
    mount = cm.check(p.get("bind_mount"))  # refused before anything is read or written
    raw = lc.read_config(p["config_dir"], vmid)
    writer = choose_writer(p, pve_dir)
    result["writer"] = writer
    needs_api = api_check(module, p, vmid, writer)
    devices, proc_devices = find_devices(p, gpus, pve_dir, warnings)
    result["devices"] = devices
    result["left_out"] = [] if p["devices"] else lc.caps_left_out(p["dev_root"])
    result["majors"] = dict((n, m) for n, m in proc_devices.items() if n.startswith("nvidia"))
    return dict(raw=raw, conf=lc.ConfigFile.parse(raw), writer=writer, needs_api=needs_api, devices=devices,
                proc_devices=proc_devices, compute=planner(p, writer, devices, proc_devices), mount=mount)


def planner(p, writer, devices, proc_devices):
    """compute(conf) -> (new conf, devn_set, devn_delete, plan warnings) for this writer. The bind mount (mpN) is
    always an edit of the file (root@pam only through pct or the API; ct_mounts)."""
    plan_kw = plan_kwargs(p)
    mount = cm.check(p.get("bind_mount"))

    def compute(conf):
        new = lc.ConfigFile.parse(conf.render())
        if mount:
            cm.plan(new, *mount)
        if writer == "file":
            plan = lc.plan_passthrough(new, devices, p["method"], proc_devices, **plan_kw)
            return new, plan.devn_set, plan.devn_delete, plan.warnings
        # pct/api: compare devN with what the CT gets at its next start (pending applied)
        eff = lc.effective_conf(conf)
        dplan = lc.plan_passthrough(eff, devices, p["method"], proc_devices, handle_raw=False, **plan_kw)
        rplan = lc.plan_passthrough(new, devices, p["method"], proc_devices, handle_devn=False, **plan_kw)
        # predicted bytes for the diff: pct rewrites the file in PVE's canonical form; we show the key edits
        for key in dplan.devn_delete:
            new.delete_key(key)
        for key in sorted(dplan.devn_set):
            new.set_key(key, dplan.devn_set[key])
        return new, dplan.devn_set, dplan.devn_delete, rplan.warnings
    return compute


def host_dir(module, ctx, result):
    """The bind mount's host directory, made when absent (owned by the CT's root); True when it was (or would be)."""
    if not ctx["mount"]:
        return False
    host, mp = ctx["mount"]
    uid, gid = cm.root_ids(ctx["conf"])
    made = cm.ensure_host_dir(host, uid, gid, module.check_mode)
    result["bind_mount"] = dict(host_path=host, mp=mp, owner="%d:%d" % (uid, gid), created=made)
    return made


def boot_warnings(p, vmid, conf, devices, devn_set, devn_delete):
    """A devN entry dropped (removed or reused) because no boot makes its node, or one O(devices) asks for that no boot
    makes: PVE refuses to start a container whose devN node is missing (device_nodes): after a reboot it would stay down."""
    old = owned_state(lc.effective_conf(conf))
    out = ["CT %s: %s (%s) removed: nothing makes that node at boot, so PVE would refuse to start the container after a "
           "reboot" % (vmid, k, _path(old[k])) for k in sorted(set(devn_delete) | set(devn_set), key=lambda k: int(k[3:]))
           if k in old and _path(old[k]) != _path(devn_set.get(k)) and not made_at_boot(_path(old[k]))]
    late = [d["path"] for d in devices if lc.is_owned_path(d["path"]) and not made_at_boot(d["path"])]
    if late and p["method"] == "devN":
        them = "it" if len(late) == 1 else "them"
        out.append("CT %s: %s passed as devN, but the device-node unit does not make %s at boot: after a reboot PVE refuses "
                   "to start the container unless something makes %s before pve-guests.service" % (
                       vmid, ", ".join(late), them, them))
    return out


def _path(devn_value):
    return lc.parse_dev_value(devn_value or "").get("path")


def refuse_token_devn(p, writer, devn_changes):
    """PVE refuses devN changes by an API token: say so before anything is written."""
    if writer == "api" and devn_changes and p.get("api_token_id") and p["api_backend"] == "https":
        who = p["api_token_id"] if "!" in p["api_token_id"] else "%s!%s" % (p["api_user"], p["api_token_id"])
        raise lc.LxcConfigError(pa.DEVN_TOKEN_REFUSED.format(who=who) + " (or writer=pct on the node); nothing was written")


def restart_reason(vmid, changed, drift, result):
    """Why the CT needs a restart ('' when it does not): a changed config, or device nodes that drifted."""
    if not drift:
        return "config changed" if changed else ""
    result["node_drift"] = drift
    result["restart_reason"] = "device nodes in CT %s differ from the host's (%s)" % (vmid, "; ".join(
        "%s host %s, container %s" % (d["path"], d["host"], d["container"]) for d in drift))
    return result["restart_reason"]


def apply(module, p, vmid, result, ctx, session, node):
    """Write the planned config (file, pct or API for devN; raw lines always to the file) under PVE's lock."""
    if ctx["writer"] == "file":
        with lc.ConfigLock(vmid, p["lock_dir"], p["lock_timeout"]):
            raw = lc.read_config(p["config_dir"], vmid)
            conf = lc.ConfigFile.parse(raw)
            check_lock(conf, vmid)
            new = ctx["compute"](conf)[0]
            if new.render() != conf.render():
                if p["backup"]:
                    result["backup_file"] = lc.write_backup(p["backup_dir"], vmid, raw)
                lc.atomic_write(result["config_file"], new.to_bytes())
        return session, node
    if p["backup"]:
        result["backup_file"] = lc.write_backup(p["backup_dir"], vmid, ctx["raw"])
    if result["devn_set"] or result["devn_delete"]:
        if ctx["writer"] == "pct":
            pct_set(module, vmid, result["devn_set"], result["devn_delete"])
        else:
            pa.set_devn(session, node, vmid, result["devn_set"], result["devn_delete"])
    write_raw_lines(p, vmid, result, ctx["devices"], ctx["proc_devices"])
    return session, node


def write_raw_lines(p, vmid, result, devices, proc_devices):
    """Raw lines (the other method's leftovers) go to the file, under the lock; then report what the CT gets."""
    with lc.ConfigLock(vmid, p["lock_dir"], p["lock_timeout"]):
        raw2 = lc.read_config(p["config_dir"], vmid)
        check_lock(lc.ConfigFile.parse(raw2), vmid)
        new2 = lc.ConfigFile.parse(raw2)
        lc.plan_passthrough(new2, devices, p["method"], proc_devices, handle_devn=False, **plan_kwargs(p))
        if cm.check(p.get("bind_mount")):
            cm.plan(new2, *cm.check(p["bind_mount"]))
        if new2.render() != raw2.decode("utf-8", "surrogateescape"):
            lc.atomic_write(result["config_file"], new2.to_bytes())
    final = lc.ConfigFile.parse(lc.read_config(p["config_dir"], vmid))
    result["devn"] = owned_state(lc.effective_conf(final))
    result["lxc_lines"] = owned_raw(final, devices, proc_devices)


def restart(module, p, vmid, result, warnings, session, node, reason):
    """Restart a running CT through the API (O(restart)) for ``reason``; else report that a restart is needed."""
    result["changed"] = True if result["changed"] or p["restart"] else False
    if p["restart"]:
        tasks = pa.ct_restart(session, node, vmid, p["task_timeout"], p["shutdown_timeout"])
        result["restarted"] = bool(tasks)
        if not tasks and not p["ensure_running"]:
            warnings.append("CT %s is stopped; the new passthrough applies at its next start" % vmid)
    else:
        result["restart_required"] = True
    if not result["restarted"]:  # a restarted container is running
        ensure_running(module, p, vmid, result, session, node)
    if result["restart_required"]:
        warnings.append("CT %s: %s; restart the container to apply it (restart=true does that)" % (vmid, reason))


def ensure_running(module, p, vmid, result, session=None, node=None):
    """Start a container that is not running (O(ensure_running)); a start applies the config just written."""
    if not p["ensure_running"]:
        return
    session = session or pa.connect(p)
    node = node or p["node"] or pa.find_node(session, vmid)
    result["status"] = pa.ct_status(session, node, vmid).get("status")
    if result["status"] == "running":
        return
    if not module.check_mode:
        pa.ct_start(session, node, vmid, p["task_timeout"])  # raises unless the start task ended OK
        result["status"] = "running"
    result.update(changed=True, started=True, restart_required=False)


def report_lock(p, vmid, conf, result, warnings):
    """A run that changes nothing goes on while a backup or snapshot holds the CT (lock: key or PVE's flock)."""
    lock = lc.config_lock(conf)
    held = lc.config_lock_held(vmid, p["lock_dir"])
    if lock or held:
        result["lock"] = lock or "flock"
        warnings.append("CT %s is locked (%s) but nothing needs to change, so nothing was written" % (
            vmid, "lock: %s" % lock if lock else "%s is held" % lc.lock_path(p["lock_dir"], vmid)))


def check_lock(conf, vmid):
    lock = lc.config_lock(conf)
    if lock:
        raise lc.LxcConfigError(
            "CT %s is locked (lock: %s) - a %s is in progress or was interrupted; nothing was written. Wait until it "
            "finishes; if it is stale, `pct unlock %s` clears it." % (vmid, lock, lock, vmid), phase="ct_locked")
