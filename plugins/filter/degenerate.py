# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters kpro.gpu_serving.degenerate and kpro.gpu_serving.degenerate_reason (docs in the .yml files beside this one)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.degenerate import detect


def _check(text):
    if text is not None and not isinstance(text, str):
        raise AnsibleFilterError("degenerate expects a string (the completion text), got %s" % type(text).__name__)
    return detect(text)


def degenerate(text):
    """True when the completion text is degenerate (see module_utils/serve/degenerate.py for what that covers)."""
    return _check(text)["degenerate"]


def degenerate_reason(text):
    """The reason the text is degenerate, or an empty string when it is not."""
    return _check(text)["reason"] or ""


class FilterModule(object):
    def filters(self):
        return {"degenerate": degenerate, "degenerate_reason": degenerate_reason}
