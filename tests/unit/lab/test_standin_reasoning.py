# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stand-in's thinking model and its --reasoning-parser, against SGLang 0.5.11's source (reasoning.py cites it):
Qwen3.6 thinks unless enable_thinking is false, its text has no opening <think> (the template puts it in the prompt),
and only --reasoning-parser qwen3 moves the thinking out of content."""

from __future__ import annotations

import json
import os
import sys

import pytest

from test_sglang_standin import GOOD, lab  # noqa: F401  pylint: disable=unused-import

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "lab", "sglang_standin"))
from sglang.srt._kpro_lab import reasoning  # noqa: E402

QWEN36 = "Qwen3_5ForConditionalGeneration"
TEXT = reasoning.generated("What is the capital of Italy?", "Rome")
# Qwen3.6's generation prompt (as its chat template writes it: two strings) and Qwen3-Thinking-2507's (one string)
QWEN36_TAIL = ("{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and "
               "enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- else %}\n        {{- '<think>\\n' }}\n"
               "    {%- endif %}\n{%- endif %}")
THINKING_2507_TAIL = "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}"


def test_the_generated_text_is_the_thinking_then_the_end_tag_then_the_answer():
    assert not TEXT.startswith("<think>") and TEXT.count("</think>") == 1 and TEXT.endswith("\n</think>\n\nRome")
    assert TEXT.startswith('The user asks: "What is the capital of Italy?"')
    assert reasoning.thinks(QWEN36) and reasoning.thinks("Qwen3MoeForCausalLM") and not reasoning.thinks("LlamaForCausalLM")


@pytest.mark.parametrize("body,on", [
    ({}, True), ({"chat_template_kwargs": {}}, True), ({"chat_template_kwargs": {"enable_thinking": True}}, True),
    ({"chat_template_kwargs": {"enable_thinking": False}}, False),
    ({"chat_template_kwargs": {"enable_thinking": 0}}, True),      # Jinja's `is false` is the boolean only
    ({"reasoning_effort": "none"}, False),                          # protocol.py:726-735
])
def test_thinking_is_on_unless_enable_thinking_is_false(body, on):
    assert reasoning.thinking_on(reasoning.template_kwargs(body)) is on


@pytest.mark.parametrize("parser,body,content,thought", [
    # no parser: everything is content (serving_chat.py:1062 runs none)
    (None, {}, TEXT, None),
    # qwen3 forces reasoning for a request without enable_thinking: false (serving_chat.py:1396-1401): split at </think>
    ("qwen3", {}, "Rome", TEXT.split("</think>")[0].strip()),
    ("qwen3", {"chat_template_kwargs": {}}, "Rome", TEXT.split("</think>")[0].strip()),
    # separate_reasoning false: no parser run
    ("qwen3", {"separate_reasoning": False}, TEXT, None),
    # deepseek-r1 is forced by its detector (reasoning_parser.py:198-213); kimi uses other tags and is never forced
    ("deepseek-r1", {}, "Rome", TEXT.split("</think>")[0].strip()),
    ("kimi", {}, TEXT, None),
    # deepseek-v3 forces only with thinking: true; without the start tag in the text, all is content (60-63)
    ("deepseek-v3", {}, TEXT, None),
])
def test_the_parser_splits_as_0511_does(parser, body, content, thought):
    # the detector's reasoning_text is splits[0] (reasoning_parser.py:93-94), not stripped at its end: compare stripped
    c, r = reasoning.separate(TEXT, parser, body)
    assert c == content and (r.strip() if r else r) == thought


def test_an_answer_without_thinking_stays_content_and_an_unclosed_thinking_is_all_reasoning():
    # enable_thinking false: the model writes the answer only; qwen3 does not force, no <think> in it: content
    assert reasoning.separate("Rome", "qwen3", {"chat_template_kwargs": {"enable_thinking": False}}) == ("Rome", None)
    # ... but qwen3-thinking always forces (reasoning_parser.py:577-579): no </think>, all of it is reasoning (88-89)
    assert reasoning.separate("Rome", "qwen3-thinking", {"chat_template_kwargs": {"enable_thinking": False}}) == (None, "Rome")
    # max_tokens ended the thinking: no end tag, all of it reasoning, content None (1099-1105)
    assert reasoning.separate("The user asks", "qwen3", {}) == (None, "The user asks")
    # a template that forces reasoning (template_manager.py:94-96) takes even enable_thinking: false answers as reasoning
    assert reasoning.separate("Rome", "qwen3", {"chat_template_kwargs": {"enable_thinking": False}}, template_force=True) == (None, "Rome")


def test_the_template_force_is_read_as_0511_reads_it(tmp_path):
    assert reasoning.template_forces_reasoning(str(tmp_path)) is False
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN36_TAIL}))
    assert reasoning.template_forces_reasoning(str(tmp_path)) is False
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": THINKING_2507_TAIL}))
    assert reasoning.template_forces_reasoning(str(tmp_path)) is True
    (tmp_path / "chat_template.jinja").write_text(QWEN36_TAIL)     # the .jinja file wins over tokenizer_config.json
    assert reasoning.template_forces_reasoning(str(tmp_path)) is False


def _chat(lab, **body):
    req = dict({"model": "qwen3.6-27b", "messages": [{"role": "user", "content": "What is the capital of Italy? Answer with the city name only."}],
                "max_tokens": 2048, "temperature": 0}, **body)
    status, out = lab.get("/v1/chat/completions", data=req)
    assert status == 200, out
    return json.loads(out)["choices"][0]


def _up(lab, argv, drill=""):
    lab.start(argv, drill=drill)
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200, 30), lab.text()


def test_the_served_model_thinks_and_only_the_parser_separates_it(lab):
    _up(lab, GOOD)
    plain = _chat(lab)
    assert plain["message"]["reasoning_content"] is None and plain["message"]["content"].endswith("\n</think>\n\nRome")
    assert "<think>" not in plain["message"]["content"] and plain["finish_reason"] == "stop"
    off = _chat(lab, chat_template_kwargs={"enable_thinking": False})
    assert off["message"] == {"role": "assistant", "content": "Rome", "reasoning_content": None, "tool_calls": None}
    # too few tokens to finish the thinking: content is the cut thinking, no tag at all
    short = _chat(lab, max_tokens=8)
    assert short["finish_reason"] == "length" and "</think>" not in short["message"]["content"]
    # completions have no chat template: no thinking
    status, out = lab.get("/v1/completions", data={"model": "qwen3.6-27b", "prompt": "The capital of Italy is", "max_tokens": 8})
    assert status == 200 and "think" not in json.loads(out)["choices"][0]["text"]
    lab.proc.terminate()
    lab.wait()

    _up(lab, GOOD + ["--reasoning-parser", "qwen3"])
    assert "reasoning_parser='qwen3'" in lab.text()
    plain = _chat(lab)
    assert plain["message"]["content"] == "Rome" and plain["message"]["reasoning_content"].startswith('The user asks: "What is the capital')
    assert "</think>" not in plain["message"]["reasoning_content"]
    assert _chat(lab, chat_template_kwargs={"enable_thinking": False})["message"]["reasoning_content"] is None
    short = _chat(lab, max_tokens=8)
    assert short["message"]["content"] is None and short["message"]["reasoning_content"]
    lab.proc.terminate()
    lab.wait()


def test_reasoning_only_drill_still_puts_everything_into_reasoning_content(lab):
    _up(lab, GOOD + ["--reasoning-parser", "qwen3"], drill="reasoning_only")
    off = _chat(lab, chat_template_kwargs={"enable_thinking": False})
    assert off["message"]["content"] is None and off["message"]["reasoning_content"] == "Rome"
    plain = _chat(lab)
    assert plain["message"]["content"] is None and plain["message"]["reasoning_content"].endswith("Rome")
    lab.proc.terminate()
    lab.wait()


def test_an_unknown_parser_is_refused_like_the_real_argparse(lab):
    lab.start(GOOD + ["--reasoning-parser", "qwen"])
    rc = lab.wait()[0]
    assert rc == 2 and "argument --reasoning-parser: invalid choice: 'qwen'" in lab.text()
    lab.start(GOOD + ["--tool-call-parser", "qwen3"])
    rc = lab.wait()[0]
    assert rc == 2 and "argument --tool-call-parser: invalid choice: 'qwen3'" in lab.text()
