#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_toolchain
short_description: Check that the container can compile what SGLang compiles at its first forward pass
version_added: "0.2.0"
description:
  - SGLang 0.5.11 compiles kernels when its first batch runs, after the model is loaded - Triton's C launcher with a C
    compiler and the Python headers, FlashInfer's attention and sampling kernels with nvcc, g++ and ninja. A container
    without them fails then, after the download and the load. This module looks for each piece the way those libraries
    do, with the environment the server's unit will have, and fails with phase V(runtime_toolchain_missing), naming the
    missing pieces, the source line of each rule and what provides it.
  - It keeps C(<venv>/cuda), the server's C(CUDA_HOME) - relative links C(bin), C(include), C(lib) and C(lib64) into the
    C(nvidia-cuda-nvcc) wheel's toolkit in the venv (the wheel has no C(lib64), which FlashInfer links against).
  - Check mode reports the links it would make and looks only when the venv exists; a piece that a package of
    O(would_install) provides is reported, not refused.
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
options:
  venv:
    description: SGLang's venv (synced with a lock that holds C(nvidia-cuda-nvcc)).
    type: path
    required: true
  environment:
    description: The server's own further environment (the serve stage's C(sglang_server_environment)), over the
      runtime environment (PATH with the venv's tools, C(CUDA_HOME)); C(CC) or C(CUDA_HOME) set there are honoured.
    type: dict
    default: {}
  cuda_major:
    description: The CUDA major torch is built for; nvcc of another major is refused. Empty - read from the venv's
      C(torch/version.py) when it exists, else not compared.
    type: str
    default: ""
  would_install:
    description: In check mode, the Debian packages the run installs before the server starts (the container stage's
      listing); a piece one of them provides is reported as installed by the run, not refused.
    type: list
    elements: str
    default: []
seealso:
  - module: kpro.gpu_serving.sglang_service
"""

EXAMPLES = r"""
- name: Check the runtime toolchain before the model download
  kpro.gpu_serving.sglang_toolchain:
    venv: /opt/sglang/venv
"""

RETURN = r"""
found:
  description: Where each piece was found (C(c_compiler), C(python_headers), C(cuda_home), C(nvcc) its release,
    C(host_cxx), C(ninja)); null for a missing one.
  returned: when the venv exists
  type: dict
links:
  description: The links of C(<venv>/cuda) made, replaced or removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
would_provide:
  description: Check mode - the missing pieces the run provides first (a package of O(would_install), the links).
  returned: in check mode, when the venv exists
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import toolchain
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure, fail


def main():
    module = AnsibleModule(argument_spec=dict(venv=dict(type="path", required=True), environment=dict(type="dict", default={}),
                                              cuda_major=dict(type="str", default=""),
                                              would_install=dict(type="list", elements="str", default=[])), supports_check_mode=True)
    venv, result = module.params["venv"], dict(changed=False, links=[])
    python = os.path.join(venv, "bin", "python")
    try:
        if module.check_mode and not os.path.exists(python):
            module.exit_json(msg="%s does not exist yet: looked at after the sync" % venv, **result)
        toolkit = toolchain.toolkit_dir(venv)
        changes = toolchain.link_changes(venv, toolkit) if toolkit else []
        result.update(changed=bool(changes), links=["%s -> %s" % c for c in changes])
        if changes and not module.check_mode:
            toolchain.make_links(changes)
        env = dict(toolchain.runtime_environment(venv), LC_ALL="C.UTF-8", HOME=os.environ.get("HOME", "/root"))
        env.update((k, str(v)) for k, v in module.params["environment"].items())
        found = toolchain.look(python, env, module.run_command)
        result["found"] = found
        major = module.params["cuda_major"] or toolchain.torch_cuda_major(venv)
        problems = toolchain.problems(found, major)
        if module.check_mode:
            result["would_provide"], problems = toolchain.provided(problems, module.params["would_install"], bool(changes))
        refused = toolchain.refusal(problems, venv, toolkit)
        if refused:
            raise refused
    except Failure as e:
        fail(module, e, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
