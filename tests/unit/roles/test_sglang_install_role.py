# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang_install role for real, on this machine (connection local, paths under tmp), offline.

uv comes from a wheel built around the checkout's own uv binary (the real uv wheel has the same
layout: the binary in uv-X.data/scripts), SGLang from a tiny wheel that only has __version__; the
lock is made by `uv pip compile --generate-hashes` over those wheels. The role is run in check
mode, for real, again (changed=0), in check mode again (changed=0), with a changed lock (re-sync),
and with a known-bad version (refused before anything is installed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.dirname(sys.executable)
UV = os.path.join(BIN, "uv")
PLAYBOOK = os.path.join(BIN, "ansible-playbook")
SYSTEM_PYTHON = "/usr/bin/python3"
UV_VERSION = "0.13.9"

pytestmark = pytest.mark.skipif(
    not (os.access(UV, os.X_OK) and os.access(PLAYBOOK, os.X_OK) and os.access(SYSTEM_PYTHON, os.X_OK)),
    reason="needs the checkout's .venv (uv, ansible-playbook) and /usr/bin/python3")


def _wheel(out_dir, name, version, tag, files):
    di = "%s-%s.dist-info" % (name, version)
    files = dict(files)
    files[di + "/METADATA"] = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)).encode()
    files[di + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: kpgs-test\nRoot-Is-Purelib: %s\nTag: %s\n" % (
        "true" if tag.startswith("py3-none-any") else "false", tag)).encode()
    record = []
    path = os.path.join(out_dir, "%s-%s-%s.whl" % (name, version, tag))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in sorted(files.items()):
            zi = zipfile.ZipInfo(arc, (1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100755 if "/scripts/" in arc or "/bin/" in arc else 0o100644) << 16
            z.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append(di + "/RECORD,,")
        z.writestr(zipfile.ZipInfo(di + "/RECORD", (1980, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang_install")
    wheels = root / "wheels"
    wheels.mkdir()
    with open(UV, "rb") as f:
        _wheel(str(wheels), "uv", UV_VERSION, "py3-none-manylinux_2_17_x86_64", {"uv-%s.data/scripts/uv" % UV_VERSION: f.read()})
    for v in ("0.5.11", "0.5.12"):
        _wheel(str(wheels), "sglang", v, "py3-none-any", {"sglang/__init__.py": ("__version__ = %r\n" % v).encode()})
    # the runtime toolchain the lock brings (sglang_toolchain looks for it): nvcc where the CUDA 13 wheel puts it, ninja
    _wheel(str(wheels), "nvidia_cuda_nvcc", "13.0.88", "py3-none-manylinux_2_17_x86_64", {
        "nvidia/cu13/bin/nvcc": b"#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n",
        "nvidia/cu13/include/crt/host_config.h": b"", "nvidia/cu13/lib/libcudart.so.13": b""})
    _wheel(str(wheels), "ninja", "1.13.2", "py3-none-manylinux_2_17_x86_64", {"ninja-1.13.2.data/scripts/ninja": b"#!/bin/sh\n"})
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(root / "uv-cache"))
    for v in ("0.5.11", "0.5.12"):
        subprocess.run([UV, "pip", "compile", "-", "--no-index", "--find-links", str(wheels), "--python-version", "3.11",
                        "--generate-hashes", "-q", "-o", str(root / ("lock-%s.txt" % v))],
                       input=("sglang==%s\nnvidia-cuda-nvcc==13.0.88\nninja==1.13.2\n" % v).encode(), env=env, check=True)
    inv = {"all": {"hosts": {"ct": {
        "ansible_connection": "local", "ansible_python_interpreter": SYSTEM_PYTHON,
        "sglang_install_venv": str(root / "opt" / "venv"), "sglang_install_uv_venv": str(root / "opt" / "uv"),
        # kept venvs and the records that name venvs in use: under the test's directory, never this machine's /opt, /etc
        "sglang_install_venvs_dir": str(root / "opt" / "venvs"), "sglang_install_in_use_dirs": [str(root / "records")],
        "sglang_install_python": SYSTEM_PYTHON, "sglang_install_no_index": True,
        "sglang_install_find_links": [str(wheels)], "sglang_install_uv_cache_dir": str(root / "uv-cache"),
        "sglang_install_lock_file": str(root / "lock-0.5.11.txt"),
        "sglang_install_system_packages": [],
    }}}}
    (root / "inventory.json").write_text(json.dumps(inv))
    (root / "play.yml").write_text("- hosts: all\n  gather_facts: false\n  roles:\n    - kpro.gpu_serving.sglang_install\n")
    return root


def play(site, *args):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_LOCAL_TEMP=str(site / "ansible-tmp"))
    p = subprocess.run([PLAYBOOK, "-i", str(site / "inventory.json"), str(site / "play.yml")] + list(args),
                       cwd=TOP, env=env, capture_output=True, text=True, timeout=600)
    m = re.search(r"^ct\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", p.stdout, re.M)
    assert m, p.stdout + p.stderr
    return {"ok": int(m.group(1)), "changed": int(m.group(2)), "failed": int(m.group(4)), "out": p.stdout}


def test_check_install_rerun_and_changed_lock(site):
    venv = site / "opt" / "venv"
    first_check = play(site, "--check")
    assert first_check["failed"] == 0 and first_check["changed"] > 0, first_check["out"]
    assert "would be synced" in first_check["out"] and "uv %s would be installed" % UV_VERSION in first_check["out"]
    assert not (venv / "lib").exists() and not (site / "opt" / "uv" / "bin" / "uv").exists()

    install = play(site)
    assert install["failed"] == 0 and install["changed"] > 0, install["out"]
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sglang; print(sglang.__version__)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "0.5.11"
    lock = (site / "lock-0.5.11.txt").read_bytes()
    assert (venv / ".kpro-lock.sha256").read_text().strip() == hashlib.sha256(lock).hexdigest()
    assert (venv / "kpro-lock.txt").read_bytes() == lock
    # the server's CUDA_HOME: <venv>/cuda, relative links into the nvcc wheel, lib64 -> its lib (sglang_toolchain)
    assert os.readlink(str(venv / "cuda" / "lib")) == "../lib/python3.11/site-packages/nvidia/cu13/lib"
    assert os.readlink(str(venv / "cuda" / "lib64" / "libcudart.so")) == "libcudart.so.13"
    assert "Check that the container can compile what SGLang compiles" in install["out"]

    again = play(site)
    assert again["failed"] == 0 and again["changed"] == 0, again["out"]
    check_again = play(site, "--check")
    assert check_again["failed"] == 0 and check_again["changed"] == 0, check_again["out"]

    # a new pin with its lock: check mode says so without touching the venv, then the real run syncs
    newer = ["-e", "sglang_install_version=0.5.12", "-e", "sglang_install_lock_file=%s" % (site / "lock-0.5.12.txt")]
    would = play(site, "--check", *newer)
    assert would["failed"] == 0 and would["changed"] > 0 and "would be synced" in would["out"], would["out"]
    assert (venv / ".kpro-lock.sha256").read_text().strip() == hashlib.sha256(lock).hexdigest()
    upgrade = play(site, *newer)
    assert upgrade["failed"] == 0 and upgrade["changed"] >= 2, upgrade["out"]
    assert re.search(r"Sync the venv with the lock.*\n(changed|ok): \[ct\]", upgrade["out"]).group(1) == "changed"
    assert play(site, *newer)["changed"] == 0


def test_known_bad_version_is_refused_before_anything(site):
    venv = site / "opt" / "bad-venv"
    res = play(site, "-e", "sglang_install_version=0.5.9", "-e", "sglang_install_venv=%s" % venv)
    assert res["failed"] == 1 and "19070" in res["out"] and "known_bad_version" in res["out"], res["out"]
    assert not venv.exists()
    res = play(site, "-e", "sglang_install_version=0.5.10.post1", "-e", "sglang_install_venv=%s" % venv)
    assert res["failed"] == 1 and "22312" in res["out"]
    assert not venv.exists()


def test_missing_lock_names_the_regeneration_command(site):
    res = play(site, "-e", "sglang_install_version=0.5.13", "-e", "sglang_install_lock_file=")
    assert res["failed"] == 1 and re.search(r"regenerate.sh 0.5.13 3\.[0-9]+", res["out"]), res["out"]


def test_a_venv_on_another_python_is_rebuilt(site):
    """The probe reads the venv's Python; one that is not sglang_install_python's is removed and built again from the
    lock (uv would refuse to create the venv over it), the task naming why."""
    venv = site / "other-python" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nprintf '3.99\\n0.5.11\\n'\n")
    (venv / "bin" / "python").chmod(0o755)
    res = play(site, "-e", "sglang_install_venv=%s" % venv)
    out = " ".join(res["out"].split())
    assert res["failed"] == 0 and re.search(r"Remove the broken venv to rebuild it: \S+/bin/python runs Python 3\.99, "
                                            r"not 3\.[0-9]+", out), res["out"]
    assert _imports(venv) == "0.5.11"


def _imports(venv):
    return subprocess.run([str(venv / "bin" / "python"), "-c", "import sglang; print(sglang.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("damage", ["missing", "dangling", "no_cfg"])
def test_a_broken_venv_is_rebuilt(site, damage):
    """A synced venv whose python is gone (removed, or a link to nothing) or whose pyvenv.cfg is gone is rebuilt and
    synced again (issue 30: uv said "virtual environment already exists"); the next run changes nothing."""
    venv = site / ("broken-" + damage) / "venv"
    extra = ["-e", "sglang_install_venv=%s" % venv]
    first = play(site, *extra)
    assert first["failed"] == 0 and _imports(venv) == "0.5.11", first["out"]
    if damage == "no_cfg":
        (venv / "pyvenv.cfg").unlink()
    else:
        (venv / "bin" / "python").unlink()
        if damage == "dangling":
            (venv / "bin" / "python").symlink_to("/nonexistent/python3")
    res = play(site, *extra)
    assert res["failed"] == 0 and "Remove the broken venv to rebuild it" in res["out"], res["out"]
    assert re.search(r"Sync the venv with the lock.*\n(changed|ok): \[ct\]", res["out"]), res["out"]
    assert _imports(venv) == "0.5.11" and (venv / "pyvenv.cfg").is_file()
    assert play(site, *extra)["changed"] == 0


def test_pruning_never_removes_a_kept_venv_in_use(site):
    """keep_venvs=1 prunes every older copy, except the recorded good deployment's and the one a unit runs."""
    venvs, state, units = site / "kept", site / "state", site / "units"
    for d in (state, units):
        d.mkdir(exist_ok=True)
    (state / "sglang-deployment.json").write_text(json.dumps({"good": {"lock_sha256": "a" * 64}}, indent=1))
    (units / "sglang.service").write_text("[Service]\nExecStart=/usr/local/bin/x %s/%s/bin/python -m sglang.launch_server\n"
                                          % (venvs, "b" * 16))
    for name in ("a" * 16, "b" * 16, "c" * 16):
        (venvs / name).mkdir(parents=True, exist_ok=True)
    common = ["-e", json.dumps({"sglang_install_venvs_dir": str(venvs), "sglang_install_keep_venvs": 1,
                                "sglang_install_in_use_dirs": [str(state), str(units), str(site / "missing")]})]
    for v in ("0.5.12", "0.5.11"):   # the second one syncs another lock over a stamped venv: keep, then prune
        res = play(site, *common, "-e", "sglang_install_version=%s" % v, "-e", "sglang_install_lock_file=%s" % (site / ("lock-%s.txt" % v)))
        assert res["failed"] == 0, res["out"]
    left = sorted(os.listdir(str(venvs)))
    assert "a" * 16 in left and "b" * 16 in left and "c" * 16 not in left, left
