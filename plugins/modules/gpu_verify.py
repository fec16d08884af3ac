#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_verify
short_description: Verify a deployment without changing it; report findings as JSON and a Prometheus textfile
version_added: "0.3.0"
description:
  - A read-only look at a deployment that passed its gate, for a schedule (docs/verify.md). Each check in O(checks) gives
    findings, each C({check, phase, severity, evidence, remedy}) as a failed run's.
  - C(driver) compares the loaded kernel module (C(/proc/driver/nvidia/version)), the NVIDIA userspace here (the version
    C(libnvidia-ml.so.1) points to, and NVML's answer) and O(driver_version).
  - C(kernels) (a Proxmox host) finds the kernels that can boot without the NVIDIA module, as the pre-reboot check
    (M(kpro.gpu_serving.gpu_reboot_check)) does for the next boot's; C(packages) finds the O(apt_holds) and the
    unattended-upgrades blacklist entries (O(apt_blacklist)) that are gone, and with O(installer_userspace) apt packages
    of NVIDIA userspace.
  - C(memory) names the processes that hold GPU memory and are not in the unit's cgroup.
  - "C(health) reads NVML's temperature, throttle reasons and uncorrected ECC errors, and the C(NVRM: Xid) lines of the
    kernel log (O(kernel_log), else this boot's C(journalctl -k))."
  - C(deployment) compares the venv's lock and SGLang version with the deployment record (M(kpro.gpu_serving.sglang_deployment))
    and the unit's files with those of the server's launch; C(model) the model files with the revision's listing hf_model
    kept (sizes; hashes with O(verify_hashes)); C(live) asks C(/health), the known-answer checks and one short completion.
  - Writes the result to O(json_path) and O(textfile_path) (atomically; not in check mode, which writes nothing and returns
    the result only). They are this run's output, not a change of the system, so the module always reports C(changed=false).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  checks:
    description: The checks to run, in this order (the play runs the first three on a Proxmox host, all of them in a container).
    type: list
    elements: str
    choices: [driver, memory, health, kernels, packages, deployment, model, live]
    default: [driver, memory, health, kernels, packages, deployment, model, live]
  unit:
    description: The SGLang unit (its record, cgroup and files).
    type: str
    default: sglang.service
  state_dir:
    description: Where sglang_deployment and sglang_service keep their records.
    type: path
    default: /var/lib/kpro-gpu-serving
  driver_version:
    description: The driver version the deployment asks for (not compared when unset).
    type: str
  apt_holds:
    description: Packages the deployment holds (C(apt-mark hold)); one installed and not held is a C(deployment_drift) warning.
    type: list
    elements: str
    default: []
  apt_blacklist:
    description: The C(Unattended-Upgrade::Package-Blacklist) entries O(apt_blacklist_file) must hold where unattended-upgrades is installed.
    type: list
    elements: str
    default: []
  apt_blacklist_file:
    description: The apt.conf.d file the deployment wrote the blacklist to.
    type: path
  installer_userspace:
    description: The NVIDIA userspace here came from the .run installer (a GPU container); installed apt packages of NVIDIA userspace are an error.
    type: bool
    default: false
  kernel_log:
    description: A kernel log file (rsyslog's C(kern.log)); when it is missing, this boot's C(journalctl -k) is read.
    type: path
    default: /var/log/kern.log
  max_temp_c:
    description: A GPU at or above this temperature gives a C(gpu_throttled) warning.
    type: int
    default: 85
  verify_hashes:
    description: Hash the model files too (minutes for a large model; for a schedule or on demand).
    type: bool
    default: false
  base_url:
    description: The server's address.
    type: str
    default: http://127.0.0.1:30000
  served_model_name:
    description: The model name to ask (default the recorded deployment's C(served_model_name)).
    type: str
  api_key_file:
    description: The server's C(--config) file holding the key (default C(/etc/kpro-gpu-serving/<unit stem>-secrets.yaml)).
    type: path
  known_answer_checks:
    description: The known-answer checks (default the gate's; see M(kpro.gpu_serving.sglang_gate)).
    type: list
    elements: dict
  chat_template_kwargs:
    description: As M(kpro.gpu_serving.sglang_gate)'s.
    type: dict
  http_timeout:
    description: Seconds per request.
    type: float
    default: 30
  max_latency_s:
    description: One short completion slower than this gives a C(slow_response) warning.
    type: float
    default: 10
  host:
    description: The C(host) label of the metrics (the inventory name).
    type: str
    required: true
  json_path:
    description: Where the JSON result is written.
    type: path
    default: /var/lib/kpro-gpu-serving/verify.json
  textfile_path:
    description: The node_exporter textfile collector's file.
    type: path
    default: /var/lib/prometheus/node-exporter/kpro_gpu_serving.prom
  fail_on_findings:
    description: Fail when a finding is an error (with the phase of the first error and every finding listed).
    type: bool
    default: true
  journalctl:
    description: Internal, for tests only (the journalctl to run).
    type: path
"""

EXAMPLES = r"""
- name: Verify the container's deployment
  kpro.gpu_serving.gpu_verify:
    host: "{{ inventory_hostname }}"
"""

RETURN = r"""
ok:
  description: No finding is an error.
  returned: always
  type: bool
findings:
  description: The findings, in check order, each C({check, phase, severity, evidence, remedy}).
  returned: always
  type: list
  elements: dict
known_answer_ok:
  description: Whether the known-answer checks passed (null when not asked).
  returned: always
  type: bool
request_latency_s:
  description: One short completion's time in seconds (null when it failed or was not asked).
  returned: always
  type: float
nvml:
  description: Where the GPU facts came from (C(pynvml)), or why NVML could not be asked (null without C(driver) and C(memory)).
  returned: always
  type: str
gpu_processes:
  description: Every process on a GPU (C(gpu), C(pid), C(name), C(used_mib), C(ours), C(visible), C(cmdline)), with the C(memory) check.
  returned: when the memory check ran
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import metrics_textfile as mt
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_run as vr
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_upgrade as vu
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.verify import CHECKS

SPEC = dict(
    checks=dict(type="list", elements="str", choices=list(CHECKS), default=list(CHECKS)), unit=dict(type="str", default="sglang.service"),
    state_dir=dict(type="path", default="/var/lib/kpro-gpu-serving"), driver_version=dict(type="str"),
    kernel_log=dict(type="path", default="/var/log/kern.log"), max_temp_c=dict(type="int", default=85),
    verify_hashes=dict(type="bool", default=False), base_url=dict(type="str", default="http://127.0.0.1:30000"),
    served_model_name=dict(type="str"), api_key_file=dict(type="path"), known_answer_checks=dict(type="list", elements="dict"),
    chat_template_kwargs=dict(type="dict"), http_timeout=dict(type="float", default=30), max_latency_s=dict(type="float", default=10),
    host=dict(type="str", required=True), json_path=dict(type="path", default="/var/lib/kpro-gpu-serving/verify.json"),
    textfile_path=dict(type="path", default="/var/lib/prometheus/node-exporter/kpro_gpu_serving.prom"),
    fail_on_findings=dict(type="bool", default=True), journalctl=dict(type="path"),
    apt_holds=dict(type="list", elements="str", default=[]), apt_blacklist=dict(type="list", elements="str", default=[]),
    apt_blacklist_file=dict(type="path"), installer_userspace=dict(type="bool", default=False),
)


def main():
    module = AnsibleModule(argument_spec=SPEC, supports_check_mode=True)
    p = dict(module.params)
    p["api_key"] = vr.api_key(p)
    if p["api_key"]:
        module.no_log_values.add(p["api_key"])
    p["journalctl"] = p["journalctl"] or module.get_bin_path("journalctl")
    p["nvidia_smi"] = module.get_bin_path("nvidia-smi")   # NVML's fallback where pynvml is not installed, as gpu_facts
    known, result = None, {}
    try:
        systemctl = module.get_bin_path("systemctl")
        props = su.systemctl_show(module.run_command, systemctl, p["unit"]) if systemctl else {}
        result, json_text, prom_text = vr.run(p, module.run_command, props, vu.run(module, p))
        if not module.check_mode:   # --check writes nothing, not even the run's output
            mt.write(p["json_path"], json_text)
            mt.write(p["textfile_path"], prom_text)
    except OSError as e:
        known = Failure("host_write_failed", "verify could not write its result: %s" % e, remedy="Make json_path and textfile_path writable.")
    if known is None and not result["ok"] and p["fail_on_findings"]:
        known = vr.failure(result)
    if known is not None:
        fail(module, known, changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
