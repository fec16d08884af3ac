#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lxc_gpu_passthrough
short_description: Pass NVIDIA GPUs through to a Proxmox VE container (devN keys or raw lxc lines)
version_added: "0.1.0"
description:
  - Renders the GPU passthrough of container O(vmid) into its config C(<config_dir>/<vmid>.conf) and leaves
    every other byte of the file as it was (other keys, the description C(#) lines, C(lxc.idmap) and other
    C(lxc.*) lines, C([snapshot]) and C([pve:pending]) sections).
  - With O(method=devN), one C(devN:) entry per device node (PVE 8.1+, pve-container >= 5.0.7); PVE reads the
    majors itself at every start. With O(method=lxc_raw), C(lxc.cgroup2.devices.allow) lines for the majors
    read on this host (195 and the dynamic C(nvidia-uvm)/C(nvidia-caps) majors from C(/proc/devices)) and
    C(lxc.mount.entry) bind lines, in the main section.
  - "The module owns exactly: C(devN) entries whose path is under C(/dev/nvidia); C(lxc.mount.entry) lines whose
    source is under C(/dev/nvidia); C(lxc.cgroup2.devices.allow) lines C(c <major>:...) for major 195, for a major
    C(/proc/devices) names C(nvidia*), or for a dynamic major no driver has registered now when NVIDIA mount entries
    are present (the C(nvidia-uvm) major of an earlier boot). Owned lines that are stale (an old major, a GPU no
    longer passed) are updated in place or removed. With O(remove_other_method=true) the owned lines of the other
    method are removed."
  - New C(devN) keys are inserted at their sorted place among the main keys and C(lxc.*) lines after the existing
    C(lxc.*) lines, where PVE's own writer puts them, so a later C(pct set) does not move them.
  - "How it writes: O(writer=auto) uses C(pct set) for C(devN) changes when O(config_dir) is C(/etc/pve/lxc) (or under
    C(/etc/pve)) and C(pct) exists, the PVE API (proxmoxer, root@pam only) when O(config_dir) is in C(/etc/pve), there
    is no C(pct) and an API connection is configured, and otherwise writes the file. Raw C(lxc.*) lines cannot be
    set through C(pct) or the API and are always written to the file. The file is written like PVE does it
    (C(<file>.tmp.<pid>) then rename, no chmod/chown, which pmxcfs refuses) under PVE's config lock
    C(/run/lock/lxc/pve-config-<vmid>.lock), after a backup outside C(/etc/pve)."
  - A locked container (C(lock:) in its config, or PVE's config flock held, for example by a backup) is an error only
    when this run has something to write or restart; a run with nothing to change reports the lock (RV(lock)) and
    succeeds.
  - When the run may use the API (O(writer=api), O(restart), O(ensure_running)), the credentials, the CA and the vmid
    are proven first by an authenticated read of the container's status; a failure there writes nothing.
  - With the container running and its status read through the API, the major:minor of each passed node inside it
    (C(/proc/<init pid>/root/dev/...)) is compared with the host's; when they differ (nvidia-uvm got a new dynamic
    major after a module reload) the container is restarted with O(restart=true) (RV(restart_reason),
    RV(node_drift)), or RV(restart_required) is reported.
  - When the config changed and O(restart=true), a running container is shut down and started again through the
    PVE API (proxmoxer), waiting on each task's UPID. A stopped container is left stopped.
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
requirements:
  - proxmoxer 1.2.0 or later on the target (Proxmox VE 8 / Debian 12 C(python3-proxmoxer) is 1.2.0; 2.x works too),
    only for O(restart=true), O(ensure_running=true) or O(writer=api)
  - requests for O(api_backend=https) (C(apt-get install python3-proxmoxer python3-requests) on the host),
    paramiko for O(api_backend=ssh_paramiko) (C(python3-paramiko)); O(api_backend=local) runs C(pvesh) on the node
options:
  vmid:
    description: The container's ID.
    type: int
    required: true
  config_dir:
    description:
      - Directory holding C(<vmid>.conf). Any other directory is edited as a plain file (to render or test configs).
    type: path
    default: /etc/pve/lxc
  method:
    description:
      - C(devN) for PVE's device passthrough keys, C(lxc_raw) for C(lxc.cgroup2.devices.allow) + C(lxc.mount.entry).
    type: str
    choices: [devN, lxc_raw]
    default: devN
  gpus:
    description:
      - The GPUs to pass, by index (C(/dev/nvidia<index>)), or C(all). Used when O(devices) is not given.
    type: list
    elements: str
    default: [all]
  devices:
    description:
      - Explicit device list; replaces discovery. Each item is a path under C(/dev/) or a dict with C(path) and,
        optionally, C(major)/C(minor) (then the node is not looked at, for rendering configs off the host).
      - "A path is C(stat)ed under O(dev_root) when O(require_nodes) is true. When it is false, a path that is not
        there takes its major from its name: 195 for C(nvidia<N>), C(nvidiactl), C(nvidia-modeset), and
        C(/proc/devices) for C(nvidia-uvm*) and C(nvidia-caps/*)."
      - "Without O(devices): C(/dev/nvidia<N>) (filtered by O(gpus)), C(/dev/nvidiactl), C(/dev/nvidia-uvm),
        C(/dev/nvidia-uvm-tools) are required; C(/dev/nvidia-modeset) and C(/dev/nvidia-caps/*) are passed when present."
    type: list
    elements: raw
  require_nodes:
    description:
      - Fail unless every path in O(devices) is a character device under O(dev_root).
      - Default true when O(config_dir) is in C(/etc/pve) or O(dev_root) is not C(/), false otherwise
        (plain files, nodes from another host).
    type: bool
  dev_root:
    description: Root under which C(/dev) is read (tests, or a chroot).
    type: path
    default: /
  proc_root:
    description: Root under which C(/proc/devices) is read.
    type: path
    default: /
  dev_mode:
    description:
      - C(mode=) of the C(devN) entries. C(0666) lets non-root processes in the container open the nodes
        (the host nodes are 0666 too); PVE's own default is C(0660).
    type: str
    default: "0666"
  dev_uid:
    description:
      - C(uid=) of the C(devN) entries, as seen in the container (PVE maps it through the idmap of an unprivileged
        container). Not written when unset (PVE uses 0, the container's root).
    type: int
  dev_gid:
    description:
      - C(gid=) of the C(devN) entries, as seen in the container, for example the container's C(video) (44) or
        C(render) group; look it up with C(pct exec <vmid> -- getent group render). Not written when unset (0).
    type: int
  remove_other_method:
    description: Remove the owned lines of the other method (raw lines when O(method=devN) and the reverse).
    type: bool
    default: true
  writer:
    description: How C(devN) changes are made (see the description). Raw C(lxc.*) lines are always written to the file.
    type: str
    choices: [auto, pct, api, file]
    default: auto
  restart:
    description:
      - Restart a running container (shutdown, then start, through the PVE API) when the config changed.
      - Needs an API connection (O(api_host) with credentials, or O(api_backend=local) on the node).
    type: bool
    default: false
  ensure_running:
    description:
      - Start the container through the PVE API when it is not running (after the config step, so the start applies
        it). The stages that follow run inside the container; without this a stopped container makes them fail with
        a connection error instead of a reason.
      - Needs an API connection like O(restart). In check mode the start is reported, not done.
    type: bool
    default: false
  node:
    description: PVE node name for API calls. Found through C(/cluster/resources) when unset.
    type: str
  backup:
    description: Keep a copy of the old config in O(backup_dir) before changing it.
    type: bool
    default: true
  backup_dir:
    description: Where backups go (outside C(/etc/pve)), as C(<vmid>.conf.<UTC timestamp>).
    type: path
    default: /var/backups/kpro-gpu-serving/lxc
  lock_dir:
    description: Directory of PVE's config lock files (C(pve-config-<vmid>.lock)).
    type: path
    default: /run/lock/lxc
  lock_timeout:
    description: Seconds to wait for PVE's config lock.
    type: int
    default: 10
  task_timeout:
    description: Seconds to wait for each PVE task (shutdown, start) to finish.
    type: int
    default: 180
  shutdown_timeout:
    description: Seconds the container gets to shut down cleanly before PVE stops it.
    type: int
    default: 60
  api_backend:
    description: How to reach the PVE API. C(https) through proxmoxer; C(ssh_paramiko) and C(local) run C(pvesh) as root@pam on the node.
    type: str
    choices: [https, ssh_paramiko, local]
    default: https
  api_host:
    description: The PVE node's address (C(https), C(ssh_paramiko)).
    type: str
  api_port:
    description: HTTPS port of pveproxy.
    type: int
    default: 8006
  api_user:
    description: PVE user, for example C(root@pam).
    type: str
    default: root@pam
  api_token_id:
    description:
      - API token name (C(ansible)) or full ID (C(root@pam!ansible)). An API token cannot change C(devN) keys
        (PVE allows that to root@pam only); use it with O(writer=pct)/O(writer=file), or O(method=lxc_raw).
    type: str
  api_token_secret:
    description: The API token's secret.
    type: str
  api_password:
    description: Password of O(api_user) (HTTPS ticket), or of O(ssh_user) for C(ssh_paramiko).
    type: str
  validate_certs:
    description: Verify the HTTPS certificate.
    type: bool
    default: true
  ca_path:
    description: CA bundle to verify the node's certificate with (for example a copy of C(/etc/pve/pve-root-ca.pem)).
    type: path
  api_timeout:
    description: Timeout in seconds of each API request or C(pvesh) call (proxmoxer's own default, 5 s, is too short).
    type: int
    default: 30
  ssh_user:
    description: SSH user for O(api_backend=ssh_paramiko).
    type: str
    default: root
  ssh_port:
    description: SSH port for O(api_backend=ssh_paramiko).
    type: int
    default: 22
  ssh_private_key_file:
    description: Private key for O(api_backend=ssh_paramiko).
    type: path
  ssh_known_hosts:
    description: known_hosts file checked for O(api_backend=ssh_paramiko). Defaults to C(~/.ssh/known_hosts).
    type: path
  ssh_host_key_checking:
    description: Refuse unknown SSH host keys (proxmoxer alone would accept any).
    type: bool
    default: true
extends_documentation_fragment: []
attributes:
  check_mode:
    support: full
    description: Reports what would change; writes nothing, restarts nothing.
  diff_mode:
    support: full
    description: Shows the config file before and after.
notes:
  - A running container gets new C(devN) entries only at its next start (an edited existing entry stays in
    C([pve:pending]) until then); raw C(lxc.*) lines also need a restart. RV(restart_required) says so.
  - Changing C(devN) through the API needs root@pam with a password ticket; an API token is refused by PVE, and this
    module refuses it before sending anything.
seealso:
  - name: pct(1) device passthrough
    description: The devN option of pct.
    link: https://pve.proxmox.com/pve-docs/pct.1.html
"""

EXAMPLES = r"""
- name: Pass both GPUs to CT 129 with devN keys (on the PVE node, through pct)
  kpro.gpu_serving.lxc_gpu_passthrough:
    vmid: 129
    method: devN
    gpus: [0, 1]

- name: Same, restarting the container through the API when something changed
  kpro.gpu_serving.lxc_gpu_passthrough:
    vmid: 129
    restart: true
    api_backend: https
    api_host: kpro5.example
    api_user: root@pam
    api_token_id: ansible
    api_token_secret: "{{ vault_pve_token }}"
    ca_path: /etc/pve/pve-root-ca.pem

- name: Raw lxc lines with this host's dynamic majors
  kpro.gpu_serving.lxc_gpu_passthrough:
    vmid: 129
    method: lxc_raw

- name: Render into a copy of a config, off the host (ad hoc, no pct, no nodes needed)
  kpro.gpu_serving.lxc_gpu_passthrough:
    vmid: 129
    config_dir: /tmp/ctconf
    backup: false
    method: devN
    devices: [/dev/nvidia0, /dev/nvidia1, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools]
"""

RETURN = r"""
config_file:
  description: The config file.
  returned: always
  type: str
  sample: /etc/pve/lxc/129.conf
method:
  description: The method used.
  returned: always
  type: str
  sample: devN
writer:
  description: How devN changes were (or would be) made, C(pct), C(api) or C(file).
  returned: always
  type: str
  sample: pct
devices:
  description: The device nodes passed, with their majors/minors where known.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/dev/nvidia0", "major": 195, "minor": 0}]
devn:
  description: The devN entries this module owns after the run, key to value.
  returned: always
  type: dict
  sample: {"dev0": "/dev/nvidia0,mode=0666"}
devn_set:
  description: devN keys set by this run.
  returned: always
  type: dict
  sample: {"dev3": "/dev/nvidia-uvm,mode=0666"}
devn_delete:
  description: devN keys removed by this run.
  returned: always
  type: list
  elements: str
  sample: [dev5]
lxc_lines:
  description: The raw lxc lines this module owns after the run.
  returned: always
  type: list
  elements: str
  sample: ["lxc.cgroup2.devices.allow: c 195:* rwm"]
majors:
  description: The NVIDIA character majors in /proc/devices.
  returned: always
  type: dict
  sample: {"nvidia": 195, "nvidia-uvm": 509}
backup_file:
  description: Backup of the previous config, when one was written.
  returned: when changed and O(backup=true)
  type: str
  sample: /var/backups/kpro-gpu-serving/lxc/129.conf.20250101T120000.000000Z
restart_required:
  description: The config changed and the container has not been restarted by this run.
  returned: always
  type: bool
restarted:
  description: The container was restarted by this run.
  returned: always
  type: bool
started:
  description: The container was not running and was started by this run (O(ensure_running=true)).
  returned: always
  type: bool
node_drift:
  description: Passed device nodes whose major:minor in the running container differs from the host's.
  returned: when they differ
  type: list
  elements: dict
  sample: [{"path": "/dev/nvidia-uvm", "host": "508:0", "container": "509:0"}]
restart_reason:
  description: Why the container needs (or got) a restart although its config did not change.
  returned: when RV(node_drift) is returned
  type: str
lock:
  description: The container's lock (C(lock:) value, or C(flock) for PVE's held config lock), reported by a run with
    nothing to change.
  returned: when locked and nothing changed
  type: str
  sample: backup
status:
  description: The container's status after the run, from the PVE API.
  returned: when O(ensure_running=true)
  type: str
  sample: running
"""

import ast
import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils import lxc_config as lc
from ansible_collections.kpro.gpu_serving.plugins.module_utils import proxmox_api as pa


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
                raise lc.LxcConfigError("devices: cannot read %s as a list of paths" % joined)
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
        raise pa.ProxmoxApiError(problem)
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
        hint = ""
        if "does not exist" in text and "/dev/" in text:
            hint = " Create the node on the host first (nvidia-modprobe; see kpro.gpu_serving.nvidia_driver)."
        elif "locked" in text:
            hint = " The CT is locked by another operation; wait for it, or `pct unlock %s` if the lock is stale." % vmid
        raise lc.LxcConfigError("`%s` failed (rc=%d): %s.%s" % (" ".join(cmd), rc, text, hint))


def main():
    spec = dict(
        vmid=dict(type="int", required=True),
        config_dir=dict(type="path", default=lc.PVE_CONFIG_DIR),
        method=dict(type="str", default="devN", choices=["devN", "lxc_raw"]),
        gpus=dict(type="list", elements="str", default=["all"]),
        devices=dict(type="list", elements="raw"),
        require_nodes=dict(type="bool"),
        dev_root=dict(type="path", default="/"),
        proc_root=dict(type="path", default="/"),
        dev_mode=dict(type="str", default="0666"),
        dev_uid=dict(type="int"),
        dev_gid=dict(type="int"),
        remove_other_method=dict(type="bool", default=True),
        writer=dict(type="str", default="auto", choices=["auto", "pct", "api", "file"]),
        restart=dict(type="bool", default=False),
        ensure_running=dict(type="bool", default=False),
        node=dict(type="str"),
        backup=dict(type="bool", default=True),
        backup_dir=dict(type="path", default=lc.DEFAULT_BACKUP_DIR),
        lock_dir=dict(type="path", default=lc.DEFAULT_LOCK_DIR),
        lock_timeout=dict(type="int", default=10),
        task_timeout=dict(type="int", default=180),
        shutdown_timeout=dict(type="int", default=60),
    )
    spec.update(pa.api_argument_spec())
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    vmid = p["vmid"]
    warnings = []
    result = dict(changed=False, method=p["method"], restarted=False, started=False, restart_required=False,
                  devn_set={}, devn_delete=[])

    def fail(msg, **kw):
        result.update(kw)
        module.fail_json(msg=msg, **result)

    try:
        run(module, p, vmid, result, warnings)
    except lc.LxcConfigError as e:
        fail(str(e))
    except pa.ProxmoxApiError as e:
        fail(str(e))
    for w in warnings:
        module.warn(w)
    module.exit_json(**result)


def check_inputs(p):
    """dev_mode and gpus as PVE takes them; returns the GPU indices or 'all'."""
    if p["dev_mode"] is not None and not re.match(r"^0[0-7]{3}$", p["dev_mode"]):
        raise lc.LxcConfigError("dev_mode %r is not an octal mode like 0666 (PVE's pattern 0[0-7]{3})" % p["dev_mode"])
    gpus = p["gpus"]
    if gpus and [g for g in gpus if str(g).lower() != "all"]:
        try:
            return [int(g) for g in gpus]
        except ValueError:
            raise lc.LxcConfigError("gpus must be GPU indices (0, 1, ...) or 'all', got %s" % gpus)
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
                                    "`nvidia-modprobe -u -c=0`)" % d["path"])
    return devices, proc_devices


def run(module, p, vmid, result, warnings):
    path = lc.config_path(p["config_dir"], vmid)
    result["config_file"] = path
    pve_dir = lc.is_pve_config_dir(p["config_dir"])

    gpus = check_inputs(p)

    raw = lc.read_config(p["config_dir"], vmid)
    conf = lc.ConfigFile.parse(raw)
    writer = choose_writer(p, pve_dir)
    result["writer"] = writer
    needs_api = api_check(module, p, vmid, writer)

    devices, proc_devices = find_devices(p, gpus, pve_dir, warnings)
    result["devices"] = devices
    result["majors"] = dict((n, m) for n, m in proc_devices.items() if n.startswith("nvidia"))

    plan_kw = plan_kwargs(p)

    def compute(conf):
        """Return (new_conf, devn_set, devn_delete, plan warnings)."""
        new = lc.ConfigFile.parse(conf.render())
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

    new, devn_set, devn_delete, pw = compute(conf)
    warnings.extend(pw)
    after = new.render()
    before = conf.render()
    changed = bool(devn_set or devn_delete or after != before)
    if writer == "api" and (devn_set or devn_delete) and p.get("api_token_id") and p["api_backend"] == "https":
        who = p["api_token_id"] if "!" in p["api_token_id"] else "%s!%s" % (p["api_user"], p["api_token_id"])
        raise lc.LxcConfigError(pa.DEVN_TOKEN_REFUSED.format(who=who) + " (or writer=pct on the node); nothing was written")
    # credentials, CA and vmid are proven by an authenticated read before anything is written
    session, node, status = pa.check_access(p, vmid) if needs_api else (None, None, None)
    result.update(changed=changed, devn_set=devn_set, devn_delete=devn_delete)
    result["devn"] = owned_state(new)
    result["lxc_lines"] = owned_raw(new, devices, proc_devices)
    if module._diff:
        result["diff"] = dict(before=before, after=after, before_header=path, after_header=path)
    drift = [] if changed else node_drift(p, devices, status)
    restart_for = "config changed" if changed else ""
    if drift:
        result["node_drift"] = drift
        restart_for = "device nodes in CT %s differ from the host's (%s)" % (vmid, "; ".join(
            "%s host %s, container %s" % (d["path"], d["host"], d["container"]) for d in drift))
        result["restart_reason"] = restart_for
    if not restart_for:
        report_lock(p, vmid, conf, result, warnings)  # read-only: a lock is reported, not an error
    elif changed or p["restart"]:
        check_lock(conf, vmid)  # a write or a restart: a locked CT is an error, nothing was written
    if module.check_mode or not restart_for:
        result["restart_required"] = bool(restart_for)
        result["changed"] = changed or bool(drift and p["restart"])
        ensure_running(module, p, vmid, result, session, node)
        return
    if changed:
        session, node = apply(module, p, vmid, result, writer, raw, devices, proc_devices, compute, session, node)
    restart(module, p, vmid, result, warnings, session, node, restart_for)


def apply(module, p, vmid, result, writer, raw, devices, proc_devices, compute, session, node):
    """Write the planned config (file, pct or API for devN; raw lines always to the file) under PVE's lock."""
    path = result["config_file"]
    plan_kw = plan_kwargs(p)
    if writer == "file":
        with lc.ConfigLock(vmid, p["lock_dir"], p["lock_timeout"]):
            raw = lc.read_config(p["config_dir"], vmid)
            conf = lc.ConfigFile.parse(raw)
            check_lock(conf, vmid)
            new, dummy_set, dummy_delete, dummy_warn = compute(conf)
            if new.render() != conf.render():
                if p["backup"]:
                    result["backup_file"] = lc.write_backup(p["backup_dir"], vmid, raw)
                lc.atomic_write(path, new.to_bytes())
        return session, node
    if p["backup"]:
        result["backup_file"] = lc.write_backup(p["backup_dir"], vmid, raw)
    if result["devn_set"] or result["devn_delete"]:
        if writer == "pct":
            pct_set(module, vmid, result["devn_set"], result["devn_delete"])
        else:
            pa.set_devn(session, node, vmid, result["devn_set"], result["devn_delete"])
    # raw lines (other method's leftovers) go to the file
    with lc.ConfigLock(vmid, p["lock_dir"], p["lock_timeout"]):
        raw2 = lc.read_config(p["config_dir"], vmid)
        check_lock(lc.ConfigFile.parse(raw2), vmid)
        new2 = lc.ConfigFile.parse(raw2)
        lc.plan_passthrough(new2, devices, p["method"], proc_devices, handle_devn=False, **plan_kw)
        if new2.render() != raw2.decode("utf-8", "surrogateescape"):
            lc.atomic_write(path, new2.to_bytes())
    final = lc.ConfigFile.parse(lc.read_config(p["config_dir"], vmid))
    result["devn"] = owned_state(lc.effective_conf(final))
    result["lxc_lines"] = owned_raw(final, devices, proc_devices)
    return session, node


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
            "finishes; if it is stale, `pct unlock %s` clears it." % (vmid, lock, lock, vmid))


if __name__ == "__main__":
    main()
