# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 12: validation before the old server is touched, systemd quoting of hostile values, the API key's path,
the restart policy, log redaction."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.normpath(os.path.join(HERE, "..", "..", "..", "lab", "sglang_standin"))
KPRO5 = {"model_path": "/srv/models/Qwen3.6-27B", "served_model_name": "qwen3.6-27b", "tp_size": 2, "context_length": 65536,
         "mem_fraction_static": 0.85, "max_running_requests": 16, "host": "0.0.0.0", "port": 30000}
HOSTILE = ['50% off', 'a$b ${HOME} $$', 'quote " and \' both', 'back\\slash', 'semi ; colon', ';', 'tab-free unicode é ✓',
           '%n%i%%', '{x}']
NEEDS_VERIFY = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze (Debian package systemd) missing")


def _verify(tmp_path, unit_text):
    path = tmp_path / "sglang.service"
    path.write_text(unit_text)
    res = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False)
    noise = [ln for ln in (res.stdout + res.stderr).splitlines() if str(path) in ln or "sglang.service" in ln]
    return res.returncode, noise


def _unit(options=None, environment=None, **kw):
    return su.render_unit("sglang.service", "/usr", dict(options or KPRO5), launcher="/bin/true", environment=environment,
                          env_file="/dev/null", **kw)


@NEEDS_VERIFY
def test_hostile_but_printable_values_pass_systemd_analyze_verify(tmp_path):
    env = dict(("V%d" % i, v) for i, v in enumerate(HOSTILE))
    opts = dict(KPRO5, chat_template=HOSTILE, served_model_name="a%b$c")
    text = _unit(opts, env)
    rc, noise = _verify(tmp_path, text)
    assert rc == 0 and not noise, noise
    assert 'Environment="V0=50%% off"' in text
    assert "$$" in [ln for ln in text.splitlines() if ln.startswith("ExecStart=")][0]    # no $ expansion of option values
    assert '"V1=a$b ${HOME} $$"' in text                                                    # Environment= does not expand $
    assert " \\; " in text                                                                  # a lone ; is not a separator


@NEEDS_VERIFY
def test_verify_sees_an_injected_line(tmp_path):
    """The check above is not vacuous: what a raw newline would have made of the unit is reported."""
    rc, noise = _verify(tmp_path, _unit().replace("KillMode=", "Environment=\"A=x\nBogus=1\"\nKillMode="))
    assert noise


@pytest.mark.parametrize("bad", ["x\nExecStartPre=/bin/sh -c evil", "x\rY", "x\x00y", "x\x1b[2J"])
def test_control_characters_refused_naming_the_variable(tmp_path, bad):
    with pytest.raises(su.OptionError, match="environment variable NCCL_DEBUG"):
        _unit(environment={"NCCL_DEBUG": bad})
    with pytest.raises(su.OptionError, match="option chat_template"):
        _unit(dict(KPRO5, chat_template=bad))
    with pytest.raises(su.OptionError, match="option extra"):
        _unit(dict(KPRO5, extra=["--x", bad]))
    with pytest.raises(su.OptionError, match="environment variable K"):
        su.render_env({"K": bad})


def test_restart_policy_rendered():
    lines = _unit(restart={"restart_sec": 2, "start_limit_burst": 5}).splitlines()
    unit_sec = lines[lines.index("[Unit]"):lines.index("[Service]")]
    assert "StartLimitBurst=5" in unit_sec and "StartLimitIntervalSec=3600" in unit_sec
    assert "Restart=on-failure" in lines and "RestartSec=2" in lines
    assert su.nrestarts({"NRestarts": "3"}) == 3 and su.nrestarts({}) is None


def test_ranges():
    bad = dict(su.range_problems(dict(KPRO5, mem_fraction_static=1.0, port=70000, tp_size=0)))
    assert set(bad) == {"mem_fraction_static", "port", "tp_size"}
    assert "between 0 and 1" in bad["mem_fraction_static"] and "1 to 65535" in bad["port"]
    assert su.range_problems(dict(KPRO5, mem_fraction_static=0.0))[0][0] == "mem_fraction_static"
    assert su.range_problems(dict(KPRO5, port="x"))[0][1].startswith("port='x' is not a number")
    assert su.range_problems(KPRO5) == []


def test_unknown_options_against_flags():
    flags = ["--model-path", "--tp-size", "--tensor-parallel-size", "--port", "--mem-fraction-static", "--context-length",
             "--max-running-requests", "--host", "--served-model-name"]
    out = su.unknown_options(dict(KPRO5, mem_fraction_statc=0.8, extra=["--x"], disable_foo=False), flags)
    assert out == [("mem_fraction_statc", "--mem-fraction-statc", ["mem_fraction_static"])]


def test_gpus_needed():
    assert su.gpus_needed(KPRO5) == 2
    assert su.gpus_needed(dict(KPRO5, tp_size=4, base_gpu_id=1)) == 5
    assert su.gpus_needed(dict(KPRO5, dp_size=2, enable_dp_attention=True)) == 2


def test_listening_ports_exclude_ours():
    text = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n"
            "   1: 0100007F:1F90 0100007F:D2B4 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n")
    ls = su.parse_proc_net_tcp(text)
    assert ls == [(30000, 111)]
    assert su.port_taken(30000, ls, set()) and not su.port_taken(30000, ls, {111}) and not su.port_taken(8080, ls, set())


def test_socket_inodes_of_our_process():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        ls = su.parse_proc_net_tcp(open("/proc/net/tcp").read())
        mine = su.socket_inodes([os.getpid()])
        assert su.port_taken(port, ls, set()) and not su.port_taken(port, ls, mine)
    finally:
        s.close()


def test_launcher_redacts_and_keeps_exit_status(tmp_path):
    launcher = tmp_path / "launch"
    launcher.write_text(su.LAUNCHER_SCRIPT)
    launcher.chmod(0o755)
    code = ("import os, sys\n"
            "print(\"server_args=ServerArgs(port=1, api_key='sk-123', admin_api_key=None)\", flush=True)\n"
            # 0.5.19+ prints a dict (engine.py:1098 of the 0.5.19 wheel), the keys in it too
            "print(str(dict(server_args={'port': 1, 'api_key': 'sk-124', 'admin_api_key': 'sk-125'}))[1:-1]"
            ".replace(\"'server_args': \", 'server_args='), flush=True)\n"
            "print('curl -H \"Authorization: Bearer sk-456\"', flush=True)\n"
            "sys.stderr.write('--api-key sk-789 given\\n'); sys.stderr.flush()\n"
            "os.kill(os.getpid(), 9)\n")
    env = dict(os.environ, INVOCATION_ID="L1")
    rc = subprocess.run([str(launcher), str(tmp_path / "log"), "sglang", sys.executable, "-c", code], env=env, check=False).returncode
    assert rc in (137, -9)
    log = tmp_path / "log" / "sglang-L1.log"
    for _attempt in range(50):
        if log.exists() and "given" in log.read_text():
            break
        import time
        time.sleep(0.05)
    text = log.read_text()
    assert text.startswith("# kpro-launch-id: L1\n")
    assert "api_key='<redacted>'" in text and "Bearer <redacted>" in text and "--api-key <redacted>" in text
    assert "server_args={'port': 1, 'api_key': '<redacted>', 'admin_api_key': '<redacted>'}" in text
    assert "sk-" not in text
    assert not [p for p in os.listdir(tmp_path / "log") if p.endswith(".fifo")]


def _standin(code, *argv):
    env = dict(os.environ, PYTHONPATH=STANDIN, KPRO_LAB_SGLANG_STANDIN_VERSION="0.5.11")
    return subprocess.run([sys.executable, "-c", code] + list(argv), env=env, capture_output=True, text=True, check=False)


def test_flags_probe_on_the_standin_lists_the_real_0_5_11_flags():
    import json
    res = _standin(su.FLAGS_PROBE, *su.render_flags({"model_path": "/m", "tp_size": 2, "context_length": "64k", "host": "0.0.0.0"}))
    assert res.returncode == 0 and su.parse_error(res.returncode, res.stderr) is None, res.stderr
    flags = json.loads(res.stdout)
    assert len(flags) > 370
    for f in ("--port", "--tp-size", "--tensor-parallel-size", "--mem-fraction-static", "--config", "--api-key",
              "--enable-metrics", "--mamba-scheduler-strategy"):
        assert f in flags
    assert "--foo-bar" not in flags


@pytest.mark.parametrize("extra,error", [
    (["--foo; reboot"], "sglang serve: error: unrecognized arguments: --foo; reboot"),
    (["$(id)"], "sglang serve: error: unrecognized arguments: $(id)"),
    (["--no-such-flag"], "sglang serve: error: unrecognized arguments: --no-such-flag"),
    (["--port", "x"], "sglang serve: error: argument --port: invalid int value: 'x'"),
    (["--kv-cache-dtype", "fp9"], "sglang serve: error: argument --kv-cache-dtype: invalid choice: 'fp9'"),
])
def test_flags_probe_parses_the_whole_argv_like_0_5_11(extra, error):
    """The probe lists the flags and then parses the argument vector as 0.5.11's prepare_server_args (parser "sglang
    serve", server_args.py:7276): argparse's own refusal, exit status 2, the flags line still printed first."""
    import json
    res = _standin(su.FLAGS_PROBE, *su.render_flags({"model_path": "/m", "extra": extra}))
    assert res.returncode == 2 and json.loads(res.stdout.splitlines()[0])
    assert su.parse_error(res.returncode, res.stderr).startswith(error)
    assert su.parse_error(0, "") is None


def test_flags_probe_merges_a_config_file_like_0_5_11(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_path: /m\n")
    assert _standin(su.FLAGS_PROBE, "--config", str(cfg)).returncode == 0
    assert "required: --model-path" in _standin(su.FLAGS_PROBE, "--port", "1").stderr


def test_standin_reads_the_api_key_from_config_like_0_5_11(tmp_path):
    cfg = tmp_path / "secrets.yaml"
    cfg.write_text(su.secret_config('k"ey%$'))
    res = _standin("from sglang.srt._kpro_lab.args import merge_config\n"
                   "print(merge_config(['--model-path', 'm', '--config', %r]))" % str(cfg))
    assert res.stdout.strip() == repr(["--api-key", 'k"ey%$', "--model-path", "m"])
