"""The container, model and serve stages (tags container, model, serve) against the lab's container 129.

In file order: a known-bad SGLang version is refused before anything is installed; a userspace
version other than the host's is `version_mismatch`; the converge (at -vvv, whose output must not
hold a secret) gives NVML in the CT the host's version and both GPUs, a venv importing the pinned
SGLang and a verified model; a second run changes nothing and fetches no file from the hub.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from conftest import RUN, labctl
from test_gpu_host_stage import play, recap

HUB = "http://10.213.5.1:18602"
VENV_PY = "/opt/sglang/venv/bin/python"
MODEL = "/srv/models/Qwen3.6-27B"


@pytest.fixture(scope="module")
def host_done(lab):
    """A fresh node with the host stages done (driver, passthrough), shared by this module."""
    labctl("reset")
    out = play("--tags", "gpu_host,lxc_gpu", "-vvv")
    assert recap(out.stdout)["failed"] == 0, out.stdout[-3000:]
    yield out.stdout
    labctl("reset")  # the lab tests after these expect a node as booted


def ct(lab, *argv, check=True):
    return lab.exec("pct", "exec", "129", "--", *argv, check=check)


def hub_log(clear=False):
    with urllib.request.urlopen(HUB + "/_log" + ("?clear=true" if clear else ""), timeout=10) as r:
        return json.loads(r.read().decode())


def secrets():
    with open(os.path.join(RUN, "pve-credentials.json")) as f:
        pve = json.load(f)
    with open(os.path.join(RUN, "hub-token")) as f:
        hub = f.read().strip()
    with open(os.path.join(RUN, "sglang-api-key")) as f:
        api_key = f.read().strip()
    return {"pve token secret": pve["token_secret"], "pve root@pam password": pve["password"], "hf token": hub,
            "sglang api key": api_key}


def test_known_bad_sglang_refused_before_install(lab, host_done):
    r = play("--tags", "container", "-e", "sglang_install_version=0.5.9")
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-3000:]
    assert "known_bad_version" in r.stdout and "19070" in r.stdout, r.stdout[-3000:]
    # refused before anything of stage 5: no uv, no venv
    assert ct(lab, "ls", "/opt/sglang", check=False).returncode != 0


def test_userspace_other_than_the_host_is_version_mismatch(lab, host_done):
    r = play("--tags", "container", "-e", "gpu_container_driver_version=580.126.08")
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-3000:]
    assert "version_mismatch" in r.stdout and "580.126.08" in r.stdout and "580.126.09" in r.stdout, r.stdout[-3000:]


def test_converge_then_noop_without_hub_downloads(lab, host_done):
    first = play("--tags", "container,model", "-vvv")
    rc = recap(first.stdout, "ct129")
    assert rc["failed"] == 0 and rc["changed"] >= 1, first.stdout[-4000:]
    # no secret in any -vvv output (host stages: API token, root@pam; model: the hub token)
    for name, value in secrets().items():
        assert value and value not in first.stdout and value not in host_done, "%s printed" % name

    smi = ct(lab, "nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader").stdout.split("\n")
    assert [ln for ln in smi if ln] == ["580.126.09, NVIDIA RTX A6000"] * 2
    ver = ct(lab, VENV_PY, "-c", "import sglang; print(sglang.__version__)").stdout.strip()
    assert ver == "0.5.11"
    cfg = json.loads(ct(lab, "cat", MODEL + "/config.json").stdout)
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]

    hub_log(clear=True)
    again = play("--tags", "container,model")
    assert recap(again.stdout, "ct129")["changed"] == 0, again.stdout[-4000:]
    # the preflight's token check (GET /api/whoami-v2, a few hundred bytes) is the one hub request a re-run makes
    log = [e for e in hub_log() if not e.get("path", "").startswith("/api/whoami-v2")]
    assert not [e for e in log if "/resolve/" in e.get("path", "") or "/_cdn/" in e.get("path", "")], log
    assert sum(int(e.get("bytes") or 0) for e in log) == 0

    # the model verifies: every file's checksum against the hub's listing, nothing to fetch
    chk = play("--tags", "model", "--check", "-e", "model_revision=main")
    assert recap(chk.stdout, "ct129")["changed"] == 0 and "nothing fetched" in chk.stdout, chk.stdout[-3000:]


def test_serve_passes_the_gate_then_noop_without_restart(lab, host_done):
    """Stage 7 on top (issue 6): the good configuration passes the gate and prints the summary; the
    -vvv output holds no secret (the API key included); a re-run changes nothing and keeps the launch."""
    first = play("--tags", "serve", "-vvv")
    assert recap(first.stdout, "ct129")["failed"] == 0, first.stdout[-4000:]
    assert "sglang.service ready in" in first.stdout and "endpoint: http://127.0.0.1:30000/v1" in first.stdout
    for name, value in secrets().items():
        assert value not in first.stdout, "%s printed" % name
    unit = ct(lab, "systemctl", "show", "-p", "InvocationID", "-p", "MainPID", "sglang.service").stdout
    again = play("--tags", "serve")
    assert recap(again.stdout, "ct129")["changed"] == 0, again.stdout[-4000:]
    assert "unchanged" in again.stdout
    # the converge's arguments are one templated dict: ansible.cfg's inject_facts_as_vars=False keeps ansible-core from
    # warning about it on every run (as the driver's look and install in the host stages, host_done)
    for out in (again.stdout, host_done):
        assert "Using a template for task args is unsafe" not in out, out[-3000:]
    assert ct(lab, "systemctl", "show", "-p", "InvocationID", "-p", "MainPID", "sglang.service").stdout == unit
