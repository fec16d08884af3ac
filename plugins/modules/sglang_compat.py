#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_compat
short_description: Check an SGLang version against the collection's compatibility table before installing or launching it
version_added: "0.1.0"
description:
  - Looks up O(version) x O(architecture) x O(tp) in the compatibility table of known-bad SGLang releases
    (C(plugins/module_utils/container/compat.py)) and fails, before anything is installed, when a rule refuses the
    combination, naming the rule, the upstream pull request that fixed it and the remedy.
  - For example SGLang 0.5.9 with C(Qwen3_5ForConditionalGeneration) at tensor parallel 2 is refused (PR 19070,
    the dense MLP output is never all-reduced across ranks); 0.5.10 and 0.5.10.post1 are refused for that
    architecture (PR 22312, a GDN gating regression).
  - A rule that only warns returns the warning and succeeds. O(overrides) changes a rule's action knowingly
    (reported in the result).
  - Read-only; the same answer in check mode.
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  version:
    description: SGLang version to check (PEP 440), for example C(0.5.11).
    type: str
    required: true
  architecture:
    description:
      - The model's architecture, as in C(architectures) of its C(config.json), for example C(Qwen3_5ForConditionalGeneration).
    type: str
    required: true
  tp:
    description: Tensor parallel size the server will run with. Unknown (omitted) means rules for any size apply.
    type: int
  overrides:
    description:
      - Rule id to action (C(ignore), C(warn) or C(refuse)), to run a refused combination knowingly or to make a
        warning fatal, for example C(sglang-0.5.9-qwen3.5-dense-tp=warn) (see EXAMPLES).
    type: dict
    default: {}
  model_config:
    description:
      - The model's C(config.json) as a dict, for rules that depend on it (the GDN head ratio of PR 22312).
        Without it those rules are assumed to apply.
    type: dict
attributes:
  check_mode:
    support: full
    description: The check only reads; check mode gives the same result.
  diff_mode:
    support: none
    description: Nothing is changed.
notes:
  - A refusal fails with RV(phase=known_bad_version), the gate's vocabulary for this cause.
"""

EXAMPLES = r"""
- name: Refuse a known-bad SGLang before installing it
  kpro.gpu_serving.sglang_compat:
    version: "{{ sglang_install_version }}"
    architecture: Qwen3_5ForConditionalGeneration
    tp: 2

- name: Run 0.5.9 at TP 2 anyway, knowingly (the rule becomes a warning)
  kpro.gpu_serving.sglang_compat:
    version: 0.5.9
    architecture: Qwen3_5ForConditionalGeneration
    tp: 2
    overrides:
      sglang-0.5.9-qwen3.5-dense-tp: warn
"""

RETURN = r"""
action:
  description: C(ok), C(warn) or C(refuse) (a refusal also fails the task).
  returned: always
  type: str
  sample: refuse
phase:
  description: C(known_bad_version) when refused, otherwise null.
  returned: always
  type: str
  sample: known_bad_version
rules:
  description: The matching rules with their effective action (C(overridden_from) when an override changed it).
  returned: always
  type: list
  elements: dict
  sample: [{"id": "sglang-0.5.9-qwen3.5-dense-tp", "action": "refuse", "pr": "#19070"}]
prs:
  description: Upstream pull requests of the matching rules that warn or refuse.
  returned: always
  type: list
  elements: str
  sample: ["#19070"]
message:
  description: What was found, rule by rule, with the pull request.
  returned: always
  type: str
remedy:
  description: What to change (empty when nothing is wrong).
  returned: always
  type: str
  sample: Pin sglang >= 0.5.11 (0.5.10.x has the GDN regression of PR #22312), or run at --tp-size 1.
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import compat
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str", required=True),
            architecture=dict(type="str", required=True),
            tp=dict(type="int"),
            overrides=dict(type="dict", default={}),
            model_config=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    try:
        p = module.params
        module.exit_json(**compat.verdict(p["version"], p["architecture"], p["tp"], p["overrides"], p["model_config"], module.warn))
    except Failure as e:
        fail(module, e)


if __name__ == "__main__":
    main()
