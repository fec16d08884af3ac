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
      - "A path is C(stat)ed on this host when O(require_nodes) is true. When it is false, a path that is not
        there takes its major from its name: 195 for C(nvidia<N>), C(nvidiactl), C(nvidia-modeset), and
        C(/proc/devices) for C(nvidia-uvm*) and C(nvidia-caps/*)."
      - "Without O(devices): C(/dev/nvidia<N>) (filtered by O(gpus)), C(/dev/nvidiactl), C(/dev/nvidia-uvm),
        C(/dev/nvidia-uvm-tools) are required; C(/dev/nvidia-modeset) is passed when present. C(/dev/nvidia-caps/*)
        (MIG capabilities, made on demand by C(nvidia-modprobe -f)) is not passed (RV(left_out)): no boot makes it, and
        PVE refuses to start a container whose C(devN) node is missing, so it would stay down after a reboot. An owned
        C(devN) entry for it is removed, with a warning."
      - "A path given here that the device-node unit does not make at boot is passed, with a warning (O(method=devN))."
    type: list
    elements: raw
  require_nodes:
    description:
      - Fail unless every path in O(devices) is a character device on this host.
      - Default true when O(config_dir) is in C(/etc/pve) (or the tests' device root is set), false otherwise
        (plain files, nodes from another host).
    type: bool
  dev_root:
    description: Internal, for tests only (do not set) - the root under which C(/dev) is read (tests, or a chroot).
    type: path
    default: /
  proc_root:
    description: Internal, for tests only (do not set) - the root under which C(/proc/devices) is read.
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
  bind_mount:
    version_added: "0.3.0"
    description:
      - "A host directory bind-mounted into the container as C(mpN: <host_path>,mp=<mp>): storage that outlives
        C(pct destroy), which frees only the mount point volumes the CT owns (pve-container C(src/PVE/LXC.pm)
        C(destroy_lxc_container)), never a bind mount. The line reuses the C(mpN) that already mounts O(bind_mount.host_path)
        at O(bind_mount.mp), else takes the first free index; another source at O(bind_mount.mp) is refused."
      - "Written to the config file under PVE's config lock, whatever O(writer) is: through C(pct set) or the API a bind
        mount point is root@pam only (C(src/PVE/LXC.pm) C(check_ct_modify_config_perm): I(mount point type bind is only
        allowed for root@pam)). A change restarts the container like any other config change (O(restart))."
      - The host directory is created when absent, owned by the container's root (the C(lxc.idmap) line for id 0, else
        100000 for an C(unprivileged) container, else 0); PVE refuses to start a container whose bind source is missing.
    type: dict
    suboptions:
      host_path:
        description: Absolute host directory, not under a system directory (C(/etc), C(/usr), C(/proc), ...).
        type: str
        required: true
      mp:
        description: Absolute path in the container (not C(/), C(/proc), C(/sys), C(/dev), C(/run)).
        type: str
        required: true
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
extends_documentation_fragment:
  - kpro.gpu_serving.proxmox_api
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

- name: The API options once for every module of the group (or from PROXMOX_HOST, PROXMOX_TOKEN_ID, ... instead)
  module_defaults:
    group/kpro.gpu_serving.proxmox:
      api_host: kpro5.example
      api_user: root@pam
      api_token_id: ansible
      api_token_secret: "{{ vault_pve_token }}"
      ca_path: /etc/pve/pve-root-ca.pem
  block:
    - name: Pass both GPUs to CT 129, restarting it through the API when something changed
      kpro.gpu_serving.lxc_gpu_passthrough:
        vmid: 129
        restart: true

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
extends_documentation_fragment:
  - kpro.gpu_serving.failure
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
left_out:
  version_added: "0.2.0"
  description: The C(/dev/nvidia-caps/*) nodes present on this host and not passed, because no boot makes them.
  returned: always
  type: list
  elements: str
  sample: [/dev/nvidia-caps/nvidia-cap1, /dev/nvidia-caps/nvidia-cap2]
backup_file:
  description: Backup of the previous config, when one was written.
  returned: when changed and O(backup=true)
  type: str
  sample: /var/backups/kpro-gpu-serving/lxc/129.conf.20250101T120000.000000Z
bind_mount:
  version_added: "0.3.0"
  description: The bind mount's host directory, its owner and whether this run created it (or would, in check mode).
  returned: when O(bind_mount) is set
  type: dict
  sample: {"host_path": "/var/lib/vz/kpro-models", "mp": "/srv/models", "owner": "100000:100000", "created": true}
ca_changed:
  version_added: "0.2.0"
  description: O(ca_content) was (or in check mode would be) written to O(ca_path).
  returned: always
  type: bool
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
  version_added: "0.2.0"
  description: Passed device nodes whose major:minor in the running container differs from the host's.
  returned: when they differ
  type: list
  elements: dict
  sample: [{"path": "/dev/nvidia-uvm", "host": "508:0", "container": "509:0"}]
restart_reason:
  version_added: "0.2.0"
  description: Why the container needs (or got) a restart although its config did not change.
  returned: when RV(node_drift) is returned
  type: str
lock:
  version_added: "0.2.0"
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import ct_passthrough as ct
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import lxc_config as lc
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import root_options

ROOTS = dict(dev_root="/", proc_root="/")  # test-only roots (or a chroot), documented as internal


def argument_spec():
    spec = dict(
        vmid=dict(type="int", required=True),
        config_dir=dict(type="path", default=lc.PVE_CONFIG_DIR),
        method=dict(type="str", default="devN", choices=["devN", "lxc_raw"]),
        gpus=dict(type="list", elements="str", default=["all"]),
        devices=dict(type="list", elements="raw"),
        require_nodes=dict(type="bool"),
        dev_mode=dict(type="str", default="0666"),
        dev_uid=dict(type="int"),
        dev_gid=dict(type="int"),
        bind_mount=dict(type="dict", options=dict(host_path=dict(type="str", required=True), mp=dict(type="str", required=True))),
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
    spec.update(root_options(ROOTS))
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    warnings = []
    result = dict(changed=False, method=p["method"], restarted=False, started=False, restart_required=False,
                  devn_set={}, devn_delete=[])
    try:
        ca = pa.install_ca(p, module.check_mode, module.tmpdir)
        result["ca_changed"] = ca["changed"]
        ct.run(module, dict(p, ca_path=ca["path"]), p["vmid"], result, warnings)
    except Failure as e:
        fail(module, e, **result)
    if ca["changed"]:
        result["changed"] = True
        if module._diff:
            result["diff"] = [d for d in (result.get("diff"), ca["diff"]) if d]
    for w in warnings:
        module.warn(w)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
