# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """The PVE API connection options (module_utils/host/proxmox_api.py api_argument_spec), for every module that takes them."""

    DOCUMENTATION = r"""
notes:
  - >-
    An API option not given falls back to the environment variable community.proxmox reads for it (E(PROXMOX_HOST),
    E(PROXMOX_USER), E(PROXMOX_TOKEN_ID), E(PROXMOX_TOKEN_SECRET), ...), in the environment of the module, that is on
    the host the task runs on (set it with the task's C(environment) keyword).
  - >-
    These modules form the action group C(kpro.gpu_serving.proxmox): C(module_defaults) with
    C(group/kpro.gpu_serving.proxmox) sets the API options once for all of them.
attributes:
  action_group:
    description: Use C(group/kpro.gpu_serving.proxmox) in C(module_defaults) to set the API options once.
    support: full
    membership:
      - kpro.gpu_serving.proxmox
options:
  api_backend:
    description: How to reach the PVE API. C(https) through proxmoxer; C(ssh_paramiko) and C(local) run C(pvesh) as root@pam on the node.
    type: str
    choices: [https, ssh_paramiko, local]
    default: https
  api_host:
    description:
      - The PVE node's address (C(https), C(ssh_paramiko)).
      - You can use the E(PROXMOX_HOST) environment variable.
    type: str
  api_port:
    description:
      - HTTPS port of pveproxy.
      - You can use the E(PROXMOX_PORT) environment variable.
    type: int
    default: 8006
  api_user:
    description:
      - PVE user, for example C(root@pam).
      - You can use the E(PROXMOX_USER) environment variable.
    type: str
    default: root@pam
  api_token_id:
    description:
      - API token name (C(ansible)) or full ID (C(root@pam!ansible)). An API token cannot change C(devN) keys
        (PVE allows that to root@pam only); use it with C(writer=pct)/C(writer=file), or C(method=lxc_raw) in kpro.gpu_serving.lxc_gpu_passthrough.
      - You can use the E(PROXMOX_TOKEN_ID) environment variable.
    type: str
  api_token_secret:
    description:
      - The API token's secret.
      - You can use the E(PROXMOX_TOKEN_SECRET) environment variable.
    type: str
  api_password:
    description:
      - Password of O(api_user) (HTTPS ticket), or of O(ssh_user) for C(ssh_paramiko).
      - You can use the E(PROXMOX_PASSWORD) environment variable.
    type: str
  validate_certs:
    description:
      - Verify the HTTPS certificate.
      - You can use the E(PROXMOX_VALIDATE_CERTS) environment variable.
    type: bool
    default: true
  ca_path:
    description:
      - CA bundle to verify the node's certificate with (for example a copy of C(/etc/pve/pve-root-ca.pem)).
      - You can use the E(PROXMOX_CA_PATH) environment variable.
    type: path
  ca_content:
    version_added: "0.2.0"
    description:
      - The CA (PEM text) to put at O(ca_path) before any API call, its directory created (mode 0755) and the file
        mode 0644, when the file differs; reported as a change (RV(ca_changed)) with a diff.
      - In check mode a CA that would change is not written; the API calls verify against a temporary copy of it.
      - Requires O(ca_path).
    type: str
  api_timeout:
    description:
      - Timeout in seconds of each API request or C(pvesh) call (proxmoxer's own default, 5 s, is too short).
      - You can use the E(PROXMOX_API_TIMEOUT) environment variable.
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
"""
