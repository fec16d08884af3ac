# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The known-answer check: matching real output classes, the requests, and the failure with its suspects."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import known_answer as ka

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
COUNT = "\n".join(str(i) for i in range(1, 21))
QWEN35 = "Qwen3_5ForConditionalGeneration"


@pytest.mark.parametrize("received", [
    "[READY]", "  [READY]\n", "[READY].", "<think>\nThe user wants brackets.\n</think>\n\n[READY]",
    "The user wants the word in brackets, upper case.\n</think>\n\n[READY]", "```\n[READY]\n```", "**[READY]**", "`[READY]`",
])
def test_exact_survives_whitespace_period_thinking_fence_and_bold(received):
    assert ka.matches("exact", "[READY]", received) == (True, "")


@pytest.mark.parametrize("received", ["[Ready]", "READY", "[READY] Done", "<think>[READY]</think>"])
def test_exact_refuses_another_format(received):
    assert ka.matches("exact", "[READY]", received)[0] is False


def test_lines_ignore_blank_lines_and_trailing_punctuation_but_not_a_lost_token():
    assert ka.matches("lines", COUNT, "\n" + COUNT.replace("\n", "\n\n") + "\n")[0]
    assert ka.matches("lines", COUNT, COUNT.replace("\n", ".\n") + ".")[0]
    assert ka.matches("lines", COUNT, "<think>\n\n</think>\n\n" + COUNT)[0]
    assert ka.matches("lines", COUNT, "Here are the numbers:\n\n" + "\n".join("- %d" % i for i in range(1, 21)))[0]
    assert not ka.matches("lines", COUNT, "Here are the numbers:\n" + COUNT + "\nDone")[0]
    ok, why = ka.matches("lines", COUNT, COUNT.replace("3\n4", "34"))
    assert not ok and "missing 3, 4" in why and "'34' (3 and 4 glued)" in why and "first difference at line 3 (19 lines, expected 20)" in why
    ok, why = ka.matches("lines", COUNT, COUNT.replace("\n12\n", "\n1212\n"))
    assert not ok and "unexpected '1212' (12 doubled)" in why
    ok, why = ka.matches("lines", COUNT, COUNT.replace("\n7\n", "\n7\n7\n"))
    assert not ok and "duplicated 7" in why


@pytest.mark.parametrize("received,ok", [
    (" 12442", True), ("12,442.", True), ("4823 + 7619 = 12442", True), ("12442\n\nQuestion: What is 5 + 3?", True),
    ("The answer is **12442**.", True), (" 12432", False), ("4823 + 7619 = 12432", False), ("I cannot say.", False),
])
def test_number_is_the_first_number_not_in_the_prompt(received, ok):
    assert ka.matches("number", "12442", received, "Question: What is 4823 + 7619? Answer with the number only.")[0] is ok


@pytest.mark.parametrize("received,ok", [("Tokyo", True), ("tokyo.", True), ("The capital of Japan is Tokyo.", True),
                                         ("Kyoto", False), ("Tokyoite", False)])
def test_word_is_a_whole_word_case_insensitively(received, ok):
    assert ka.matches("word", "Tokyo", received)[0] is ok


def test_requests_are_greedy_chat_with_template_kwargs_and_completions_with_logprobs():
    chat = ka.request_body(ka.DEFAULT_CHECKS[0], "m", {"enable_thinking": False})
    assert chat["temperature"] == 0 and chat["messages"] == [{"role": "user", "content": ka.DEFAULT_CHECKS[0]["prompt"]}]
    assert chat["chat_template_kwargs"] == {"enable_thinking": False} and "logprobs" not in chat and chat["stream"] is False
    comp = ka.request_body(ka.DEFAULT_CHECKS[1], "m", {"enable_thinking": False})
    assert comp["prompt"].startswith("Question:") and comp["logprobs"] == 1 and "chat_template_kwargs" not in comp
    assert ka.request_body(dict(ka.DEFAULT_CHECKS[2], min_mean_logprob=-1.0), "m", None)["logprobs"] is True


def _chat(content, reasoning=None, logprobs=None):
    return {"choices": [{"message": {"role": "assistant", "content": content, "reasoning_content": reasoning}, "logprobs": logprobs}]}


def _text(text, lps=None):
    return {"choices": [{"text": text, "logprobs": {"token_logprobs": lps} if lps else None}]}


def fake_server(answers):
    """post() that answers each check by its prompt."""
    def post(path, body):
        prompt = body.get("prompt") or body["messages"][0]["content"]
        for check in ka.DEFAULT_CHECKS:
            if check["prompt"] == prompt:
                return 200, answers[check["name"]]
        return 404, None
    return post


GOOD = {"count": _chat(COUNT), "arithmetic": _text(" 12442", [-0.01]), "fact": _chat("Tokyo"), "format": _chat("[READY]"),
        "logprob": _text(" Paris. It is", [-0.02, -0.1, -0.3, -0.4]),
        # SGLang 0.5.11 with --reasoning-parser qwen3: the thinking separated, the answer in content
        "plain_chat": _chat("Rome", "The user asks for the capital of Italy.\n")}


def test_good_answers_pass_and_the_logprob_is_measured():
    res = ka.run_checks(fake_server(GOOD), ka.DEFAULT_CHECKS, "m")
    assert res["passed"] and [c["name"] for c in res["checks"]] == ["count", "arithmetic", "fact", "format", "logprob", "plain_chat"]
    assert res["checks"][4]["mean_logprob"] == -0.205 and res["elapsed_s"] < 5


def test_a_low_logprob_fails_only_with_a_threshold():
    low = dict(GOOD, logprob=_text(" Paris.", [-2.5, -2.1]))
    assert ka.run_checks(fake_server(low), ka.DEFAULT_CHECKS, "m")["passed"]
    checks = ka.DEFAULT_CHECKS[:4] + [dict(ka.DEFAULT_CHECKS[4], min_mean_logprob=-1.0)]
    res = ka.run_checks(fake_server(low), checks, "m")
    assert not res["passed"] and res["checks"][4]["kind"] == "low_logprob" and "-2.3" in res["checks"][4]["why"]
    assert ka.failure(res, {"tp_size": 2})["phase"] == "wrong_answer"


def test_failure_names_phase_prompt_expected_received_and_suspects():
    sa = {"tp_size": 2, "speculative_algorithm": "NEXTN"}
    res = ka.run_checks(fake_server(dict(GOOD, count=_chat(COUNT.replace("3\n4", "34")))), ka.DEFAULT_CHECKS, "m")
    bad = ka.failure(res, sa, "0.5.11", QWEN35, {})
    assert bad["phase"] == "wrong_answer"
    ev = "\n".join(bad["evidence"])
    assert "known-answer check 'count' failed (wrong) via POST /v1/chat/completions: missing 3, 4" in ev
    assert "prompt:   'Count from 1 to 20" in ev and "expected: '1\\n2\\n3\\n4" in ev and "received: '1\\n2\\n34\\n5" in ev
    # the suspects in order: speculative decoding (with how to turn it off), the version, tp
    sus = [e for e in bad["evidence"] if e.startswith("suspect")]
    assert sus[0].startswith("suspect 1: speculative decoding is on (--speculative-algorithm NEXTN)")
    assert sus[1].startswith("suspect 2: SGLang 0.5.11: the compatibility table knows no problem") and sus[2].startswith("suspect 3: tensor")
    assert "speculative_algorithm, speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens to null in sglang_server_options" \
        in bad["remedy"]
    assert bad["remedy"].index("(1) speculative") < bad["remedy"].index("(2) SGLang") < bad["remedy"].index("(3) tensor")


def test_suspects_without_speculative_decoding_name_a_refused_version_first():
    found = ka.suspects({"tp_size": 2}, "0.5.9", QWEN35, {})
    assert len(found) == 2 and "is refused" in found[0]["suspect"] and "#19070" in found[0]["suspect"]
    assert "0.5.11" in found[0]["remedy"] and "tp_size=2" in found[1]["suspect"]
    assert [s["suspect"][:21] for s in ka.suspects({"tp_size": 1})] == ["the SGLang version (n"]


def test_everything_in_reasoning_content_is_a_wrong_answer_about_the_parser():
    answers = dict(GOOD, count=_chat(None, COUNT), fact=_chat("", "Tokyo"), format=_chat(None, "[READY]"))
    res = ka.run_checks(fake_server(answers), ka.DEFAULT_CHECKS, "m")
    assert [c["kind"] for c in res["checks"]] == ["reasoning_only", None, "reasoning_only", "reasoning_only", None, None]
    bad = ka.failure(res, {"tp_size": 2, "reasoning_parser": "qwen3"}, "0.5.11", QWEN35)
    assert bad["phase"] == "wrong_answer" and "reasoning_content" in bad["remedy"] and "--reasoning-parser qwen3" in bad["remedy"]
    assert "enable_thinking: false" in bad["remedy"] and not any(e.startswith("suspect") for e in bad["evidence"])
    assert "  reasoning_content: 'Tokyo'" in bad["evidence"]


def test_garbage_is_degenerate_output_and_no_answer_is_warmup_failed():
    res = ka.run_checks(fake_server(dict(GOOD, fact=_chat("\n\n\n\n\n\n\n\n\n\n"))), ka.DEFAULT_CHECKS, "m")
    assert ka.failure(res, {})["phase"] == "degenerate_output" and res["checks"][2]["kind"] == "degenerate"

    def down(path, body):
        return 500, {"message": "boom"}
    res = ka.run_checks(down, ka.DEFAULT_CHECKS[:1], "m")
    assert res["checks"][0]["kind"] == "http" and ka.failure(res, {})["phase"] == "warmup_failed"


def test_no_checks_pass():
    assert ka.run_checks(None, [], "m") == {"passed": True, "elapsed_s": 0.0, "checks": []}


def test_the_roles_defaults_are_the_modules_defaults():
    with open(os.path.join(REPO, "roles", "sglang_server", "defaults", "main.yml")) as f:
        defaults = yaml.safe_load(f)["sglang_server_known_answer"]
    assert defaults["chat_template_kwargs"] == ka.DEFAULT_CHAT_TEMPLATE_KWARGS
    norm = [dict(c, **({"min_mean_logprob": c.get("min_mean_logprob")} if "min_mean_logprob" in c else {})) for c in ka.DEFAULT_CHECKS]
    assert defaults["checks"] == norm


# What SGLang 0.5.11 returns to a client that sends no chat_template_kwargs, for Qwen3.6 (its template opens <think> in the
# prompt): without --reasoning-parser the whole generated text is content (serving_chat.py:1059-1105 runs no parser)
THOUGHT = "The user asks for the capital of Italy. That is Rome."
NO_PARSER = [
    THOUGHT + "\n</think>\n\nRome",                       # Qwen3.5/3.6: no opening tag, it is in the prompt
    "<think>\n" + THOUGHT + "\n</think>\n\nRome",         # Qwen3 (2504): the model writes the opening tag
    "<think>\n" + THOUGHT,                                  # the thinking did not close within max_tokens
]


def test_the_plain_chat_check_sends_no_chat_template_kwargs_and_room_to_think():
    plain = next(c for c in ka.DEFAULT_CHECKS if c["name"] == "plain_chat")
    body = ka.request_body(plain, "m", {"enable_thinking": False})
    assert "chat_template_kwargs" not in body and body["max_tokens"] >= 1024 and plain["endpoint"] == "chat"
    # a check's own kwargs win over the run's, and {} sends none
    assert ka.request_body(dict(plain, chat_template_kwargs={"enable_thinking": True}), "m", {"x": 1})["chat_template_kwargs"] == \
        {"enable_thinking": True}
    assert ka.request_body(dict(plain, chat_template_kwargs=None), "m", {"x": 1})["chat_template_kwargs"] == {"x": 1}


@pytest.mark.parametrize("content", NO_PARSER, ids=["qwen36", "qwen3", "unclosed"])
def test_thinking_in_content_is_a_wrong_answer_naming_the_reasoning_parser(content):
    res = ka.run_checks(fake_server(dict(GOOD, plain_chat=_chat(content))), ka.DEFAULT_CHECKS, "m")
    bad = [c for c in res["checks"] if not c["ok"]]
    assert not res["passed"] and [c["name"] for c in bad] == ["plain_chat"] and bad[0]["kind"] == "thinking_in_content"
    assert bad[0]["thinking"].startswith("The user asks for the capital of Italy")
    fail = ka.failure(res, {"tp_size": 2, "reasoning_parser": None}, "0.5.11", QWEN35, {})
    assert fail["phase"] == "wrong_answer"
    assert "--reasoning-parser qwen3" in fail["remedy"] and "sglang_server_options.reasoning_parser: qwen3" in fail["remedy"]
    assert "runs without --reasoning-parser" in fail["remedy"] and not any(e.startswith("suspect") for e in fail["evidence"])
    ev = "\n".join(fail["evidence"])
    assert "known-answer check 'plain_chat' failed (thinking_in_content) via POST /v1/chat/completions: content holds the model's thinking" in ev
    assert "  thinking in content: 'The user asks for the capital of Italy" in ev
    # the answer after the thinking is still compared: said in why
    assert ("after it the answer matches" in bad[0]["why"]) is content.endswith("Rome")


def test_a_parser_that_does_not_separate_the_thinking_is_named():
    res = ka.run_checks(fake_server(dict(GOOD, plain_chat=_chat(NO_PARSER[1]))), ka.DEFAULT_CHECKS, "m")
    fail = ka.failure(res, {"reasoning_parser": "deepseek-v3"}, "0.5.11", QWEN35)
    assert "--reasoning-parser deepseek-v3 does not separate this model's thinking" in fail["remedy"]
    assert "--reasoning-parser qwen3" in fail["remedy"]


def test_separated_thinking_passes_and_a_wrong_answer_with_thinking_still_gets_the_suspects():
    assert ka.judge(ka.DEFAULT_CHECKS[5], 200, _chat("Rome", THOUGHT))["ok"]
    assert ka.judge(ka.DEFAULT_CHECKS[2], 200, _chat("Tokyo"))["ok"]
    # a closed block in content fails any chat check, not only plain_chat; a completion is raw text and is not looked at
    assert ka.judge(ka.DEFAULT_CHECKS[2], 200, _chat("<think>\n\n</think>\n\nTokyo"))["kind"] == "thinking_in_content"
    assert ka.judge(dict(ka.DEFAULT_CHECKS[1]), 200, _text("</think> 12442"))["ok"]
    answers = dict(GOOD, count=_chat(COUNT.replace("3\n4", "34")), plain_chat=_chat(NO_PARSER[0]))
    fail = ka.failure(ka.run_checks(fake_server(answers), ka.DEFAULT_CHECKS, "m"), {"tp_size": 2}, "0.5.11", QWEN35)
    assert any(e.startswith("suspect 1: SGLang 0.5.11") for e in fail["evidence"]) and "--reasoning-parser qwen3" in fail["remedy"]


def test_the_parser_is_known_for_qwen3_only():
    assert ka.reasoning_parser_for(QWEN35) == "qwen3" and ka.reasoning_parser_for("LlamaForCausalLM") is None


# A check of the run's own that no healthy server can pass (issue 30): the Qwen3 answers "Paris", the check wants "Lyon"
OWN = {"name": "capital", "endpoint": "chat", "prompt": "What is the capital of France? Answer with the city name only.",
       "expected": "Lyon", "match": "word", "max_tokens": 16}


def with_own(answers, own_answer):
    post = fake_server(answers)
    return lambda path, body: (200, own_answer) if body.get("messages", [{}])[0].get("content") == OWN["prompt"] else post(path, body)


def _suspects(bad):
    return [e for e in bad["evidence"] if e.startswith("suspect")]


def test_a_check_that_cannot_pass_on_a_healthy_server_names_its_expectation_first():
    res = ka.run_checks(with_own(GOOD, _chat("Paris")), ka.DEFAULT_CHECKS + [OWN], "m")
    bad = ka.failure(res, {"tp_size": 2, "speculative_algorithm": "NEXTN"}, "0.5.11", QWEN35, {})
    sus = _suspects(bad)
    assert bad["phase"] == "wrong_answer" and len(sus) == 4
    assert sus[0] == ("suspect 1: the check's own expectation, on a server that is otherwise healthy (ready, /health, the content "
                      "probe readable, 6 other check(s) passed): 'capital' expects 'Lyon' and got 'Paris' ('Lyon' is not in the answer)")
    assert sus[1].startswith("suspect 2: speculative decoding") and sus[2].startswith("suspect 3: SGLang 0.5.11")
    assert sus[3].startswith("suspect 4: tensor")
    fix = "(1) the check's own expectation"
    assert bad["remedy"].index(fix) < bad["remedy"].index("(2) speculative") < bad["remedy"].index("(4) tensor")
    assert "if the answer is right, fix the check: 'capital': its expected and match in sglang_server_known_answer.checks" \
        in bad["remedy"]


def test_a_check_of_the_collection_that_fails_keeps_the_server_first():
    # the default count check with two lines glued (a draft token dropped) and the run's own check failing too: the server
    # is not otherwise healthy, so the server's suspects come first and the run's expectation last
    answers = dict(GOOD, count=_chat(COUNT.replace("3\n4", "34")))
    bad = ka.failure(ka.run_checks(with_own(answers, _chat("Paris")), ka.DEFAULT_CHECKS + [OWN], "m"),
                     {"tp_size": 2, "speculative_algorithm": "NEXTN"}, "0.5.11", QWEN35, {})
    sus = _suspects(bad)
    assert sus[0].startswith("suspect 1: speculative decoding") and sus[-1].startswith("suspect 4: the check's own expectation")
    assert "'capital' expects 'Lyon'" in sus[-1] and "'count'" not in sus[-1]
    # the collection's own check alone: no expectation suspect at all
    bad = ka.failure(ka.run_checks(fake_server(answers), ka.DEFAULT_CHECKS, "m"), {"tp_size": 2}, "0.5.11", QWEN35, {})
    assert not any("own expectation" in s for s in _suspects(bad)) and "fix the check" not in bad["remedy"]


def test_a_logprob_floor_and_a_probe_regex_of_the_run_are_named_first():
    low = dict(GOOD, logprob=_text(" Paris.", [-2.5, -2.1]))
    checks = ka.DEFAULT_CHECKS[:4] + [dict(ka.DEFAULT_CHECKS[4], min_mean_logprob=-1.0)]
    bad = ka.failure(ka.run_checks(fake_server(low), checks, "m"), {"tp_size": 2}, "0.5.11", QWEN35, {})
    assert _suspects(bad)[0].startswith("suspect 1: the check's own expectation") and "'logprob': its min_mean_logprob" in bad["remedy"]
    res = ka.run_checks(fake_server(GOOD), ka.DEFAULT_CHECKS, "m")
    res["checks"].insert(0, ka.probe_check(ka.PROBE_PROMPT, "(?i)lyon", " Paris, the city of light"))
    res["passed"] = False
    bad = ka.failure(res, {"tp_size": 2}, "0.5.11", QWEN35, {})
    assert "'probe' expects \"text matching '(?i)lyon'\" and got ' Paris, the city of light'" in _suspects(bad)[0]
    assert "fix the check: the probe: sglang_server_probe.regex (the gate's expected_probe_regex)" in bad["remedy"]
    # the collection's probe regex missed by readable text: the server's suspects only
    res["checks"][0] = ka.probe_check(ka.PROBE_PROMPT, ka.PROBE_REGEX, " Lyon")
    assert _suspects(ka.failure(res, {"tp_size": 2}, "0.5.11", QWEN35, {}))[0].startswith("suspect 1: SGLang 0.5.11")
