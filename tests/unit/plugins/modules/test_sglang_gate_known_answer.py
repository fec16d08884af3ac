# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_gate's known-answer check against the REAL SGLang stand-in (serve_lab.py): the default prompts pass on a good
server, and each output drill fails with its phase, the prompt, expected and received text, and the remedy."""

from __future__ import annotations

import pytest

from ansible_collections.kpro.gpu_serving.plugins.modules import sglang_gate
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.serve_lab import (  # noqa: F401  pylint: disable=unused-import
    BASELINE, MODEL_NAME, fakenvml, serve_lab)
from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module


def gate(lab, launch_id, expect_ok, **kw):
    args = {"pid": lab.proc.pid, "log_dir": str(lab.log_dir), "launch_id": launch_id, "base_url": "http://127.0.0.1:%d" % lab.port,
            "served_model_name": MODEL_NAME, "timeout": 60, "stall_timeout": 30, "poll_interval": 0.5, "planned_weights_mib": 26417,
            "gpu_baseline_mib": [BASELINE, BASELINE], "sglang_version": "0.5.11", "model_dir": str(lab.model)}
    args.update(kw)
    with pytest.raises(AnsibleExitJson if expect_ok else AnsibleFailJson) as e:
        run_module(sglang_gate, args)
    lab.record()
    return e.value.result


def test_the_default_checks_pass_on_a_good_server(serve_lab):
    serve_lab.launch("ka0001")
    res = gate(serve_lab, "ka0001", True)
    ka = res["known_answer"]
    assert res["phase"] == "ready" and ka["passed"] and len(ka["checks"]) == 6
    assert [c["received"].strip() for c in ka["checks"][:4]] == ["\n".join(str(i) for i in range(1, 21)), "12442", "Tokyo", "[READY]"]
    assert ka["checks"][4]["mean_logprob"] is not None and ka["checks"][4]["mean_logprob"] > -0.1
    assert any(e.startswith("known-answer checks passed: 6 in") for e in res["evidence"])
    # plain_chat (no chat_template_kwargs): the stand-in's Qwen3.6 thinks, --reasoning-parser qwen3 separates the thinking
    assert ka["checks"][5]["name"] == "plain_chat" and ka["checks"][5]["received"] == "Rome"
    assert ka["checks"][5]["reasoning_content"].startswith("The user asks:")


DRILLS = [
    ("dropped_draft_tokens", "count", "missing 3, 4"),
    ("duplicated_tokens", "count", "unexpected '33'"),
    # the content probe's " Lyon." is readable: a wrong answer too, reported first
    ("wrong_answer_tp", "probe", "the text does not match '(?i)paris'"),
    ("reasoning_only", "count", "content is empty; the whole answer is in reasoning_content"),
]


@pytest.mark.parametrize("drill,check,why", DRILLS, ids=[d[0] for d in DRILLS])
def test_output_drill_is_a_wrong_answer_with_prompt_expected_received_and_remedy(serve_lab, drill, check, why):
    lid = "ka-%s" % drill.replace("_", "")
    serve_lab.launch(lid, drill=drill)
    res = gate(serve_lab, lid, False)
    assert res["phase"] == "wrong_answer" and res["msg"].startswith("wrong_answer: launch %s of PID" % lid), res["msg"]
    assert "answers, but fails the known-answer check" in res["msg"]
    failed = [c for c in res["known_answer"]["checks"] if not c["ok"]]
    assert failed[0]["name"] == check and why in failed[0]["why"], failed
    ev = "\n".join(res["evidence"])
    assert "known-answer check %r failed" % check in ev and "  prompt:   " in ev and "  expected: " in ev and "  received: " in ev
    if drill == "reasoning_only":
        assert "reasoning_content" in res["remedy"] and "enable_thinking" in res["remedy"]
        return
    # no speculative decoding in this configuration: the version first, then tp
    assert "suspect 1: SGLang 0.5.11: the compatibility table knows no problem with Qwen3_5ForConditionalGeneration at tp=2" in ev
    assert "suspect 2: tensor parallelism (tp_size=2)" in ev
    assert "(1) SGLang 0.5.11" in res["remedy"] and "disable_custom_all_reduce" in res["remedy"]
    if drill == "wrong_answer_tp":
        assert [c["name"] for c in failed] == ["probe", "count", "arithmetic", "fact", "logprob", "plain_chat"]
        assert failed[2]["why"] == "the answer's first number is 12432, not 12442" and failed[4]["mean_logprob"] < -2


def test_without_the_reasoning_parser_the_plain_chat_check_fails_naming_it(serve_lab):
    # SGLang 0.5.11 without --reasoning-parser: Qwen3.6's thinking and its </think> come back in content
    serve_lab.launch("ka-noparser", reasoning_parser=None)
    res = gate(serve_lab, "ka-noparser", False)
    failed = [c for c in res["known_answer"]["checks"] if not c["ok"]]
    assert res["phase"] == "wrong_answer" and [c["name"] for c in failed] == ["plain_chat"], failed
    assert failed[0]["kind"] == "thinking_in_content" and failed[0]["received"].endswith("</think>\n\nRome")
    assert "after it the answer matches" in failed[0]["why"]
    assert "--reasoning-parser qwen3" in res["remedy"] and "sglang_server_options.reasoning_parser: qwen3" in res["remedy"]
    assert "runs without --reasoning-parser" in res["remedy"] and "suspect 1" not in "\n".join(res["evidence"])


def test_the_check_can_be_turned_off(serve_lab):
    serve_lab.launch("ka0002", drill="dropped_draft_tokens")
    res = gate(serve_lab, "ka0002", True, known_answer_checks=[])
    assert res["phase"] == "ready" and res["known_answer"] is None


def test_a_check_that_cannot_pass_on_a_healthy_server_is_named_before_the_server(serve_lab):
    # issue 30: a healthy server (ready, /health, the probe and the collection's checks pass) fails only a check of the
    # run's own that expects what the model never answers: the check's expectation is suspect 1, not the version or tp
    serve_lab.launch("ka-owncheck")
    own = {"name": "capital_jp", "endpoint": "chat", "prompt": "What is the capital of Japan? Answer with the city name only.",
           "expected": "Kyoto", "match": "word", "max_tokens": 16}
    res = gate(serve_lab, "ka-owncheck", False, known_answer_checks=[own])
    assert res["phase"] == "wrong_answer" and [c["received"] for c in res["known_answer"]["checks"]] == ["Tokyo"]
    ev = [e for e in res["evidence"] if e.startswith("suspect")]
    assert ev[0].startswith("suspect 1: the check's own expectation, on a server that is otherwise healthy") and \
        "'capital_jp' expects 'Kyoto' and got 'Tokyo'" in ev[0], ev
    assert ev[1].startswith("suspect 2: SGLang 0.5.11") and ev[2].startswith("suspect 3: tensor parallelism")
    assert res["remedy"].index("sglang_server_known_answer.checks") < res["remedy"].index("(2) SGLang 0.5.11")
