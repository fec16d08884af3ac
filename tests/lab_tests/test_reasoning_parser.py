"""Issue 27 in the lab: the reasoning parser of a thinking model.

The role's default for Qwen3.6 (sglang_install_model_architecture Qwen3_5ForConditionalGeneration, through
sglang_server_model_parsers) runs --reasoning-parser qwen3 and --tool-call-parser qwen3_coder. The stand-in's Qwen3.6
thinks as the real one does for a chat request without ``enable_thinking: false`` (the thinking, ``</think>``, the
answer; tests/lab/sglang_standin/sglang/srt/_kpro_lab/reasoning.py), and its parser separates it as SGLang 0.5.11's does.
The gate's ``plain_chat`` check asks as an ordinary client does (no chat_template_kwargs). Without the parser
(``sglang_server_options: {reasoning_parser: null}``) the thinking comes back in ``content``: the gate fails with
``wrong_answer`` and a remedy naming ``--reasoning-parser qwen3`` (and the role rolls back to the recorded deployment);
the default then passes again. From the converged lab (test_serve_safety's fixture).
"""

from __future__ import annotations

import json
import re
import time

from test_gpu_host_stage import play, recap
from test_serve_safety import SECRETS, ask, ct, serving, unit_props  # noqa: F401  pylint: disable=unused-import

SERVE = ("--tags", "serve", "--skip-tags", "preflight")
RECORD = "/var/lib/kpro-gpu-serving/sglang-deployment.json"
# Run in CT 129: a chat request as an ordinary client sends it (no chat_template_kwargs), the key from the secrets file
CHAT = r"""
import json, re, urllib.request
key = json.loads(re.search(r'api_key: (".*")', open("%s").read()).group(1))
body = {"model": "qwen3.6-27b", "temperature": 0, "max_tokens": 2048,
        "messages": [{"role": "user", "content": "What is the capital of Italy? Answer with the city name only."}]}
req = urllib.request.Request("http://127.0.0.1:30000/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=30) as r:
    print(json.dumps(json.loads(r.read().decode())["choices"][0]["message"]))
""" % SECRETS


def text(r):
    return r.stdout.replace("\\n", "\n")


def chat(lab):
    return json.loads(ct(lab, "python3", "-c", CHAT).stdout.strip().splitlines()[-1])


def exec_start(lab):
    return ct(lab, "systemctl", "cat", "sglang.service").stdout


def test_the_default_parser_passes_and_without_it_the_gate_names_it(serving, tmp_path):
    lab = serving
    # the role's default: the parsers are on the unit's command line, and a plain client gets the thinking separated
    r = play(*SERVE)
    assert recap(r.stdout, "ct129")["failed"] == 0, text(r)[-4000:]
    unit = exec_start(lab)
    assert "--reasoning-parser qwen3" in unit and "--tool-call-parser qwen3_coder" in unit, unit
    msg = chat(lab)
    assert msg["content"] == "Rome" and msg["reasoning_content"].startswith('The user asks: "What is the capital of Italy?'), msg
    before = unit_props(lab)

    # reasoning_parser null: the unit runs without it, the plain_chat check sees the thinking in content
    noparser = tmp_path / "noparser.json"
    noparser.write_text(json.dumps({"sglang_server_options": {"reasoning_parser": None}, "sglang_server_gate_timeout": 120}))
    t0 = time.time()
    r = play(*SERVE + ("-e", "@%s" % noparser))
    out = text(r)
    print("without the reasoning parser: failed and rolled back in %.1fs" % (time.time() - t0))
    assert recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
    assert re.search(r"wrong_answer: .*; rolled back to SGLang [^\n]*, serving again", out), out[-4000:]
    flat = " ".join(out.split())   # the callback folds long lines and doubles quotes inside its quoted strings
    assert re.search(r"known-answer check '+plain_chat'+ failed \(thinking_in_content\)", flat), out[-4000:]
    assert "the server runs without --reasoning-parser" in flat and "--reasoning-parser qwen3" in flat, out[-4000:]
    assert "sglang_server_options.reasoning_parser: qwen3" in flat, out[-4000:]
    rec = json.loads(ct(lab, "cat", RECORD).stdout)
    assert rec["failed"]["diagnosis"]["phase"] == "wrong_answer"
    assert any("reasoning_parser" in c for c in rec["failed"]["changes"]), rec["failed"]["changes"]
    # the restored deployment has the parser again and serves
    assert "--reasoning-parser qwen3" in exec_start(lab) and ask(lab)[:2] == ["200", "200"]
    assert unit_props(lab)["InvocationID"] != before["InvocationID"]

    # the default again: it is the recorded deployment, serving: the gate passes
    r = play(*SERVE)
    assert recap(r.stdout, "ct129")["failed"] == 0, text(r)[-4000:]
    assert chat(lab)["content"] == "Rome"
