# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lookup kpro.gpu_serving.inventory_inputs: the variables a run reads on this host, each resolved on its own.

Why a lookup: a lookup gets the task's variables and templates with them (``hostvars`` included, which a variable such
as ``pct_host: "{{ hostvars[pve_node_host].ansible_host }}"`` needs and which ``hostvars[host][name]`` read from another
host's task lacks), and it can resolve each variable inside a try: an undefined vault variable comes back as data
naming it, instead of failing the task at the first one. The decisions are module_utils/controller/inventory_check.py's.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: inventory_inputs
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
version_added: "0.2.0"
short_description: Resolve the variables a run reads on this host, one by one, unresolvable ones returned as data
description:
  - Resolves, with the task's variables, every variable the concerns named by the terms read (a group of the run,
    C(proxmox_hosts) or C(gpu_containers), stands for its concerns; see the filter
    P(kpro.gpu_serving.inventory_problems#filter)), each inside its own try.
  - A variable that resolves is returned under C(resolved); one that does not (an undefined variable it reads, such as
    a C(vault_*) variable missing from the vault, a C(default(omit)) outside a module argument, a failed lookup) under
    C(unresolved) with the reason; one that is not set at all under neither (the role's default applies).
  - Nothing is contacted; the values stay on the controller. Pass the result to P(kpro.gpu_serving.inventory_problems#filter).
options:
  _terms:
    description: Groups of the run (C(proxmox_hosts), C(gpu_containers)) or concerns (C(api), C(host_installer),
      C(container), C(container_installer), C(lock), C(model), C(server)).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Check this host's inputs on the controller
  ansible.builtin.set_fact:
    inventory_problems: >-
      {{ lookup('kpro.gpu_serving.inventory_inputs', *group_names)
         | kpro.gpu_serving.inventory_problems(inventory_hostname) }}
"""

RETURN = r"""
_list:
  description: One dictionary for all the terms.
  type: list
  elements: dict
  contains:
    concerns:
      description: The concerns the terms name, in order.
      type: list
      elements: str
    resolved:
      description: Variable name -> its value, for those set and resolvable.
      type: dict
    unresolved:
      description: Variable name -> C(kind) (C(undefined), C(omit) or C(error)) and C(error) (the message, such as
        C('vault_x' is undefined)).
      type: dict
"""

from ansible.errors import AnsibleError, AnsibleUndefinedVariable, AnsibleValueOmittedError
from ansible.plugins.lookup import LookupBase

from ansible_collections.kpro.gpu_serving.plugins.module_utils.controller import inventory_check


class LookupModule(LookupBase):

    def resolve(self, variables, name):
        """(value, None) or (None, {kind, error})."""
        try:
            return self._templar.template(variables[name]), None
        except AnsibleUndefinedVariable as e:
            return None, {"kind": "undefined", "error": getattr(e, "message", None) or str(e)}
        except AnsibleValueOmittedError as e:
            return None, {"kind": "omit", "error": getattr(e, "message", None) or str(e)}
        except AnsibleError as e:
            return None, {"kind": "error", "error": getattr(e, "message", None) or str(e)}

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        variables = variables or {}
        resolved, unresolved = {}, {}
        for name in inventory_check.reads(terms):
            if name not in variables:
                continue
            value, problem = self.resolve(variables, name)
            if problem:
                unresolved[name] = problem
            else:
                resolved[name] = value
        return [{"concerns": inventory_check.concerns(terms), "resolved": resolved, "unresolved": unresolved}]
