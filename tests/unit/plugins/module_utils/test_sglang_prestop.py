# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checks in the container before the running server is stopped (sglang_prestop)."""
from __future__ import annotations

import socket

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_prestop as sp


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "Qwen"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return str(d)


def test_the_model_directory_must_exist_and_hold_config_json(model, tmp_path):
    assert sp.model_dir_problems(None, model) == [] and sp.model_dir_problems(model, model) == []
    assert sp.model_dir_problems(None, "Qwen/Qwen3-8B") == []            # a repo id: SGLang downloads it
    assert sp.model_dir_problems(None, None) == []
    missing = str(tmp_path / "gone")
    assert "no such directory" in sp.model_dir_problems(None, missing)[0]
    assert "no such directory" in sp.model_dir_problems(missing, model)[0]
    (tmp_path / "empty").mkdir()
    assert "holds no config.json" in sp.model_dir_problems(str(tmp_path / "empty"), None)[0]
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert "the memory plan would read another model" in sp.model_dir_problems(str(other), model)[0]
    (tmp_path / "link").symlink_to(model)
    assert sp.model_dir_problems(str(tmp_path / "link"), model) == []    # the same directory


def test_host_syntax_is_checked_before_any_lookup():
    looked = []
    assert "neither an IP address nor a host name" in sp.host_problems("0.0.0.0; rm -rf /", bind=looked.append)[0]
    assert sp.host_problems("$(id)", bind=looked.append) and sp.host_problems("a b", bind=looked.append)
    assert looked == []
    assert sp.host_problems("0.0.0.0", bind=looked.append) == [] and sp.host_problems("::", bind=looked.append) == []
    assert sp.host_problems("node-1.lan", bind=looked.append) == [] and sp.host_problems(None) == []
    assert looked == ["0.0.0.0", "::", "node-1.lan"]


def test_host_that_does_not_resolve_or_bind_is_refused():
    def unknown(_host):
        raise socket.gaierror(-2, "Name or service not known")
    assert "cannot be bound in the container ([Errno -2] Name or service not known)" in sp.host_problems("nosuch", bind=unknown)[0]
    # real binds, port 0, no traffic: loopback binds; 192.0.2.1 (TEST-NET-1) is on no interface here
    assert sp.host_problems("127.0.0.1") == []
    assert "cannot be bound" in sp.host_problems("192.0.2.1")[0]


def test_environment_that_replaces_what_the_unit_needs_is_refused(tmp_path):
    v = tmp_path / "v"
    (v / "bin").mkdir(parents=True)
    UNIT_ENV = {"PATH": "%s/bin:/v/cuda/bin:/usr/bin:/bin" % v, "CUDA_HOME": "/v/cuda", "TRITON_CACHE_DIR": "/c/triton"}
    ok = {"NCCL_P2P_DISABLE": "1", "PATH": "/opt/x/bin:" + UNIT_ENV["PATH"], "CUDA_HOME": "/v/cuda", "VIRTUAL_ENV": "/v/",
          "CUDA_VISIBLE_DEVICES": "0,1"}
    assert sp.environment_problems(ok, UNIT_ENV, "/v", 2) == []
    # a directory of the unit's PATH that does not exist is needed by nothing; another CUDA toolkit that exists is a choice
    assert sp.environment_problems({"PATH": "%s/bin:/usr/bin:/bin" % v, "CUDA_HOME": str(tmp_path)}, UNIT_ENV, "/v", 2) == []
    bad = {"PATH": "/nonexistent", "CUDA_HOME": "/nonexistent/cuda", "TRITON_CACHE_DIR": "/nonexistent/t", "VIRTUAL_ENV": "/w",
           "PYTHONHOME": "/x", "CUDA_VISIBLE_DEVICES": "0"}
    found = sp.environment_problems(bad, UNIT_ENV, "/v", 2)
    assert [m.split("=")[0] for m in found] == ["environment variable " + k for k in sorted(bad)]
    assert "PATH='/nonexistent' drops the unit's own %s/bin:/usr/bin:/bin (" % v in found[2]
    assert "fewer GPUs than the server needs (2" in found[1]


def test_argv_problems_quote_sglangs_own_refusal():
    assert sp.argv_problems(None) == []
    assert sp.argv_problems("sglang serve: error: unrecognized arguments: $(id)") == [
        "the installed SGLang's own parser refuses the arguments (options and extra): sglang serve: error: unrecognized arguments: $(id)"]


def test_a_missing_model_path_is_named_when_model_dir_is_there(model, tmp_path):
    """The role passes model_dir: a model_path that is gone is named as such, not as a mismatch."""
    assert sp.model_dir_problems(model, str(tmp_path / "Gone")) == [
        "options.model_path %s: no such directory, so the server would not find its model; run the model stage (--tags model) "
        "or set sglang_server_model_dir to the downloaded model" % (tmp_path / "Gone")]
