"""Build the PyTorch stand-in as a real PEP 427 wheel, stdlib only (no setuptools needed).

    python3 build_wheel.py --out DIR [--version 2.11.0 ...]

The approach of tests/lab/sglang_standin/build_wheel.py: the wheel is reproducible (fixed timestamps and ordering),
so its sha256 is stable across rebuilds and the lab's lock files with hashes keep matching. Also a PEP 517 backend
(``build_wheel`` below; the version comes from $KPRO_LAB_TORCH_STANDIN_VERSION, default 2.11.0) for
``uv pip install DIR``.
"""

import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VERSIONS = ("2.11.0",)
NAME = "torch"


def _wheels():
    """The SGLang stand-in's reproducible wheel writer (one writer for the lab's pure-Python stand-ins)."""
    spec = importlib.util.spec_from_file_location("kpro_lab_sglang_build_wheel", os.path.join(HERE, "..", "sglang_standin", "build_wheel.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(version, out_dir):
    """Write torch-<version>-py3-none-any.whl into out_dir; return its path."""
    return _wheels().pure_wheel(out_dir, HERE, NAME, version, "Lab stand-in for PyTorch (kpro.gpu_serving tests); not the real PyTorch",
                                "BSD-3-Clause")


# ---- PEP 517 backend (pyproject.toml: build-backend = "build_wheel", backend-path = ["."]) ----

def _backend_version():
    return os.environ.get("KPRO_LAB_TORCH_STANDIN_VERSION", DEFAULT_VERSIONS[0])


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return os.path.basename(build(_backend_version(), wheel_directory))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the wheels")
    p.add_argument("--version", action="append", dest="versions", help="version to build (repeatable)")
    ns = p.parse_args(argv)
    for v in ns.versions or DEFAULT_VERSIONS:
        print(build(v, ns.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
