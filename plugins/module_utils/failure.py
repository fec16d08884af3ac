# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's failure contract: a known failure is a ``phase`` with ``msg``, ``evidence`` and ``remedy``.

A module raises ``Failure`` from its module_utils and catches it once, in ``main``, with ``fail``:
the operator then reads what went wrong, what shows it, and what to do, never a Python traceback.
"""

from __future__ import annotations


class Failure(Exception):
    """A known failure. ``phase``: a short name from docs/troubleshooting.md; ``evidence``: what shows it."""

    def __init__(self, phase, msg, remedy="", evidence=None):
        super().__init__(msg)
        self.phase, self.msg, self.remedy = phase, msg, remedy
        self.evidence = evidence if evidence is not None else []

    def result(self):
        return {"phase": self.phase, "msg": "%s: %s" % (self.phase, self.msg), "evidence": self.evidence,
                "remedy": self.remedy}


def fail(module, failure, **result):
    """Fail the module with ``failure`` (plus whatever the module had to report)."""
    result.update(failure.result())
    if failure.remedy:
        result["msg"] += " Remedy: " + failure.remedy
    module.fail_json(**result)
