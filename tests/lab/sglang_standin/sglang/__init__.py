"""Lab stand-in for SGLang (kpro.gpu_serving tests). Not the real SGLang.

``python -m sglang.launch_server ...`` simulates the real server's startup log, GPU memory
accounting (against the lab state), HTTP endpoints and failures. See
tests/lab/sglang_standin/README.md in the kpro.gpu_serving repository.
"""

from sglang.version import __version__  # noqa: F401

_kpro_lab_standin = True
