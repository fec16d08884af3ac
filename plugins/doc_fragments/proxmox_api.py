# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """The PVE API connection options (module_utils/host/proxmox_api.py api_argument_spec), for every module that takes them."""

    DOCUMENTATION = r"""
options:
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
        (PVE allows that to root@pam only); use it with C(writer=pct)/C(writer=file), or C(method=lxc_raw) in kpro.gpu_serving.lxc_gpu_passthrough.
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
  ca_content:
    description:
      - The CA (PEM text) to put at O(ca_path) before any API call, its directory created (mode 0755) and the file
        mode 0644, when the file differs; reported as a change (RV(ca_changed)) with a diff.
      - In check mode a CA that would change is not written; the API calls verify against a temporary copy of it.
      - Requires O(ca_path).
    type: str
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
"""
