# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.sglang_log import read_launch_header, select_launch

KPRO5 = {"model_path": "/srv/models/Qwen3.6-27B", "served_model_name": "qwen3.6-27b", "tp_size": 2, "context_length": 65536,
         "mem_fraction_static": 0.85, "max_running_requests": 16, "host": "0.0.0.0", "port": 30000}


def test_flags_in_fixed_order_and_none_false_omitted():
    opts = dict(KPRO5, trust_remote_code=True, disable_radix_cache=False, speculative_algorithm=None,
                cuda_graph_bs=[1, 2, 4], json_model_override_args={"b": 1, "a": 2}, extra=["--enable-metrics"])
    argv = su.render_flags(opts)
    assert argv == ["--model-path", "/srv/models/Qwen3.6-27B", "--served-model-name", "qwen3.6-27b", "--trust-remote-code",
                    "--tp-size", "2", "--context-length", "65536", "--mem-fraction-static", "0.85", "--max-running-requests", "16",
                    "--host", "0.0.0.0", "--port", "30000", "--cuda-graph-bs", "1", "2", "4",
                    "--json-model-override-args", '{"a":2,"b":1}', "--enable-metrics"]
    # the same dict in another key order gives the same argv
    assert su.render_flags(dict(reversed(list(opts.items())))) == argv


def test_speculative_flags():
    argv = su.render_flags(dict(KPRO5, speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
                                speculative_num_draft_tokens=4))
    i = argv.index("--speculative-algorithm")
    assert argv[i:i + 8] == ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                             "--speculative-num-draft-tokens", "4"]


@pytest.mark.parametrize("bad", [{"Tp-Size": 2}, {"extra": "--x --y"}])
def test_bad_options_are_named(bad):
    with pytest.raises(su.OptionError):
        su.render_flags(bad)


def test_api_key_never_in_argv_or_unit():
    """Finding 4: the key reaches the server through --config <0600 file> (real 0.5.11 prepare_server_args reads it),
    never as an argument; an api_key option is refused."""
    key = "sk-very-secret"
    unit = su.render_unit("sglang.service", "/opt/sglang/venv", KPRO5, env_file="/etc/kpro-gpu-serving/sglang.env",
                          secret_file="/etc/kpro-gpu-serving/sglang-secrets.yaml")
    assert key not in unit and "--api-key" not in unit and "SGLANG_API_KEY" not in unit
    exec_line = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")][0]
    assert exec_line.endswith("--config /etc/kpro-gpu-serving/sglang-secrets.yaml")
    assert su.secret_config(key).splitlines()[-1] == 'api_key: "sk-very-secret"'
    assert su.secret_config("") is None
    with pytest.raises(su.OptionError):
        su.render_flags(dict(KPRO5, api_key=key))


def test_unit_text():
    unit = su.render_unit("sglang.service", "/opt/sglang/venv", KPRO5, environment={"NCCL_P2P_DISABLE": "1"})
    lines = unit.splitlines()
    assert "Type=simple" in lines and "KillMode=control-group" in lines and "Restart=on-failure" in lines
    assert "RestartSec=30" in lines and "StartLimitIntervalSec=3600" in lines and "StartLimitBurst=3" in lines
    assert "TimeoutStopSec=120" in lines and "Environment=NCCL_P2P_DISABLE=1" in lines
    exec_line = [ln for ln in lines if ln.startswith("ExecStart=")][0]
    assert exec_line.startswith("ExecStart=/usr/local/lib/kpro-gpu-serving/sglang-launch /var/log/sglang sglang "
                                "/opt/sglang/venv/bin/python -m sglang.launch_server --model-path /srv/models/Qwen3.6-27B")
    assert unit == su.render_unit("sglang.service", "/opt/sglang/venv", dict(KPRO5), environment={"NCCL_P2P_DISABLE": "1"})


def test_systemd_quoting():
    assert su.systemd_quote("a b") == '"a b"'
    assert su.systemd_quote("50%") == "50%%"
    assert su.systemd_quote("$HOME") == "$$HOME"
    assert su.systemd_quote("${SGLANG_API_KEY}", expand=True) == "${SGLANG_API_KEY}"
    assert su.systemd_quote('{"a":1}') == '"{\\"a\\":1}"'


def test_fingerprint():
    u = su.render_unit("sglang.service", "/v", KPRO5)
    e = su.render_env({"SGLANG_API_KEY": "k1"})
    fp = su.config_fingerprint(u, e)
    assert fp == su.config_fingerprint(u, e) and len(fp) == 64
    assert fp != su.config_fingerprint(su.render_unit("sglang.service", "/v", dict(KPRO5, context_length=32768)), e)
    assert fp != su.config_fingerprint(u, su.render_env({"SGLANG_API_KEY": "k2"}))
    assert su.config_fingerprint("ab", "c") != su.config_fingerprint("a", "bc")


def test_plan_options_keep_sglang_names():
    # no renames on the way to the plan: tp_size stays tp_size
    assert su.plan_options(dict(KPRO5, speculative_algorithm="NEXTN")) == {
        "tp_size": 2, "context_length": 65536, "mem_fraction_static": 0.85, "max_running_requests": 16, "speculative_algorithm": "NEXTN"}


def test_exit_status_and_show():
    props = su.parse_show("ActiveState=failed\nSubState=failed\nExecMainStatus=9\nExecMainCode=2\nMainPID=0\n")
    assert su.exit_status(props) == 137
    assert su.exit_status({"ActiveState": "failed", "ExecMainStatus": "1", "ExecMainCode": "1"}) == 1
    assert su.exit_status({"ActiveState": "inactive", "ExecMainStatus": "-9"}) == 137
    assert su.exit_status({"ActiveState": "active", "ExecMainStatus": "0"}) is None


def test_cgroup_pids_and_fallback(tmp_path):
    cg = tmp_path / "system.slice" / "sglang.service"
    (cg / "sub").mkdir(parents=True)
    (cg / "cgroup.procs").write_text("%d\n" % os.getpid())
    (cg / "sub" / "cgroup.procs").write_text("999999999\n")
    assert su.cgroup_pids("/system.slice/sglang.service", str(tmp_path)) == [os.getpid(), 999999999]
    pids, src = su.unit_pids({"ControlGroup": "/system.slice/sglang.service"}, str(tmp_path))
    assert src == "cgroup" and pids == [os.getpid()]
    child = subprocess.Popen(["sleep", "5"])
    try:
        pids, src = su.unit_pids({"ControlGroup": "/nope", "MainPID": str(os.getpid())}, str(tmp_path))
        assert src == "mainpid" and pids[0] == os.getpid() and child.pid in pids
    finally:
        child.kill()
        child.wait()


def test_launcher_writes_a_launch_identified_log(tmp_path):
    launcher = tmp_path / "sglang-launch"
    launcher.write_text(su.LAUNCHER_SCRIPT)
    logs = tmp_path / "log"
    for lid in ("aaa1", "bbb2"):
        env = dict(os.environ, INVOCATION_ID=lid)
        r = subprocess.run(["sh", str(launcher), str(logs), "sglang", "sh", "-c", "echo started $0", lid], env=env,
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
    assert (logs / "sglang-aaa1.log").read_text() == "# kpro-launch-id: aaa1\nstarted aaa1\n"
    assert os.readlink(str(logs / "sglang.log")) == "sglang-bbb2.log"
    assert read_launch_header(str(logs / "sglang.log")) == "bbb2"
    assert select_launch((logs / "sglang.log").read_text(), "bbb2") == "started bbb2\n"
    assert select_launch((logs / "sglang.log").read_text(), "aaa1") is None
    # without systemd: an id of its own
    env = dict(os.environ)
    env.pop("INVOCATION_ID", None)
    subprocess.run(["sh", str(launcher), str(logs), "x", "true"], env=env, check=True)
    assert read_launch_header(str(logs / "x.log"))


def test_limit_nofile_rendered_and_hard_limit_parsed():
    assert "LimitNOFILE=65536\n" in su.render_unit("sglang.service", "/v", KPRO5)
    assert "LimitNOFILE=20000\n" in su.render_unit("sglang.service", "/v", KPRO5, limit_nofile=20000)
    assert "LimitNOFILE" not in su.render_unit("sglang.service", "/v", KPRO5, limit_nofile=0)
    limits = ("Limit                     Soft Limit           Hard Limit           Units     \n"
              "Max processes             513378               513378               processes \n"
              "Max open files            1024                 20000                files     \n")
    assert su.hard_nofile(limits) == 20000
    assert su.hard_nofile(limits.replace("20000 ", "unlimited")) is None
    assert su.hard_nofile("") is None


@pytest.mark.parametrize("key", ["sk-plain", 'sk-with "quotes" and \\ backslash', "sk: colon # hash", "ключ-ünïcode"])
def test_api_key_from_config_reads_what_secret_config_writes(key):
    # the gate reads the key from the server's --config file instead of a task argument
    assert su.api_key_from_config(su.secret_config(key)) == key


def test_api_key_from_config_without_a_key():
    assert su.api_key_from_config(None) is None
    assert su.api_key_from_config("# only a comment\n") is None
    assert su.api_key_from_config("api_key: sk-bare\n") == "sk-bare"
