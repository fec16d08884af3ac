# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_driver's checks before changes: version format, state=fetched (present, checksum, release)."""

from __future__ import annotations

import hashlib
import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.modules import nvidia_driver as mod

from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module


def installer(tmp_path, version="580.126.09", name=None):
    """A makeself-like script: --info prints the Identification line NVIDIA's label gives; anything else marks a run."""
    path = tmp_path / (name or "NVIDIA-Linux-x86_64-%s.run" % version)
    path.write_text("#!/bin/sh\nif [ \"$1\" = --info ]; then\n"
                    "echo 'Identification: NVIDIA Accelerated Graphics Driver for Linux-x86_64 %s'\nexit 0\nfi\n"
                    "touch %s\n" % (version, tmp_path / "INSTALLER_RAN"))
    return path, "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def result(a, check_mode=False):
    with pytest.raises((AnsibleExitJson, AnsibleFailJson)) as e:
        run_module(mod, a, check_mode=check_mode)
    return e.value.result, isinstance(e.value, AnsibleFailJson)


@pytest.mark.parametrize("version", ["../x", "580.126.9", "580", "v580.126.09", "580.126.09.1", "580.126.09 ", "",
                                     "5800.12.01", "580.1.01"])
def test_bad_version_fails_before_anything_runs(tmp_path, monkeypatch, version):
    ran = []
    monkeypatch.setattr(mod.AnsibleModule, "run_command", lambda self, *a, **k: ran.append(a) or (0, "", ""))
    for state in ("present", "fetched"):
        r, failed = result(dict(version=version, state=state, download_dir=str(tmp_path)))
        assert failed and r["failure"] == "bad_version" and ran == [], r
        assert "580.126.09" in r["msg"]


def test_fetched_verifies_and_changes_nothing(tmp_path):
    path, digest = installer(tmp_path)
    before = sorted(os.listdir(str(tmp_path)))
    r, failed = result(dict(version="580.126.09", state="fetched", installer_path=str(path), installer_checksum=digest))
    assert not failed and not r["changed"] and r["installer_path"] == str(path), r
    assert sorted(os.listdir(str(tmp_path))) == before  # the installer did not run


def test_fetched_wrong_checksum(tmp_path):
    path, dummy = installer(tmp_path)
    r, failed = result(dict(version="580.126.09", state="fetched", installer_path=str(path),
                            installer_checksum="sha256:" + "0" * 64))
    assert failed and r["failure"] == "checksum_mismatch" and "expected " + "0" * 64 in r["msg"]


@pytest.mark.parametrize("checksum", ["md5:0123", "sha256:xyz", "1234"])
def test_fetched_bad_checksum_format(tmp_path, checksum):
    path, dummy = installer(tmp_path)
    r, failed = result(dict(version="580.126.09", state="fetched", installer_path=str(path), installer_checksum=checksum))
    assert failed and r["failure"] == "bad_checksum"


def test_fetched_installer_of_another_release(tmp_path):
    # 580.126 passes the format (two-part versions are real: 550.142) but the file installs 580.126.09
    path, digest = installer(tmp_path, "580.126.09")
    r, failed = result(dict(version="580.126", state="fetched", installer_path=str(path), installer_checksum=digest))
    assert failed and r["failure"] == "installer_version" and "driver 580.126.09, not of the requested 580.126" in r["msg"]
    assert not (tmp_path / "INSTALLER_RAN").exists()


def test_fetched_explicit_path_missing_without_url(tmp_path):
    r, failed = result(dict(version="580.126.09", state="fetched", installer_path=str(tmp_path / "nope.run"),
                            installer_checksum="sha256:" + "0" * 64))
    assert failed and r["failure"] == "installer_missing" and "nope.run does not exist" in r["msg"]


def test_fetched_download_needs_checksum(tmp_path):
    r, failed = result(dict(version="580.126.09", state="fetched", download_dir=str(tmp_path),
                            installer_url="http://127.0.0.1:9/x.run"))
    assert failed and r["failure"] == "checksum_mismatch" and "installer_checksum is required" in r["msg"]


# --- the failure contract: RV(phase) is the vocabulary's name (failure.py); RV(failure) keeps the old one

@pytest.mark.parametrize("phase", ["bad_version", "bad_checksum", "checksum_mismatch", "installer_missing", "installer_version"])
def test_phase_of_an_installer_failure(tmp_path, phase):
    path, digest = installer(tmp_path)
    a = dict(version="580.126.09", state="fetched", installer_path=str(path), installer_checksum=digest)
    a.update({"bad_version": dict(version="580"), "bad_checksum": dict(installer_checksum="md5:0123"),
              "checksum_mismatch": dict(installer_checksum="sha256:" + "0" * 64),
              "installer_missing": dict(installer_path=str(tmp_path / "nope.run")),
              "installer_version": dict(version="580.126")}[phase])
    r, failed = result(a)
    assert failed and r["phase"] == phase == r["failure"] and r["msg"].startswith(phase + ": ") and "steps" in r
