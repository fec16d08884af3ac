# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """The failure contract's return values (module_utils/common/failure.py), for the RETURN of every module that fails by phase."""

    DOCUMENTATION = r"""
options: {}
"""

    RETURN = r"""
phase:
  version_added: "0.2.0"
  description:
    - On failure, the failure's name from the collection's vocabulary (C(plugins/module_utils/common/failure.py)).
    - C(docs/troubleshooting.md) lists every phase, the module that reports it, and what to do.
  returned: failure
  type: str
  sample: gpu_in_use
evidence:
  version_added: "0.2.0"
  description: On failure, what shows it (refusals, command output, file names).
  returned: failure
  type: list
  elements: str
remedy:
  version_added: "0.2.0"
  description: On failure, what to do (also appended to RV(msg) after C(Remedy:)).
  returned: failure
  type: str
known_failure:
  version_added: "0.2.0"
  description:
    - On failure, the same as data - C(phase), C(msg) (without the phase and the remedy), C(evidence), C(remedy) - for a
      task that reads a registered failure (never parse RV(msg)).
  returned: failure
  type: dict
"""
