#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_deployment
short_description: Record the SGLang deployment that passed the gate, and roll a failed change back to it
version_added: "0.2.0"
description:
  - Keeps the deployment record of one SGLang unit in C(<state_dir>/<unit>-deployment.json), with the last deployment
    that passed the gate (C(good)) and the last changed deployment that failed it (C(failed)). A deployment is the
    M(kpro.gpu_serving.sglang_service) arguments (venv, unit settings, SGLang options, environment; never the API
    key), the venv's SGLang version and lock sha256 (C(.kpro-lock.sha256)), and the model revision.
  - O(state=checked), before the server is touched, fails fast with the recorded diagnosis when the wanted deployment
    is the one that failed its gate and was rolled back, unless O(retry).
  - O(state=recorded), after a passing gate, makes the wanted deployment the good one.
  - O(state=failed), after a failed gate, returns in RV(restore) the sglang_service arguments of the good deployment
    (its venv, or the copy sglang_install kept under O(venvs_dir); its model revision, from the copy the model stage
    kept when it differs from O(model_revision)); it writes nothing, and it fails with the gate's diagnosis when there is
    nothing to roll back to (no good deployment, its venv or its model revision not kept).
  - O(state=rolled_back), after the restored server's gate, always fails, with the new deployment's diagnosis and
    C(rolled back to <what>, serving again), or with C(phase=rollback_failed) when the restored one failed too. Only
    when the restored one passed its gate is the failure of O(deployment) recorded (for O(state=checked) to fail fast).
  - A multi-node server (SGLang option C(nnodes) > 1) is not rolled back (O(state=failed) fails with the gate's
    diagnosis and says so), as one node cannot restore its peers and the ranks would diverge. The role does not record
    one either (its peers' gates are unknown on this node).
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  state:
    description: The step of the serve stage (see the description).
    type: str
    choices: [checked, recorded, failed, rolled_back]
    required: true
  unit:
    description: The systemd unit; its name without C(.service) names the record file.
    type: str
    default: sglang.service
  service:
    description:
      - The M(kpro.gpu_serving.sglang_service) arguments of the wanted deployment (C(venv) required; C(api_key) and
        C(force_restart) are never recorded).
      - Required unless O(state=rolled_back).
    type: dict
  model_revision:
    description:
      - The model revision the model stage pins (recorded and compared).
      - "With O(state=failed), when the good deployment's revision differs from it, RV(restore) runs the good one from
        the copy the model stage kept under C(<model_dir>/.cache/kpro-revisions/) (its C(model_dir) and every SGLang
        option that named the model directory); when no copy was kept (the disk had no room for both), nothing is
        restored and the step fails with the gate's diagnosis, naming the missing revision and what to do."
    type: str
    default: ""
  venvs_dir:
    description: Where sglang_install keeps previous venvs, each named by the first 16 hex digits of its lock's sha256.
    type: path
  retry:
    description: With O(state=checked), launch a deployment that failed its gate and was rolled back once more.
    type: bool
    default: false
  diagnosis:
    description: The failed gate's result (C(phase), C(msg), C(remedy), C(evidence)); with O(state=failed) and O(state=rolled_back).
    type: dict
  restored_gate:
    description: The restored server's gate result; with O(state=rolled_back).
    type: dict
  failed_at:
    description: RV(failed_at) of the O(state=failed) step (seconds since the epoch); with O(state=rolled_back).
    type: float
  good:
    description: RV(good) of the O(state=failed) step; with O(state=rolled_back).
    type: dict
  deployment:
    description:
      - RV(deployment) of the O(state=failed) step (the deployment that failed its gate); with O(state=rolled_back).
      - Its failure is recorded once the restored deployment passed its gate; without it nothing is recorded.
    type: dict
  state_dir:
    description: Directory of the record (the same as sglang_service's).
    type: path
    default: /var/lib/kpro-gpu-serving
attributes:
  check_mode:
    support: full
    description: Nothing is written in check mode; C(changed) says whether the record would change.
  diff_mode:
    support: full
    description: A changed record is shown as the before and after text of its JSON file.
extends_documentation_fragment:
  - kpro.gpu_serving.failure
"""

EXAMPLES = r"""
- name: Refuse a configuration that failed the gate and was rolled back
  kpro.gpu_serving.sglang_deployment:
    state: checked
    service: "{{ sglang_server__service_args }}"
    venvs_dir: /opt/sglang/venvs
    retry: "{{ sglang_server_rollback_retry }}"

- name: Record the deployment that passed the gate
  kpro.gpu_serving.sglang_deployment:
    state: recorded
    service: "{{ sglang_server__service_args }}"
"""

RETURN = r"""
deployment:
  description: The wanted deployment (service arguments, C(sglang_version), C(lock_sha256), C(model_revision)).
  returned: with service
  type: dict
signature:
  description: The wanted deployment's sha256 (of its canonical JSON).
  returned: with service
  type: str
good:
  description: The recorded deployment that last passed the gate (after O(state=recorded), the wanted one).
  returned: success
  type: dict
recorded:
  description:
    - With O(state=checked), whether the record already holds the wanted deployment as the good one, with no failure of
      it, so that O(state=recorded) of it would change nothing. A run whose gate passes then needs no second call to
      record it.
  returned: with state=checked
  type: bool
changes:
  description: What differs between the good deployment and the wanted one.
  returned: with service
  type: list
  elements: str
  sample: ["environment.NCCL_P2P_DISABLE: null -> \"1\""]
restore:
  description: The sglang_service arguments that bring the good deployment back (O(state=failed)).
  returned: with state=failed
  type: dict
rolled_back_to:
  description: The good deployment in one line.
  returned: with state=failed
  type: str
  sample: SGLang 0.5.11 (lock 3b1f0c9a2d4e, venv /opt/sglang/venv), model revision main
failed_at:
  description: When the failure was found (seconds since the epoch); recorded with it once the rollback served again.
  returned: with state=failed
  type: float
serving_again_s:
  description: Seconds from the recorded failure to the restored server passing its gate.
  returned: with state=rolled_back, when the restored server serves
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import deployment as dp
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import fail


def run(module, result, record):
    """(the record after this step, the Failure the step ends with or None)."""
    p = module.params
    if p["state"] == "rolled_back":
        good, diagnosis, restored = p["good"] or {}, p["diagnosis"] or {}, p["restored_gate"] or {}
        return (dp.record_after_rollback(record, p["deployment"], diagnosis, good, restored, p["failed_at"] or 0.0),
                dp.rolled_back(diagnosis, good, restored, p["failed_at"] or 0.0, wanted=p["deployment"]))
    service = p["service"] or {}
    if p["state"] == "checked":
        facts, failure = dp.checked(record, service, p["model_revision"], p["retry"])
        result.update(facts)
        return record, failure
    wanted = dp.deployment(service, dp.venv_identity(service.get("venv") or ""), p["model_revision"])
    result.update(deployment=wanted, signature=dp.signature(wanted), good=record.get("good"),
                  changes=dp.changes(record.get("good") or {}, wanted) if record.get("good") else [])
    if p["state"] == "recorded":
        return dp.record_good(record, wanted), None
    # failed: nothing is written before the restored deployment passed its gate (state=rolled_back)
    restore, reason = dp.rollback_plan(record, wanted, p["venvs_dir"])
    if restore is None:
        return record, dp.not_rolled_back(p["diagnosis"] or {}, reason)
    result.update(restore=restore, rolled_back_to=dp.describe(record["good"]), failed_at=round(time.time(), 3))
    return record, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=["checked", "recorded", "failed", "rolled_back"]),
            unit=dict(type="str", default="sglang.service"),
            service=dict(type="dict"),
            model_revision=dict(type="str", default=""),
            venvs_dir=dict(type="path"),
            retry=dict(type="bool", default=False),
            diagnosis=dict(type="dict"),
            restored_gate=dict(type="dict"),
            failed_at=dict(type="float"),
            good=dict(type="dict"),
            deployment=dict(type="dict"),
            state_dir=dict(type="path", default=dp.STATE_DIR),
        ),
        required_if=[("state", "checked", ["service"]), ("state", "recorded", ["service"]), ("state", "failed", ["service", "diagnosis"]),
                     ("state", "rolled_back", ["diagnosis", "good", "failed_at"])],
        supports_check_mode=True,
    )
    result = {"changed": False}
    path = dp.record_path(module.params["state_dir"], module.params["unit"])
    before = dp.load(path)
    after, failure = run(module, result, before)
    result["changed"] = after != before
    if result["changed"] and module._diff:
        result["diff"] = {"before_header": path, "after_header": path, "before": dp.render(before) if before else "",
                          "after": dp.render(after)}
    if result["changed"] and not module.check_mode:
        dp.save(path, after)
    if failure:
        fail(module, failure, **result)
    if module.params["state"] == "recorded":
        result["good"] = after.get("good")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
