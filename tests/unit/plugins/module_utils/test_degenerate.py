from __future__ import annotations

import json

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils import degenerate as dg

# Degenerate outputs as reported (the shape of the text, rebuilt from the reports; sources per case).
DEGENERATE = [
    # shared/seeds/000_*.txt: after "Application startup complete" the server "generates \n\n repeatedly and stops"
    ("seed_newlines", "\n\n", "whitespace_only"),
    ("seed_newlines_run", "\n\n" * 20, "whitespace_only"),
    # sgl-project/sglang#19393 "[Bug] Qwen3.5-27B None Response" (tp_size > 1): nothing comes back
    ("sglang_19393_empty", "", "empty"),
    ("sglang_19393_none", None, "empty"),
    # sgl-project/sglang#589 "Qwen2-1.5B not work. Only output many '!'"; QwenLM/Qwen3#945 "infinite !!!!!!!!";
    # sgl-project/sglang#10569 "Qwen3-Next repeat output ! when the length exceeds 5K"
    ("sglang_589_bangs", "!" * 100, "repeated_character"),
    ("qwen_945_bangs_after_text", "Sure, here is the answer:" + "!" * 300, "repeated_character"),
    # meta-pytorch/torchtune#2866: '"$2 an hour" repeated hundreds of times'
    ("torchtune_2866_loop", "Weng earns $12 per hour. " + "$2 an hour " * 200, "repeating_loop"),
    # sgl-project/sglang#22242: "repetitive <think> loops ... runs until max_tokens"
    ("sglang_22242_think_loop", "<think>\n" * 60, "repeating_loop"),
    # the seed: "loops on the same reasoning content" (MTP on 0.5.9, TP=2)
    ("seed_reasoning_loop",
     "Let me think about the capital of France. "
     + ("The user asks for the capital of France. I should answer with the city name and nothing else, so the answer is the capital city. ") * 6,
     "repeating_loop"),
    ("one_word", "the " * 40, "repeating_loop"),
    ("newlines_inside_text", "Paris" + "\n" * 12 + "is", "newline_run"),
    ("replacement", "Paris \ufffd\ufffd\ufffd\ufffd is", "replacement_characters"),
    ("mojibake", "The caf\u00c3\u00a9 is \u00e2\u20ac\u0153open\u00e2\u20ac\u009d, na\u00c3\u00afve \u00c3\u00a9t\u00c3\u00a9", "mojibake"),
    ("control", "ok" + "\x00\x01\x02\x03" * 5, "control_characters"),
    ("two_words", " ".join(["yes", "no"] * 5 + ["yes"] * 20), "repeated_token"),
    ("separator_flood", "=" * 500, "repeated_character"),
]

NORMAL = [
    ("short_number", "4"),
    ("short_word", "Paris"),
    ("short_sentence", " Paris. It is also the largest city of France."),
    ("two_newlines_paragraphs", "First paragraph.\n\nSecond paragraph.\n\nThird one."),
    ("code", "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
             "def main():\n    for i in range(10):\n        print(i, fib(i))\n\n\nif __name__ == '__main__':\n    main()\n"),
    ("code_with_separator", "# " + "=" * 76 + "\n# Helpers\n# " + "=" * 76 + "\nimport os\nimport sys\n\n"
                            "def read(path):\n    with open(path) as f:\n        return f.read()\n"),
    ("markdown_list", "Steps:\n" + "\n".join("%d. Install package number %d and check its version." % (i, i) for i in range(1, 31))),
    ("markdown_table", "| name | size |\n|------|------|\n" + "\n".join("| file%d | %d MiB |" % (i, i * 7) for i in range(20))),
    ("json", json.dumps({"gpus": [{"index": i, "name": "NVIDIA RTX A6000", "memory_total_mib": 49140, "memory_used_mib": 0}
                                  for i in range(2)], "driver": "580.126.09"}, indent=2)),
    ("json_list_of_zeros_short", "[0, 0, 0, 0]"),
    ("poem_with_refrain", "The river runs beneath the hill,\nthe night is long, the air is still.\n"
                          "Sing low, sing low, the morning comes.\n\n"
                          "The lanterns fade along the quay,\nthe boats go out into the grey.\n"
                          "Sing low, sing low, the morning comes.\n\n"
                          "The bells have rung for those at sea,\nthe harbour waits for you and me.\n"
                          "Sing low, sing low, the morning comes.\n"),
    ("prose", "SGLang is a fast serving framework for large language models and vision language models. It makes your "
              "interaction with models faster and more controllable by co-designing the backend runtime and frontend "
              "language. The core features include a fast backend runtime with RadixAttention for prefix caching, "
              "jump-forward constrained decoding, overhead-free CPU scheduler, continuous batching, token attention, "
              "tensor parallelism, FlashInfer kernels, chunked prefill, and quantization."),
    ("unicode_text", "München, Zürich and São Paulo \u2014 \u201cquoted\u201d text, naïve café, 東京 and 北京."),
    ("la_la", "La la la, the song goes on, and then it ends."),
    ("chat_think", "<think>\nThe user asks 2+2. That is 4.\n</think>\n\n4"),
]


@pytest.mark.parametrize("name,text,reason", DEGENERATE, ids=[d[0] for d in DEGENERATE])
def test_degenerate(name, text, reason):
    res = dg.detect(text)
    assert res["degenerate"] is True, res
    assert res["reason"] == reason, res
    assert dg.is_degenerate(text)


@pytest.mark.parametrize("name,text", NORMAL, ids=[n[0] for n in NORMAL])
def test_normal(name, text):
    res = dg.detect(text)
    assert res["degenerate"] is False, res
    assert res["reason"] is None


def test_loop_details():
    res = dg.detect("Weng earns $12 per hour. " + "$2 an hour " * 200)
    d = res["details"]
    assert d["loop_period_tokens"] == 4 and d["loop_unit"] == "$ 2 an hour" and d["loop_repeats"] >= 199


def test_long_loop_at_the_end_of_a_long_text():
    text = NORMAL[11][1] * 3 + " " + "I will now repeat myself. " * 300
    res = dg.detect(text)
    assert res["degenerate"] and res["reason"] == "repeating_loop"


def test_non_string_input_is_stringified():
    assert dg.detect(4)["degenerate"] is False
