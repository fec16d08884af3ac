"""Issue 12: every bad serve input of docs/bad-inputs/serve.md, against a serving server in CT 129.

Each row runs the serve stage with one bad setting and asserts the message, that the run failed before the server was
touched (same MainPID and InvocationID, the unit, launcher, environment, secrets and state files byte for byte the same),
and that the server answered /health throughout (a poller in CT 129, ended by its PID).
"""

from __future__ import annotations

import json
import time

import pytest

from test_gpu_host_stage import play, recap
from test_serve_safety import ask, ct, serving, unit_props  # noqa: F401  pylint: disable=unused-import

OPTIONS = {"model_path": "/srv/models/Qwen3.6-27B", "served_model_name": "qwen3.6-27b", "tp_size": 2, "context_length": 65536,
           "mem_fraction_static": 0.85, "max_running_requests": 16, "host": "0.0.0.0", "port": 30000}
OTHER_PORT = 30077
FILES = ["/etc/systemd/system/sglang.service", "/etc/kpro-gpu-serving/sglang.env", "/etc/kpro-gpu-serving/sglang-secrets.yaml",
         "/usr/local/lib/kpro-gpu-serving/sglang-launch", "/var/lib/kpro-gpu-serving/sglang.json"]
POLLER = r"""
import os, time, urllib.request
end = time.time() + 900
while time.time() < end and not os.path.exists("/run/kpro-poll.stop"):
    try:
        with urllib.request.urlopen("http://127.0.0.1:30000/health", timeout=5) as r:
            s = r.status
    except Exception as e:
        s = getattr(e, "code", None) or type(e).__name__
    with open("/run/kpro-poll.out", "a") as f:
        f.write("%s\n" % s)
    time.sleep(0.5)
"""


def opts(**kw):
    o = dict(OPTIONS)
    o.update(kw)
    return {"sglang_server_options": o}


# (id, extra vars, message in the output); the table of docs/bad-inputs/serve.md
ROWS = [
    ("unknown option", opts(mem_fraction_statc=0.8),
     "option mem_fraction_statc: the installed SGLang has no --mem-fraction-statc (did you mean mem_fraction_static?)"),
    ("tp_size above the GPUs", opts(tp_size=4), "needs 4 GPUs (tp_size x pp_size x dp_size from base_gpu_id) but NVML sees 2"),
    ("mem_fraction_static 1.0", opts(mem_fraction_static=1.0), "option mem_fraction_static=1.0 is out of range"),
    ("mem_fraction_static 0", opts(mem_fraction_static=0), "option mem_fraction_static=0 is out of range"),
    ("port 70000", opts(port=70000), "option port=70000 is out of range"),
    ("port 0", opts(port=0), "option port=0 is out of range"),
    ("port taken", opts(port=OTHER_PORT), "port %d is taken by another process" % OTHER_PORT),
    ("newline in an option", opts(served_model_name="qwen\nExecStartPre=/bin/false"),
     "option served_model_name: the value contains the control character"),
    ("newline in the environment", {"sglang_server_environment": {"NCCL_DEBUG": "WARN\nExecStartPre=/bin/false"}},
     "environment variable NCCL_DEBUG: the value contains the control character"),
    ("probe regex", {"sglang_server_probe": {"prompt": "The capital city of France is", "max_tokens": 16, "regex": "(?i)par(is"}},
     "sglang_server_probe.regex"),
    ("api_key in the options", opts(api_key="k"), "options.api_key: pass the API key as the module's api_key"),
    ("config with an API key", opts(config="/etc/sglang.yaml"), "options.config: SGLang takes one --config file"),
    # issue 30: what can be checked in the container is checked before the stop (sglang_prestop)
    ("model directory missing", opts(model_path="/srv/models/Gone"), "options.model_path /srv/models/Gone: no such directory"),
    ("host with shell syntax", opts(host="0.0.0.0; rm -rf /"), "option host='0.0.0.0; rm -rf /' is neither an IP address nor a host name"),
    ("PATH replaced", {"sglang_server_environment": {"PATH": "/nonexistent"}},
     "environment variable PATH='/nonexistent' drops the unit's own "),
    ("extra with shell syntax", opts(extra=["--foo; reboot"]),
     "the installed SGLang's own parser refuses the arguments (options and extra): sglang serve: error: unrecognized arguments: --foo; reboot"),
    ("unknown extra flag", opts(extra=["--no-such-flag", "$(id)"]), "sglang serve: error: unrecognized arguments: --no-such-flag $(id)"),
]


def digest(lab):
    return ct(lab, "sha256sum", *FILES, check=False).stdout


@pytest.fixture(scope="module")
def guarded(serving, tmp_path_factory):
    lab = serving
    ct(lab, "rm", "-f", "/run/kpro-poll.stop", "/run/kpro-poll.out")
    poller = ct(lab, "sh", "-c", "setsid python3 -c '%s' >/dev/null 2>&1 </dev/null & echo $!" % POLLER.replace("'", "'\"'\"'")).stdout.strip()
    other = ct(lab, "sh", "-c", "setsid python3 -m http.server %d --bind 127.0.0.1 >/dev/null 2>&1 </dev/null & echo $!" % OTHER_PORT).stdout.strip()
    yield lab, tmp_path_factory.mktemp("vars")
    ct(lab, "touch", "/run/kpro-poll.stop")
    time.sleep(1.5)
    for pid in (poller, other):     # only the two processes this fixture started, by PID
        ct(lab, "kill", pid, check=False)
    out = ct(lab, "cat", "/run/kpro-poll.out", check=False).stdout.split()
    assert out and set(out) == {"200"}, "the server did not answer throughout: %s" % sorted(set(out))


@pytest.mark.parametrize("name,extra,message", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_fails_before_the_server_is_touched(guarded, name, extra, message):
    lab, tmp = guarded
    before, files = unit_props(lab), digest(lab)
    path = tmp / ("%s.json" % name.replace(" ", "_"))
    path.write_text(json.dumps(extra))
    t0 = time.time()
    r = play("--tags", "serve", "--skip-tags", "preflight", "-e", "@%s" % path)
    print("%s: %.1fs" % (name, time.time() - t0))
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-3000:]
    assert message in r.stdout.replace("\\n", "\n"), r.stdout[-3000:]
    after = unit_props(lab)
    assert (after["MainPID"], after["InvocationID"], after["NRestarts"]) == (before["MainPID"], before["InvocationID"], before["NRestarts"])
    assert digest(lab) == files
    assert ask(lab)[:2] == ["200", "200"]
