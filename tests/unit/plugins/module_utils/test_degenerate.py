from __future__ import annotations

import glob
import hashlib
import json
import os
import re

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import degenerate as dg
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import language, language_words
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.language_words import WORDS

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "outputs")


def load(path):
    """(headers, text) of an output fixture: '# key: value' lines, '# ----', then the output verbatim."""
    with open(path, encoding="utf-8", newline="") as f:
        raw = f.read()
    head, text = raw.split("# ----\n", 1)
    headers = dict(re.findall(r"^# (\w+): (.*)$", head, re.M))
    if headers.get("body", "").startswith("json"):
        text = json.loads(text)
    return headers, text


def fixtures(kind):
    return sorted(glob.glob(os.path.join(OUT, kind, "*.txt")))


name = os.path.basename

# ---------------------------------------------------------------------------------------------------
# The first set (issue 15): outputs the filter's first version was tuned on.
# ---------------------------------------------------------------------------------------------------

DEGENERATE_REAL = fixtures("degenerate")
NORMAL_REAL = fixtures("normal")
MISSED_REAL = fixtures("missed")

# ---------------------------------------------------------------------------------------------------
# The fresh set (issue 31): collected from public issues the project had not used, split into a half to tune
# on and a held-out half before the filter was run on any of it (the split: sha256 of the source, even = tune).
# ---------------------------------------------------------------------------------------------------

FRESH = fixtures("fresh/degenerate") + fixtures("fresh/normal")


def fresh(split, expected):
    return [p for p in FRESH if load(p)[0]["split"] == split and load(p)[0]["expected"] == expected]


# The scores docs/lab.md reports. A change to the filter that moves them updates docs/lab.md with them.
TUNE_MISSES = {"subtle_salad_ollama_2650.txt"}      # a coherent answer with a few misspelt words ("thtough")
# '38"4EC$!31=.4<H0+...': its two dollar signs read as inline math ($...$), which spares short letter runs
HELDOUT_MISSES = {"symbol_salad_lmstudio_bug_tracker_47.txt"}
ALL_REAL = DEGENERATE_REAL + NORMAL_REAL + MISSED_REAL + FRESH


def real(fragment):
    """The text of the one real fixture whose name contains ``fragment``."""
    found = [p for p in ALL_REAL if fragment in name(p)]
    assert len(found) == 1, (fragment, found)
    return load(found[0])[1]


@pytest.mark.parametrize("path", ALL_REAL, ids=[name(p) for p in ALL_REAL])
def test_real_outputs_name_their_source(path):
    headers, text = load(path)
    assert re.match(r"https://[\w.-]+/\S+ \(", headers["source"])
    assert headers["note"] and headers["class"] and text


def test_the_fresh_set_is_split_by_its_sources_hash():
    assert len(fresh("tune", "degenerate")) + len(fresh("heldout", "degenerate")) >= 40
    assert len(fresh("tune", "normal")) + len(fresh("heldout", "normal")) >= 26
    for path in FRESH:
        headers = load(path)[0]
        key = re.match(r"sha256\((\S+)\)$", headers["split_key"]).group(1)
        assert headers["source"].startswith(key.split("#")[0] + " ")
        even = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 2 == 0
        assert headers["split"] == ("tune" if even else "heldout"), name(path)


@pytest.mark.parametrize("path", fresh("tune", "degenerate"), ids=[name(p) for p in fresh("tune", "degenerate")])
def test_tune_half_degenerate_outputs_are_caught(path):
    res = dg.detect(load(path)[1])
    assert res["degenerate"] is (name(path) not in TUNE_MISSES), res


@pytest.mark.parametrize("path", fresh("heldout", "degenerate"), ids=[name(p) for p in fresh("heldout", "degenerate")])
def test_heldout_half_degenerate_outputs(path):
    # the held-out half was not tuned on: this pins the score docs/lab.md reports (15 of 16)
    res = dg.detect(load(path)[1])
    assert res["degenerate"] is (name(path) not in HELDOUT_MISSES), res


NORMAL_ALL = NORMAL_REAL + fresh("tune", "normal") + fresh("heldout", "normal")


@pytest.mark.parametrize("path", NORMAL_ALL, ids=[name(p) for p in NORMAL_ALL])
def test_real_normal_outputs_are_not_flagged(path):
    # required on both halves: 0 normal outputs flagged
    res = dg.detect(load(path)[1])
    assert res["degenerate"] is False and res["reason"] is None, res


@pytest.mark.parametrize("path", DEGENERATE_REAL, ids=[name(p) for p in DEGENERATE_REAL])
def test_first_set_degenerate_outputs_are_caught(path):
    res = dg.detect(load(path)[1])
    assert res["degenerate"] is True and res["reason"], res


@pytest.mark.parametrize("path", MISSED_REAL, ids=[name(p) for p in MISSED_REAL])
def test_known_misses(path):
    # A dozen broken words at the end of a coherent answer ("çok köklü ama buyrun,codete") or stray
    # apostrophes ("the elder' the young' un'") are too few among real words to decide on.
    assert dg.detect(load(path)[1])["degenerate"] is False


# ---------------------------------------------------------------------------------------------------
# Each class of the issue, on a real published example, with the evidence the verdict names.
# ---------------------------------------------------------------------------------------------------

def verdict(fragment, **kwargs):
    res = dg.detect(real(fragment), **kwargs)
    assert res["degenerate"] and 0.5 <= res["confidence"] <= 1.0 and res["evidence"], res
    return res


def test_short_token_salads_are_decided():
    # 16 tokens at TP 2 (sglang#2354): sub-word fragments glued across scripts
    res = verdict("short_token_salad_sglang_2354")
    assert res["reason"] == "multilingual_salad" and "scalablytyped" in res["evidence"][0]
    # one script per word, but no word is a word (llama.cpp#14228, split-mode row)
    res = verdict("short_token_salad_llamacpp_14228")
    assert res["reason"] == "nonword_salad" and "nghi\u1ec7m" in res["evidence"][0]
    assert verdict("short_token_salad_vllm_22929")["reason"] == "punctuation_salad"       # ", , the, "
    assert verdict("short_token_salad_vllm_8017")["reason"] == "symbol_salad"


def test_longer_token_salads():
    assert verdict("token_salad_vllm_42715")["reason"] == "multilingual_salad"
    res = verdict("token_salad_em_german_11")
    assert res["reason"] == "multilingual_salad" and res["details"]["mixed_script_words"] >= 2
    # real words in no order and without grammar (Mixtral after an upgrade, vllm#2714)
    res = verdict("subword_gibberish_vllm_2714")
    assert res["reason"] == "word_salad" and res["details"]["function_share"] < 0.18
    assert verdict("token_salad_vllm_19876")["reason"] == "duplicated_words"     # "com com com"
    # function words without content (llama3:70b under ollama)
    assert verdict("function_word_salad_ollama_3819")["reason"] == "function_word_salad"


def test_symbol_salad_with_a_few_word_characters():
    for fragment in ("symbol_salad_gpt4all_1422", "symbol_salad_sillytavern_2206", "symbol_salad_tt_inference_server_2807",
                     "symbol_salad_vmlx_42"):
        assert verdict(fragment)["reason"] == "symbol_salad", fragment


def test_special_tokens_outside_any_template_list():
    res = verdict("special_token_loop_coreai_models_259")          # Gemma's <end_of_turn> until max_tokens
    assert res["reason"] == "template_leak" and res["details"]["template_token"] == "<end_of_turn>"
    assert verdict("special_token_loop_text_generation_infe_1723")["details"]["template_token"] == "<PAD>"
    assert verdict("special_token_loop_chinese_llama_alpaca_174")["details"]["template_tokens"] >= 2     # </s> again and again
    assert verdict("special_token_loop_vllm_13035")["reason"] == "template_leak"


def test_repeated_sentences_with_the_prompt_echoed():
    text = real("prompt_echo_loop_open_flamingo_207")
    res = dg.detect(text)
    assert res["reason"] == "template_leak" and res["details"]["template_token"] == "\u2047"
    # the same sentences without the stray tokens are still a loop: a sentence of 5+ words said twice in a row
    plain = re.sub(r"\u2047|<\|endofchunk\|>|<image>", " ", text)
    res = dg.detect(plain)
    assert res["reason"] == "repeating_loop" and "thanksgiving table" in res["details"]["repeated_sentence"]
    assert verdict("sentence_loop_dialogpt_90")["reason"] == "repeating_loop"
    # an answer that is the prompt again and nothing else
    res = dg.detect("The capital city of France is", prompt="The capital city of France is")
    assert res["reason"] == "prompt_echo"
    assert dg.detect(" Paris, which is also its largest city.", prompt="The capital city of France is")["degenerate"] is False


def test_a_unit_glued_to_the_front_of_a_json_answer():
    for fragment, prefix in (("json_prefix_ollama_10929", '{"'), ("json_prefix_ollama_18441", ".")):
        res = verdict(fragment)
        assert res["reason"] == "json_prefix" and res["details"]["json_prefix"] == prefix
    res = dg.detect('!!!!!!{"answer": "Paris"}')
    assert res["reason"] == "repeated_unit" and res["details"]["leading_unit"] == "!"


def test_a_reasoning_end_tag_leaked_between_two_answers():
    # gpt-oss's Harmony channel names glued to the text once the special tokens were dropped (textgen#7374)
    assert verdict("reasoning_leak_textgen_7374")["reason"] == "template_leak"
    # no published example of "answer </think> answer" was found: constructed from the tag the parsers split on
    res = dg.detect("Paris\n</think>\n\nParis")
    assert res["reason"] == "reasoning_leak" and "Paris" in res["evidence"][0]
    assert dg.detect("<think>\nThe user wants a city.\n</think>\n\nParis\n</think>\n\nParis")["reason"] == "reasoning_leak"
    # one reasoning block, opened by the template (no <think> in the output), is a thinking model's answer
    assert dg.detect(real("reasoning_then_answer_deepseek"))["degenerate"] is False


def test_code_that_dissolves_into_repeated_lines():
    res = verdict("code_loop_vscode_254259")
    assert res["reason"] == "repeating_loop" and "planeDetection" in res["details"]["loop_unit"]


def test_loops_of_units_words_and_phrases():
    assert verdict("unit_loop_llamacpp_8801")["reason"] == "repeated_character"              # sumsumsum
    assert verdict("unit_loop_dgx_spark_playbooks_76")["reason"] == "repeated_character"     # 's's's't's
    assert verdict("word_loop_llamacpp_14228_finetune")["reason"] == "repeated_token"        # Tạng Tạng Tạng
    assert verdict("duplicated_phrases_ipychat_4")["reason"] == "near_repeating_loop"        # each phrase twice
    assert verdict("phrase_loop_litgpt_1663")["reason"] in ("repeating_loop", "symbol_salad")


def test_quiet_on_code_json_tables_cjk_latex_one_word_answers_and_lists():
    for fragment in ("code_hipfire_769", "json_lm_format_enforcer_94", "json_sendnn_inference_903", "table_aws_genai",
                     "cjk_list_lorax_103", "cjk_list_vllm_19839", "cjk_short_csghub_1450", "latex_hipfire_769_math",
                     "latex_lm_evaluation_harnes_3210", "one_word_ctranslate2_1708", "list_numbers_railtracks_1430",
                     "math_lm_evaluation_harnes_2454", "poem_ogx_529", "german_short_deepseek_llm_9"):
        res = dg.detect(real(fragment))
        assert res["degenerate"] is False and res["evidence"] == [], (fragment, res)


def test_a_wrong_answer_in_plain_words_is_not_garbage():
    # flan-t5 at TP 2 answered "john f kennedy": wrong, but language (the known-answer check's case)
    assert dg.detect(real("wrong_but_language_ctranslate2"))["degenerate"] is False


# ---------------------------------------------------------------------------------------------------
# Language: the word lists, other languages, and what is not judged by word.
# ---------------------------------------------------------------------------------------------------

LANGUAGES = {
    "fr": "La capitale de la France est Paris. C'est aussi la plus grande ville du pays, située au nord sur la Seine.",
    "de": "Der Server startet nicht, weil der Grafikspeicher bereits belegt ist. Prüfen Sie mit nvidia-smi, welcher Prozess "
          "den Speicher hält, beenden Sie ihn und starten Sie den Dienst danach erneut.",
    "es": "La capital de Francia es París. Es la ciudad más grande del país y se encuentra a orillas del río Sena.",
    "it": "La capitale della Francia è Parigi, la città più grande del paese, attraversata dalla Senna.",
    "pt": "A capital da França é Paris, a maior cidade do país, às margens do rio Sena.",
    "nl": "De hoofdstad van Frankrijk is Parijs. Het is de grootste stad van het land en ligt aan de Seine.",
    "pl": "Stolicą Francji jest Paryż. To największe miasto w kraju, położone nad Sekwaną w północnej części Francji.",
    "tr": "Fransa'nın başkenti Paris'tir. Ülkenin en büyük şehri olan Paris, Seine nehrinin kıyısında kuruludur.",
    "fi": "Ranskan pääkaupunki on Pariisi. Se on maan suurin kaupunki, joka sijaitsee Seine-joen varrella.",
    "sv": "Frankrikes huvudstad är Paris. Det är landets största stad och ligger vid floden Seine.",
    "cs": "Hlavním městem Francie je Paříž. Je to největší město země a leží na řece Seině.",
    "id": "Ibu kota Prancis adalah Paris. Kota ini adalah kota terbesar di negara itu dan terletak di tepi sungai Seine.",
    "vi": "Thủ đô của Pháp là Paris. Đây là thành phố lớn nhất của đất nước và nằm bên bờ sông Seine.",
    "ru": "Столица Франции — Париж. Это крупнейший город страны, расположенный на реке Сене.",
}


@pytest.mark.parametrize("lang", sorted(LANGUAGES))
def test_other_languages_are_judged_in_their_own_list(lang):
    res = dg.detect(LANGUAGES[lang])
    assert res["degenerate"] is False and res["details"]["language"] == lang, res


NOT_JUDGED_BY_WORD = {
    "ja": "フランスの首都はパリです。パリはセーヌ川のほとりにあるフランス最大の都市で、GPUを使って計算します。",
    "zh": "法国的首都是巴黎。巴黎是法国最大的城市，位于塞纳河畔。我们使用GPU和vLLM进行推理。",
    "ko": "프랑스의 수도는 파리입니다. 파리는 프랑스에서 가장 큰 도시이며 센강 옆에 있습니다. GPU를 사용합니다.",
    "ar": "عاصمة فرنسا هي باريس، وهي أكبر مدينة في البلاد.",
    "names": "Kathmandu, Ulaanbaatar, Reykjavik, Addis Ababa, Thimphu, Ouagadougou, Antananarivo, Naypyidaw",
    "pinyin": "Nǐ hǎo! Wǒ shì yí gè rén gōng zhì néng zhù shǒu.",
    "shell": "sudo systemctl restart sglang.service\njournalctl -u sglang.service -n 50 --no-pager",
    "math": "x = (-b ± √(b² - 4ac)) / 2a",
    "display_math": "$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$",
}


@pytest.mark.parametrize("label", sorted(NOT_JUDGED_BY_WORD))
def test_cjk_names_commands_and_math_are_not_taken_for_salad(label):
    res = dg.detect(NOT_JUDGED_BY_WORD[label])
    assert res["degenerate"] is False, res


FORMATS = {
    "traceback": 'Traceback (most recent call last):\n  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", '
                 'line 2124, in run_scheduler_process\n    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)\n'
                 'RuntimeError: CUDA error: out of memory',
    "diff": "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-import os\n+import os, sys\n def f():\n-    return 1\n+    return 2",
    "dockerfile": 'FROM python:3.11-slim\nRUN pip install --no-cache-dir sglang[all]==0.5.9\nENV HF_HOME=/models\nEXPOSE 30000\n'
                  'CMD ["python3", "-m", "sglang.launch_server", "--model-path", "/models/qwen", "--tp", "2"]',
    "css": ".card {\n  display: flex;\n  padding: 1rem;\n}\n.card:hover {\n  box-shadow: 0 0 4px rgba(0, 0, 0, 0.2);\n}",
    "pip_freeze": "torch==2.9.1\ntransformers==4.57.1\nflashinfer-python==0.6.8.post1\nsgl-kernel==0.3.21",
    "model_names": "Qwen3-8B, Llama-3.1-70B-Instruct, Mistral-Small-24B-Instruct-2501, gemma-3-27b-it, DeepSeek-V3",
    "stanzas": "Row, row, row your boat,\nGently down the stream.\nMerrily, merrily, merrily, merrily,\nLife is but a dream.\n\n" * 2,
    "emoji_reply": "Sure thing! \U0001F60A Here is a quick summary:\n\n\u2705 Driver installed\n\u2705 GPUs bound to nvidia\n\u26a0\ufe0f Reboot pending",
    "sql_result": " id | name  | gpus\n----+-------+------\n  1 | kpro5 |    2\n  2 | kpro6 |    4\n(2 rows)",
    "box_table": "\u250c\u2500\u2500\u252c\u2500\u2500\u2510\n\u2502 GPU \u2502 MiB \u2502\n\u2502 0 \u2502 512 \u2502\n"
                 "\u2514\u2500\u2500\u2534\u2500\u2500\u2518",
    "plain_talk": "It is what it is, and there is not much that we can do about it now, so let us just go on and see what will "
                  "come of it in the end.",
    "dense_prose": "Tensor parallelism splits weight matrices across GPUs; pipeline parallelism assigns consecutive layers to "
                   "different devices. Expert parallelism distributes mixture-of-experts layers, while data parallelism "
                   "replicates complete models. Hybrid configurations combine these strategies, balancing memory capacity, "
                   "interconnect bandwidth, latency requirements and throughput targets.",
    "hungarian": "Franciaország fővárosa Párizs, amely a Szajna partján fekszik. A város leghíresebb látnivalói közé tartozik "
                 "az Eiffel-torony, a Louvre múzeum, a Notre-Dame székesegyház és a Diadalív.",
    "german_compounds": "Die Bundesregierung beschloss umfangreiche Maßnahmen zur Digitalisierung öffentlicher "
                        "Verwaltungsprozesse, Modernisierung veralteter Infrastruktur sowie Stärkung regionaler "
                        "Wirtschaftsstrukturen. Kommunale Entscheidungsträger begrüßten diese Initiativen grundsätzlich.",
    "catalan": "El model respon correctament amb una sola targeta, però amb dues targetes el text esdevé incoherent.",
}


@pytest.mark.parametrize("label", sorted(FORMATS))
def test_other_formats_and_plain_or_dense_prose_stay_quiet(label):
    res = dg.detect(FORMATS[label])
    assert res["degenerate"] is False, res


def test_lists_made_from_a_template_are_not_loops():
    caps = [("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Poland", "Warsaw"), ("Austria", "Vienna"),
            ("Portugal", "Lisbon"), ("Greece", "Athens")]
    for text in ("".join("Q: What is the capital of %s?\nA: %s\n\n" % c for c in caps),
                 " Paris.\n" + "".join("The capital city of %s is %s.\n" % c for c in caps),
                 "<ul>\n" + "\n".join('  <li><a href="/c/%s">%s</a></li>' % (c[0].lower(), c[1]) for c in caps) + "\n</ul>",
                 "- a\n- b\n- c\n- d\n- e\n- f\n- g", "A, B, C, D, E, F, G", "Yes, yes, yes!"):
        assert dg.detect(text)["degenerate"] is False, text


def test_word_lists_are_wordfreq_frequency_bands():
    assert set(WORDS) >= {"en", "de", "fr", "es", "it", "pt", "nl", "pl", "ru"}
    for lang, bands in WORDS.items():
        zipfs = [band[0] for band in bands]
        assert zipfs == sorted(zipfs, reverse=True) and zipfs[-1] >= 3.0, lang
    lex = language.lexicon()
    assert len(lex["en"]) > 19000 and lex["en"]["the"] == 7.5 and "scalablytyped" not in lex["en"]
    assert "wordfreq 3.1.1" in language_words.__doc__ and "CC BY-SA 4.0" in language_words.__doc__


def test_result_carries_confidence_and_evidence():
    res = dg.detect("4")
    assert res["degenerate"] is False and res["evidence"] == [] and 0.5 <= res["confidence"] < 0.8   # a bare number says little
    res = dg.detect(" Paris. It is the capital and most populous city of France, with an estimated population of")
    assert res["degenerate"] is False and res["confidence"] >= 0.9
    res = dg.detect(real("short_token_salad_llamacpp_14228"))
    assert res["details"]["unknown_share"] >= 0.5 and res["details"]["judged_words"] >= 3


def test_drift_into_salad_is_found_in_the_tail():
    # a long coherent answer that ends in token salad: the salad is judged on the last third
    text = real("thinking_qwen3_habana_1942") + " " + real("prose_exllamav2_728") + " " + real("subword_gibberish_eagle_258")
    res = dg.detect(text)
    assert res["degenerate"] and res["reason"] == "nonword_salad" and res["details"]["salad_in"] == "tail"


# --- constructed cases: regressions and the classes without a real example --------------------

DEGENERATE = [
    # the incident this project started from (docs/troubleshooting.md, degenerate_output: "the seed's \n\n"): SGLang
    # 0.5.9 with MTP, Qwen3.6-27B at TP=2, after "Application startup complete" generated "\n\n" repeatedly and stopped.
    # No public copy of that output exists; sgl-project/sglang#19393 (fixed by PR #19411, after 0.5.9) reports the
    # same class, repetitive output of Qwen3.5-27B at tp=2.
    ("seed_newlines", "\n\n", "whitespace_only"),
    ("seed_newlines_run", "\n\n" * 20, "whitespace_only"),
    ("empty", "", "empty"),
    ("none", None, "empty"),
    ("bangs", "!" * 100, "repeated_character"),
    ("bangs_after_text", "Sure, here is the answer:" + "!" * 300, "repeated_character"),
    ("dollar_loop", "Weng earns $12 per hour. " + "$2 an hour " * 200, "repeating_loop"),
    ("think_loop", "<think>\n" * 60, "repeating_loop"),
    ("reasoning_loop",
     "Let me think about the capital of France. "
     + ("The user asks for the capital of France. I should answer with the city name and nothing else, so the answer is the capital city. ") * 6,
     "repeating_loop"),
    ("one_word", "the " * 40, "repeating_loop"),
    ("newlines_inside_text", "Paris" + "\n" * 12 + "is", "newline_run"),
    ("replacement", "Paris \ufffd\ufffd\ufffd\ufffd is", "replacement_characters"),
    ("mojibake", "The caf\u00c3\u00a9 is \u00e2\u20ac\u0153open\u00e2\u20ac\u009d, na\u00c3\u00afve \u00c3\u00a9t\u00c3\u00a9", "mojibake"),
    ("control", "ok" + "\x00\x01\x02\x03" * 5, "control_characters"),
    ("two_words", " ".join(["yes", "no"] * 5 + ["yes"] * 20), "repeating_loop"),
    ("separator_flood", "=" * 500, "repeated_character"),
    ("near_empty_json", '{"', "near_empty_structured"),
    ("symbol_salad", "# # # // ## / // # ### // #", "symbol_salad"),
    # a paragraph loop whose repeats vary: no exact period, most 6-grams seen three times or more
    ("paragraph_loop_varied", "\n\n".join(
        "The correct answer is actually %s. However, we should double-check the numbers before we answer, because the "
        "question asks for the total and not the difference, so let me compute it again from the start." % n
        for n in ("12", "14", "12", "13", "12", "15")), "near_repeating_loop"),
]

NORMAL = [
    ("short_number", "4"),
    ("short_word", "Paris"),
    ("short_sentence", " Paris. It is also the largest city of France."),
    ("two_newlines_paragraphs", "First paragraph.\n\nSecond paragraph.\n\nThird one."),
    ("starts_with_newlines", "\n\nThe capital of France is Paris."),
    ("code", "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
             "def main():\n    for i in range(10):\n        print(i, fib(i))\n\n\nif __name__ == '__main__':\n    main()\n"),
    ("code_with_separator", "# " + "=" * 76 + "\n# Helpers\n# " + "=" * 76 + "\nimport os\nimport sys\n\n"
                            "def read(path):\n    with open(path) as f:\n        return f.read()\n"),
    ("markdown_list", "Steps:\n" + "\n".join("%d. Install package number %d and check its version." % (i, i) for i in range(1, 31))),
    ("markdown_table", "| name | size |\n|------|------|\n" + "\n".join("| file%d | %d MiB |" % (i, i * 7) for i in range(20))),
    ("json", json.dumps({"gpus": [{"index": i, "name": "NVIDIA RTX A6000", "memory_total_mib": 49140, "memory_used_mib": 0}
                                  for i in range(2)], "driver": "580.126.09"}, indent=2)),
    ("json_records", json.dumps([{"id": i, "status": "ok", "region": "eu-west-1"} for i in range(12)])),
    ("json_list_of_zeros_short", "[0, 0, 0, 0]"),
    ("poem_with_refrain", "The river runs beneath the hill,\nthe night is long, the air is still.\n"
                          "Sing low, sing low, the morning comes.\n\n"
                          "The lanterns fade along the quay,\nthe boats go out into the grey.\n"
                          "Sing low, sing low, the morning comes.\n\n"
                          "The bells have rung for those at sea,\nthe harbour waits for you and me.\n"
                          "Sing low, sing low, the morning comes.\n"),
    ("unicode_text", "München, Zürich and São Paulo \u2014 \u201cquoted\u201d text, naïve café, 東京 and 北京."),
    ("hello_in_many_languages", "Hello in six languages: Bonjour (French), Hola (Spanish), Привет (Russian), こんにちは "
                                "(Japanese), مرحبا (Arabic) and 안녕하세요 (Korean)."),
    ("list_of_names", "Paris, London, Berlin, Madrid, Rome, Vienna, Prague, Warsaw, Lisbon, Dublin, Athens, Oslo, "
                      "Helsinki, Stockholm, Copenhagen, Brussels, Amsterdam, Bern, Budapest, Bucharest, Sofia, Zagreb, "
                      "Ljubljana, Bratislava, Vilnius, Riga, Tallinn, Valletta, Nicosia, Luxembourg"),
    ("french_prose", "La capitale de la France est Paris. C'est aussi la plus grande ville du pays, et elle se trouve au "
                     "nord, sur la Seine. Paris est connue pour ses musées, ses monuments et sa cuisine, et elle accueille "
                     "chaque année des millions de visiteurs venus du monde entier."),
    ("la_la", "La la la, the song goes on, and then it ends."),
    ("laughing_once", "That joke again? Hahahaha, fine: the answer is still 42."),
    ("chat_think", "<think>\nThe user asks 2+2. That is 4.\n</think>\n\n4"),
    ("big_number", "2 to the power of 100 is 1267650600228229401496703205376."),
]


@pytest.mark.parametrize("label,text,reason", DEGENERATE, ids=[d[0] for d in DEGENERATE])
def test_constructed_degenerate(label, text, reason):
    res = dg.detect(text)
    assert res["degenerate"] is True and res["reason"] == reason, res
    assert dg.is_degenerate(text)


@pytest.mark.parametrize("label,text", NORMAL, ids=[n[0] for n in NORMAL])
def test_constructed_normal(label, text):
    res = dg.detect(text)
    assert res["degenerate"] is False and res["reason"] is None, res


def test_loop_details():
    d = dg.detect("Weng earns $12 per hour. " + "$2 an hour " * 200)["details"]
    assert d["loop_period_tokens"] == 4 and d["loop_unit"] == "$ 2 an hour" and d["loop_repeats"] >= 199
    d = dg.detect(real("phrase_loop_mlx_lm_455"))["details"]
    assert d["loop_repeats"] >= 3 and d["compression_ratio"] < 0.3
    d = dg.detect(real("drift_vllm_metax_261"))["details"]
    assert d["loop_coverage"] >= 0.5


def test_long_loop_at_the_end_of_a_long_text():
    text = NORMAL[11][1] * 3 + " " + "I will now repeat myself. " * 300
    res = dg.detect(text)
    assert res["degenerate"] and res["reason"] == "repeating_loop"


def test_non_string_input_is_stringified():
    assert dg.detect(4)["degenerate"] is False
