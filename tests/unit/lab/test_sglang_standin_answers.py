# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stand-in's answers come from the prompt (not from the gate's strings), and its output drills spoil them."""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "lab", "sglang_standin"))
from sglang.srt._kpro_lab import generate  # noqa: E402


@pytest.mark.parametrize("prompt,completion,answer", [
    ("Count from 3 to 6, one number per line.", False, "3\n4\n5\n6"),
    ("Count from 1 to 4.", False, "1, 2, 3, 4"),
    ("What is 17 * 23? Answer with the number only.", False, "391"),
    ("Question: What is 1000 - 1? Answer:", True, " 999"),
    ("What is the capital of Norway? Answer with one word.", False, "Oslo"),
    ("Name the capital of Kenya.", False, "The capital of Kenya is Nairobi."),
    ("The capital of Peru is", True, " Lima."),
    ("Write the word 'done' in lower case inside square brackets.", False, "[done]"),
    ('Reply with only the word "go" in upper case inside square brackets.', False, "[GO]"),
])
def test_answers_are_derived_from_the_prompt(prompt, completion, answer):
    assert generate.answer(prompt, completion) == answer


def test_wrong_answers_are_plausible():
    assert generate.answer("What is 4823 + 7619?", wrong=True) == "12432"
    assert generate.answer("What is the capital of Japan? Answer with one word.", wrong=True) == "Kyoto"
    assert generate.answer("Count from 1 to 6, one per line.", wrong=True) == "1\n2\n3\n4\n6"


def test_spoil_drops_or_doubles_tokens():
    text = "\n".join(str(i) for i in range(1, 8))
    assert generate.spoil(text, {"dropped_draft_tokens"}) == "1\n2\n34\n5\n6\n"
    assert generate.spoil(text, {"duplicated_tokens"}) == "1\n2\n33\n4\n5\n66\n7"
    assert generate.spoil(text, set()) == text


def test_output_drills_are_read_at_every_request_and_need_tp_for_wrong_answers(tmp_path, monkeypatch):
    monkeypatch.delenv("KPRO_LAB_SGLANG_DRILL", raising=False)
    monkeypatch.setenv("KPRO_LAB_ROOT", str(tmp_path))
    drill = tmp_path / "var/lib/kpro-lab/sglang-drill"
    drill.parent.mkdir(parents=True)
    assert generate.live_modes(2) == set()
    drill.write_text("wrong_answer_tp reasoning_only\n")
    assert generate.live_modes(2) == {"wrong_answer_tp", "reasoning_only"} and generate.live_modes(1) == {"reasoning_only"}
    drill.write_text("kv_cache_oom\n")
    assert generate.live_modes(2) == set()


def test_logprobs_in_openai_shapes():
    comp = generate.logprobs(" Paris.", False, False)
    assert comp["tokens"] == ["Paris", "."] and comp["text_offset"] == [1, 6] and all(v > -0.1 for v in comp["token_logprobs"])
    chat = generate.logprobs("Kyoto", True, True)
    assert chat["content"][0]["token"] == "Kyoto" and chat["content"][0]["logprob"] < -2
