# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a module's main() in-process: arguments in, exit_json/fail_json out as exceptions.

ansible-core >= 2.19 reads module arguments through ``ansible.module_utils.testing.patch_module_args``
(a plain ``basic._ANSIBLE_ARGS`` assignment is no longer enough); older cores get the classic patch.

    with pytest.raises(AnsibleExitJson) as e:
        run_module(gpu_facts, {"sysfs_root": root})
    result = e.value.result
"""

from __future__ import annotations

import contextlib
import json
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core < 2.19
    patch_module_args = None


class AnsibleExitJson(Exception):
    def __init__(self, result):
        super(AnsibleExitJson, self).__init__(result)
        self.result = result


class AnsibleFailJson(Exception):
    def __init__(self, result):
        super(AnsibleFailJson, self).__init__(result)
        self.result = result


def exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise AnsibleExitJson(kwargs)


def fail_json(self, msg=None, **kwargs):
    kwargs["failed"] = True
    kwargs["msg"] = msg
    raise AnsibleFailJson(kwargs)


@contextlib.contextmanager
def set_module_args(args):
    args = dict(args)
    args.setdefault("_ansible_remote_tmp", "/tmp")
    args.setdefault("_ansible_keep_remote_files", False)
    if patch_module_args is not None:
        with patch_module_args(args):
            yield
    else:
        with mock.patch.object(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args}))):
            yield


def run_module(module, args, check_mode=False):
    """Call ``module.main()`` with ``args``; raises AnsibleExitJson or AnsibleFailJson."""
    args = dict(args)
    if check_mode:
        args["_ansible_check_mode"] = True
    with set_module_args(args):
        with mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json):
            module.main()
    raise AssertionError("module.main() returned without exit_json or fail_json")
