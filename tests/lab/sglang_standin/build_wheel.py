"""Build the SGLang stand-in as real PEP 427 wheels, stdlib only (no setuptools needed).

    python3 build_wheel.py --out DIR [--version 0.5.11 --version 0.5.9 ...]

Default versions: 0.5.9, 0.5.10.post1, 0.5.11 (the known-bad range and the first good one,
so the collection's compatibility refusal can be exercised). The wheels are reproducible
(fixed timestamps and ordering), so their sha256 is stable across rebuilds and lock files
with hashes keep matching. Also a PEP 517 backend (``build_wheel`` below; the version
comes from $KPRO_LAB_SGLANG_STANDIN_VERSION, default 0.5.11) for ``uv pip install DIR``.
"""

import argparse
import base64
import hashlib
import os
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VERSIONS = ("0.5.9", "0.5.10.post1", "0.5.11")
EPOCH = (1980, 1, 1, 0, 0, 0)
NAME = "sglang"


def _files():
    root = os.path.join(HERE, NAME)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                full = os.path.join(dirpath, fn)
                out.append((os.path.relpath(full, HERE).replace(os.sep, "/"), full))
    return out


def _metadata(version):
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
            "Summary: Lab stand-in for SGLang (kpro.gpu_serving tests); not the real SGLang\n"
            "Requires-Python: >=3.9\nLicense: Apache-2.0\n" % (NAME, version))


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def build(version, out_dir):
    """Write sglang-<version>-py3-none-any.whl into out_dir; return its path."""
    os.makedirs(out_dir, exist_ok=True)
    whl = os.path.join(out_dir, "%s-%s-py3-none-any.whl" % (NAME, version))
    distinfo = "%s-%s.dist-info" % (NAME, version)
    entries = []
    for rel, full in _files():
        if rel == "sglang/version.py":
            data = ('__version__ = "%s"\n' % version).encode()
        else:
            with open(full, "rb") as f:
                data = f.read()
        entries.append((rel, data))
    entries.append((distinfo + "/METADATA", _metadata(version).encode()))
    entries.append((distinfo + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: kpro-lab-build-wheel 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    entries.append((distinfo + "/entry_points.txt", b"[console_scripts]\nsglang = sglang.cli:main\n"))
    entries.append((distinfo + "/top_level.txt", b"sglang\n"))
    record = "\n".join([_record_line(p, d) for p, d in entries] + [distinfo + "/RECORD,,"]) + "\n"
    entries.append((distinfo + "/RECORD", record.encode()))
    tmp = whl + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries:
            info = zipfile.ZipInfo(path, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, whl)
    return whl


# ---- PEP 517 backend (pyproject.toml: build-backend = "build_wheel", backend-path = ["."]) ----

def _backend_version():
    return os.environ.get("KPRO_LAB_SGLANG_STANDIN_VERSION", "0.5.11")


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
