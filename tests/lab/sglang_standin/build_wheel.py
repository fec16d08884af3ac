"""Build the SGLang stand-in as real PEP 427 wheels, stdlib only (no setuptools needed).

    python3 build_wheel.py --out DIR [--version 0.5.11 --version 0.5.9 ...]

Default versions: 0.5.9, 0.5.10.post1, 0.5.11 (the known-bad range and the first good one,
so the collection's compatibility refusal can be exercised) and 0.5.23 (the newest in the release table: the lab's
upgrade). Also the stand-in of the CUDA compiler wheel,
nvidia-cuda-nvcc 13.0.88 (``build_nvcc``: nvidia/cu13/bin/nvcc, executable, as the real wheel lays it out). The wheels are reproducible
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
DEFAULT_VERSIONS = ("0.5.9", "0.5.10.post1", "0.5.11", "0.5.23")
# the collection's release table, put into the wheel as the stand-in's _release_table.py (releases.py reads it)
RELEASE_TABLE = os.path.join(HERE, os.pardir, os.pardir, os.pardir, "plugins", "module_utils", "container", "sglang_releases.py")
EPOCH = (1980, 1, 1, 0, 0, 0)
NAME = "sglang"


def _files(top=HERE, name=NAME):
    root = os.path.join(top, name)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                full = os.path.join(dirpath, fn)
                out.append((os.path.relpath(full, top).replace(os.sep, "/"), full))
    return out


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def pure_wheel(out_dir, top, name, version, summary, license_name, extra_dist_info=(), extra_files=()):
    """Write <name>-<version>-py3-none-any.whl of the package directory <top>/<name> (its version.py replaced by the
    version) into out_dir; return its path. Also used by the lab's other pure-Python stand-ins (tests/lab/torch_standin)."""
    os.makedirs(out_dir, exist_ok=True)
    whl = os.path.join(out_dir, "%s-%s-py3-none-any.whl" % (name, version))
    distinfo = "%s-%s.dist-info" % (name, version)
    entries = []
    for rel, full in _files(top, name):
        with open(full, "rb") as f:
            data = f.read()
        if rel == name + "/version.py":   # the version as a constant, the file's other constants (torch's cuda) kept
            kept = [ln for ln in data.decode().splitlines(True) if ln.split("=")[0].strip() in ("cuda", "git_version", "hip")]
            data = "".join(['__version__ = "%s"\n' % version] + kept).encode()
        entries.append((rel, data))
    entries += list(extra_files)
    entries.append((distinfo + "/METADATA", ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: >=3.9\n"
                                             "License: %s\n" % (name, version, summary, license_name)).encode()))
    entries.append((distinfo + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: kpro-lab-build-wheel 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    entries += [(distinfo + "/" + fn, data) for fn, data in extra_dist_info]
    entries.append((distinfo + "/top_level.txt", ("%s\n" % name).encode()))
    record = "\n".join([_record_line(p, d) for p, d in entries] + [distinfo + "/RECORD,,"]) + "\n"
    entries.append((distinfo + "/RECORD", record.encode()))
    return _write_wheel(whl, entries, {})


def build(version, out_dir):
    """Write sglang-<version>-py3-none-any.whl into out_dir; return its path."""
    with open(RELEASE_TABLE, "rb") as f:
        table = f.read()
    return pure_wheel(out_dir, HERE, NAME, version, "Lab stand-in for SGLang (kpro.gpu_serving tests); not the real SGLang",
                      "Apache-2.0", [("entry_points.txt", b"[console_scripts]\nsglang = sglang.cli:main\n")],
                      [("sglang/srt/_kpro_lab/_release_table.py", table)])


# ---- nvidia-cuda-nvcc: the real wheel's layout (nvidia/cu13/bin/nvcc, nvidia/cu13/include/fatbinary_section.h; top level
# "nvidia", a namespace directory without __init__.py; tags py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64) ----

NVCC_NAME = "nvidia-cuda-nvcc"
NVCC_VERSION = "13.0.88"
NVCC_TAGS = ("py3-none-manylinux2014_x86_64", "py3-none-manylinux_2_17_x86_64")


def _write_wheel(whl, entries, modes):
    """Reproducible zip (fixed timestamps, given order) with a RECORD; modes: {path: unix mode} (default 0644)."""
    tmp = whl + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries:
            info = zipfile.ZipInfo(path, EPOCH)
            info.external_attr = modes.get(path, 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, whl)
    return whl


def build_nvcc(out_dir):
    """Write the nvidia-cuda-nvcc 13.0.88 stand-in wheel (nvidia_cuda_nvcc/nvcc as nvidia/cu13/bin/nvcc, mode 0755)."""
    os.makedirs(out_dir, exist_ok=True)
    whl = os.path.join(out_dir, "nvidia_cuda_nvcc-%s-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl" % NVCC_VERSION)
    distinfo = "nvidia_cuda_nvcc-%s.dist-info" % NVCC_VERSION
    with open(os.path.join(HERE, "nvidia_cuda_nvcc", "nvcc"), "rb") as f:
        nvcc = f.read()
    entries = [
        ("nvidia/cu13/bin/nvcc", nvcc),
        ("nvidia/cu13/include/fatbinary_section.h", b"/* kpro-lab stand-in of nvidia-cuda-nvcc's fatbinary_section.h */\n"),
        (distinfo + "/METADATA", ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: Lab stand-in for CUDA nvcc "
                                  "(kpro.gpu_serving tests); not NVIDIA's\nRequires-Python: >=3\n" % (NVCC_NAME, NVCC_VERSION)).encode()),
        (distinfo + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: kpro-lab-build-wheel 1.0\nRoot-Is-Purelib: true\n"
                               + "".join("Tag: %s\n" % t for t in NVCC_TAGS)).encode()),
        (distinfo + "/top_level.txt", b"nvidia\n"),
    ]
    record = "\n".join([_record_line(p, d) for p, d in entries] + [distinfo + "/RECORD,,"]) + "\n"
    entries.append((distinfo + "/RECORD", record.encode()))
    return _write_wheel(whl, entries, {"nvidia/cu13/bin/nvcc": 0o755})


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
    print(build_nvcc(ns.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
