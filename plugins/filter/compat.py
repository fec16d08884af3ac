# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter kpro.gpu_serving.sglang_compat (docs in sglang_compat.yml beside this one)."""

from __future__ import annotations

from ansible.utils.display import Display

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import compat
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure


def sglang_compat(version, architecture, tp=None, overrides=None):
    """The module's verdict (module_utils/container/compat.py verdict()) on the controller, without a module run: the preflight
    and stage 5 ask the table before anything is installed. A refusal or an invalid input is returned (action refuse,
    its phase, message, remedy and evidence) for the role's assert to report; warnings are Ansible's warnings."""
    tp = int(tp) if tp not in (None, "") else None
    try:
        out = compat.verdict(str(version), str(architecture), tp, dict(overrides or {}), warn=Display().warning)
    except Failure as e:
        # the module's failure result (failure.py), its msg as fail() reports it: the assert's fail_msg
        out = dict(e.result(), action="refuse", message=e.msg, msg=e.message())
    # msg always: the assert's fail_msg is templated whether or not the assert passes
    return dict(out, msg=out.get("msg", out["message"]), version=str(version), architecture=str(architecture), tp=tp)


class FilterModule(object):
    def filters(self):
        return {"sglang_compat": sglang_compat}
