# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is a model's completion degenerate? (garbage a broken server or a bad speculative draft produces)

Used by the completion gate's smoke probe (SGLang's own warmup only checks HTTP 200) and by the
``kpro.gpu_serving.degenerate`` filter.

Why hand-written: no well-kept library answers this question. Language identifiers, perplexity
scorers and toxicity classifiers need a model or large tables, and none of them says "this is the
garbage an inference engine emits". What broken servers emit is recognisable with a few simple,
explainable statistics, each checked against real published outputs (tests/unit/fixtures/outputs):

- emptiness and whitespace: nothing, only whitespace, runs of newlines, near-empty JSON (``{"``);
- encoding damage: U+FFFD, UTF-8 read as Latin-1, control characters;
- chat-template or special tokens re-emitted (``<|im_start|>``, ``<|assistant|>``, ``[control_12]``);
- symbols without a letter or digit (``# # # //``);
- runaway digits (a number that never ends);
- loops: one character or a short unit repeated; a token sequence repeated exactly; a sequence
  repeated with small variations (the share of tokens covered by 6-grams seen 3+ times);
  words duplicated in place (what a speculative draft that is not verified properly leaves);
- salads: letters of many scripts glued into the same words (multilingual token salad); Latin
  prose without the function words every language needs (sub-word gibberish, word salad); both
  also on the last third of a long text, which catches a coherent start that drifts into garbage.

Thresholds are chosen so that the real normal outputs in the fixtures stay silent: one-word answers,
lists with repeated structure, JSON with odd whitespace, code, LaTeX, text that starts with
newlines, CJK text and mixed Chinese/English. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import json
import re
import unicodedata
import zlib
from collections import Counter

# Thresholds (exposed so callers can tune them).
MIN_NEWLINE_RUN = 8            # this many newlines in a row (blank lines allowed to hold spaces)
MAX_WHITESPACE_FRACTION = 0.6  # of the text, for texts of 16+ characters
MIN_CHAR_RUN = 10              # a run of one non-space character counts toward "repeated character"
MIN_UNIT_REPEATS = 8           # ... or a unit of 2-8 characters repeated this many times ("nynyny...")
MAX_CHAR_RUN_FRACTION = 0.5    # of the non-space characters, for texts of 16+ non-space characters
MIN_LOOP_TOKENS = 24           # a loop must cover at least this many tokens ...
MIN_LOOP_FRACTION = 0.3        # ... and this fraction of all tokens (or MIN_LOOP_ABS tokens)
MIN_LOOP_ABS = 200
MIN_LOOP_REPEATS = 4           # consecutive repeats of a short unit (period < 8 tokens) ...
MIN_LOOP_REPEATS_LONG = 3      # ... or of a long one (a sentence or paragraph)
MAX_LOOP_PERIOD = 256
MAX_ANALYSED_TOKENS = 4000
NEAR_LOOP_N = 6                # n-grams of this many tokens ...
NEAR_LOOP_MIN_COUNT = 3        # ... seen this often ...
NEAR_LOOP_COVERAGE = 0.5       # ... covering this share of 40+ tokens: a loop whose repeats vary
MIN_DUPLICATE_RUNS = 3         # separate places where a word is immediately repeated ("for for") ...
MIN_DUPLICATE_FRACTION = 0.02  # ... per word
MIN_DIGIT_RUN = 50             # digits in a row
MAX_TOP_TOKEN_FRACTION = 0.5   # one word making more than half of 20+ words ...
MAX_TOP_TOKEN_DISTINCT = 3     # ... among at most this many distinct words
MIN_DISTINCT_RATIO = 0.12      # distinct/total word tokens, for 100+ words
MAX_REPLACEMENT = 3            # U+FFFD characters
MAX_MOJIBAKE = 3               # UTF-8-read-as-Latin-1 sequences ("Ã©", "â€™")
MAX_CONTROL_FRACTION = 0.05    # C0/C1 control characters other than \t \n \r
MIN_SALAD_SCRIPTS = 3          # scripts with letters in the text ...
MIN_MIXED_TOKENS = 3           # ... and words whose letters come from several of them
MIN_MIXED_FRACTION = 0.05      # ... per word
MIN_PROSE_WORDS = 30           # Latin prose of this many words ...
MAX_FUNCTION_WORD_FRACTION = 0.12  # ... with fewer function words than this is a word salad
MAX_SYNTAX_FRACTION = 0.08     # characters of code/markup syntax above which a text is not prose

MAX_SEPARATOR_WIDTH = 120
_SEPARATOR_CHARS = "=-_*#~+.|/\\<>"
_CHAR_RUN_RE = re.compile(r"(\S)\1{%d,}" % (MIN_CHAR_RUN - 1))
_UNIT_RUN_RE = re.compile(r"(\S{2,8}?)\1{%d,}" % (MIN_UNIT_REPEATS - 1))
_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_WORD_RE = re.compile(r"\w+", re.UNICODE)
_LETTER_WORD_RE = re.compile(r"[^\W\d_]+", re.UNICODE)
_NEWLINE_RUN_RE = re.compile(r"(?:[ \t]*\r?\n){%d,}" % MIN_NEWLINE_RUN)
_DIGIT_RUN_RE = re.compile(r"\d{%d,}" % MIN_DIGIT_RUN)
_MOJIBAKE_RE = re.compile(u"(?:\u00c3[\u0080-\u00bf]|\u00e2\u20ac[\u0098-\u009d\u2122\u0153\u201c\u201d\u2018\u2019\u00a6\u00a2]"
                          u"|\u00c2[\u00a0-\u00bf]|\u00e2\u20ac)")
_CONTROL_RE = re.compile(u"[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]")
# Chat-template markers and special tokens that a working server strips or stops at.
_TEMPLATE_RE = re.compile(r"<\|(?:im_start|im_end|im_sep|endoftext|system|user|assistant|end|eot_id|eom_id|start_header_id"
                          r"|end_header_id|begin_of_text|end_of_text|fim_prefix|fim_suffix|fim_middle|reserved_special_token_\d+)\|>"
                          r"|\[control_\d+\]")
_SYNTAX_CHARS = frozenset("{}[]()<>=;:\"`|\\/_#*$&^%@~+")
# Function words of the languages written in Latin script that answers come in; a text in any of
# them has plenty. Word salad and sub-word gibberish have almost none.
_FUNCTION_WORDS = frozenset((
    # en
    "the of and to a in is it that for you i on with as are be this was have not or at by an from but they we he she his "
    "her their its my your our me him them what which who when where how all can will would there so if do does did no yes "
    "than then just also about into out up more some one"
    # de, fr, es, it, pt, nl
    " der die das und ist nicht ein eine zu den mit von sich des auf für im dem le la les de des un une et est en du que qui "
    "dans pour pas sur au avec ce il elle nous vous ils el los las y por con para se del al lo gli di che per della è o os as "
    "em um uma não do da het een van dat op te niet met voor zijn"
    # tr, id, vi, sv
    " ve bir bu da için ile ne çok daha gibi yang dan di ini itu dengan untuk dari dalam tidak và của là có không được cho "
    "những các och att som är på för med inte").split())


def detect(text, min_loop_tokens=MIN_LOOP_TOKENS):
    """Return dict(degenerate: bool, reason: str | None, details: dict) for one completion text.

    Reasons: empty, whitespace_only, near_empty_structured, symbol_salad, template_leak, newline_run, whitespace_heavy,
    replacement_characters, mojibake, control_characters, runaway_digits, repeated_character,
    repeating_loop, near_repeating_loop, duplicated_words, repeated_token, low_diversity,
    multilingual_salad, word_salad.
    """
    if text is None:
        return _res(True, "empty", {"length": 0})
    if not isinstance(text, str):
        text = str(text)
    details = {"length": len(text)}
    for check in _CHECKS:
        reason = check(text, details, min_loop_tokens)
        if reason:
            return _res(True, reason, details)
    return _res(False, None, details)


def is_degenerate(text):
    return detect(text)["degenerate"]


def _res(deg, reason, details):
    return {"degenerate": deg, "reason": reason, "details": details}


# --------------------------------------------------------------------------------------------
# The checks, in order: each returns a reason or None and records its numbers in ``details``.
# --------------------------------------------------------------------------------------------

def _check_empty(text, details, _opt):
    if text == "":
        return "empty"
    if not text.strip():
        details["newlines"] = text.count("\n")
        return "whitespace_only"
    stripped = text.strip()
    if stripped[0] in "{[" and len(stripped) <= 16 and not re.search(r"\w", stripped):
        # '{"', '{}', '[]' and the like: structured output with nothing in it
        details["structured_text"] = stripped
        return "near_empty_structured"
    return None


def _check_symbols(text, details, _opt):
    """Symbols without a letter or digit ("# # # // ## /"), unless it is a separator line."""
    nonspace = "".join(text.split())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # rules such as "-----" or "=-=-=" are formatting: one or two characters, no spaces
    rules = all(len(set(line)) <= 2 and " " not in line for line in lines)
    if len(nonspace) >= 16 and not re.search(r"\w", nonspace) and not rules:
        details["symbols"] = len(nonspace)
        return "symbol_salad"
    return None


def _check_template(text, details, _opt):
    found = _TEMPLATE_RE.findall(text)
    if found:
        details.update({"template_tokens": len(found), "template_token": found[0]})
        return "template_leak"
    return None


def _check_whitespace(text, details, _opt):
    m = _NEWLINE_RUN_RE.search(text)
    if m:
        details["newline_run"] = m.group(0).count("\n")
        return "newline_run"
    ws = sum(1 for ch in text if ch.isspace())
    if len(text) >= 16 and ws / float(len(text)) > MAX_WHITESPACE_FRACTION:
        details["whitespace_fraction"] = round(ws / float(len(text)), 2)
        return "whitespace_heavy"
    return None


def _check_encoding(text, details, _opt):
    rep = text.count(u"\ufffd")
    if rep >= MAX_REPLACEMENT:
        details["replacement_characters"] = rep
        return "replacement_characters"
    moji = len(_MOJIBAKE_RE.findall(text))
    if moji >= MAX_MOJIBAKE:
        details["mojibake_sequences"] = moji
        return "mojibake"
    ctrl = len(_CONTROL_RE.findall(text))
    if ctrl and ctrl / float(len(text)) > MAX_CONTROL_FRACTION:
        details["control_characters"] = ctrl
        return "control_characters"
    return None


def _check_digits(text, details, _opt):
    runs = [len(m) for m in _DIGIT_RUN_RE.findall(text)]
    if runs:
        details["digit_run"] = max(runs)
        return "runaway_digits"
    return None


def _is_separator(run, text, start, end):
    """A separator line ("=====", "-----", "|---|") of normal width is formatting, not a loop."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line = text[line_start:len(text) if line_end < 0 else line_end].strip()
    return set(run) <= set(_SEPARATOR_CHARS) and len(run) <= MAX_SEPARATOR_WIDTH and len(line) <= MAX_SEPARATOR_WIDTH + 4


def _check_char_runs(text, details, _opt):
    nonspace = sum(1 for ch in text if not ch.isspace())
    if nonspace < 16:
        return None
    covered = set()
    for rx in (_CHAR_RUN_RE, _UNIT_RUN_RE):
        for m in rx.finditer(text):
            if not _is_separator(m.group(0), text, m.start(), m.end()):
                covered.update(range(m.start(), m.end()))
    if len(covered) / float(nonspace) > MAX_CHAR_RUN_FRACTION:
        details["repeated_character_fraction"] = round(len(covered) / float(nonspace), 2)
        return "repeated_character"
    return None


def _longest_periodic_run(tokens, max_period=MAX_LOOP_PERIOD):
    """(period, start, length) of the longest stretch where tokens[i] == tokens[i - period]."""
    best = (0, 0, 0)
    n = len(tokens)
    for p in range(1, min(max_period, n // 2) + 1):
        run = 0
        for i in range(p, n):
            if tokens[i] == tokens[i - p]:
                run += 1
                if run + p > best[2]:
                    best = (p, i - run - p + 1, run + p)
            else:
                run = 0
    return best


def _tokens(text, details):
    tokens = _TOKEN_RE.findall(text)
    details["tokens"] = len(tokens)
    # a loop that runs until max_tokens sits at the end
    return tokens[-MAX_ANALYSED_TOKENS:]


def _check_exact_loop(text, details, min_loop_tokens):
    tokens = _tokens(text, details)
    if len(tokens) < 4:
        return None
    period, start, length = _longest_periodic_run(tokens)
    repeats = length / float(period) if period else 0
    need = MIN_LOOP_REPEATS if period < 8 else MIN_LOOP_REPEATS_LONG
    if period and repeats >= need and length >= min_loop_tokens and \
            (length >= MIN_LOOP_FRACTION * len(tokens) or length >= MIN_LOOP_ABS):
        details.update({"loop_period_tokens": period, "loop_repeats": round(repeats, 1), "loop_tokens": length,
                        "loop_unit": " ".join(tokens[start:start + period])[:120]})
        return "repeating_loop"
    return None


def _is_json(text):
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _check_near_loop(text, details, _opt):
    """Repeats that vary a little ("thank-you" / "thank-youso much"; a sentence that shrinks each pass)."""
    tokens = _TOKEN_RE.findall(text)[-MAX_ANALYSED_TOKENS:]
    if len(tokens) < 40 or _is_json(text.strip()):
        return None     # a complete JSON document ended; records that share their keys are not a loop
    n = NEAR_LOOP_N
    grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    covered = set()
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        # one token repeated ("= = = =") is a character run: separators are judged there
        if grams[gram] >= NEAR_LOOP_MIN_COUNT and len(set(gram)) > 1:
            covered.update(range(i, i + n))
    coverage = len(covered) / float(len(tokens))
    if coverage >= NEAR_LOOP_COVERAGE:
        details.update({"loop_coverage": round(coverage, 2),
                        "compression_ratio": round(len(zlib.compress(text.encode("utf-8"))) / float(len(text.encode("utf-8"))), 2)})
        return "near_repeating_loop"
    return None


def _check_duplicates(text, details, _opt):
    """Words repeated in place ("for for x in in arr"): tokens a speculative draft emitted twice."""
    words = [w.lower() for w in _LETTER_WORD_RE.findall(text)]
    runs = sum(1 for i in range(1, len(words)) if words[i] == words[i - 1] and (i < 2 or words[i - 1] != words[i - 2]))
    if runs >= MIN_DUPLICATE_RUNS and runs / float(len(words)) >= MIN_DUPLICATE_FRACTION:
        details["duplicated_word_runs"] = runs
        return "duplicated_words"
    return None


def _check_word_stats(text, details, _opt):
    words = [w.lower() for w in _WORD_RE.findall(text)]
    if len(words) < 20:
        return None
    counts = Counter(words)
    top, top_n = counts.most_common(1)[0]
    if top_n / float(len(words)) > MAX_TOP_TOKEN_FRACTION and len(counts) <= MAX_TOP_TOKEN_DISTINCT:
        details.update({"top_token": top, "top_token_fraction": round(top_n / float(len(words)), 2)})
        return "repeated_token"
    if len(words) >= 100 and len(counts) / float(len(words)) < MIN_DISTINCT_RATIO:
        details["distinct_ratio"] = round(len(counts) / float(len(words)), 3)
        return "low_diversity"
    return None


def _script(ch):
    """The writing system of a letter, with the CJK family (Han, kana) as one."""
    try:
        first = unicodedata.name(ch).split()[0]
    except ValueError:
        return None
    if first in ("CJK", "HIRAGANA", "KATAKANA", "HALFWIDTH", "FULLWIDTH", "IDEOGRAPHIC"):
        return "CJK"
    return first


def _scripts(word):
    return set(s for s in (_script(ch) for ch in word if ch.isalpha()) if s)


def _script_salad(text, details):
    letters = Counter(s for s in (_script(ch) for ch in text if ch.isalpha()) if s)
    scripts = [s for s, n in letters.items() if n >= 3]
    if len(scripts) < MIN_SALAD_SCRIPTS:
        return False
    words = text.split()
    # normal multilingual text keeps each word in one script; salad glues them ("Votingेव223", "salon全面")
    mixed = [w for w in words if len(_scripts(w)) >= 2]
    if len(mixed) >= MIN_MIXED_TOKENS and len(mixed) / float(len(words)) >= MIN_MIXED_FRACTION:
        details.update({"scripts": sorted(scripts), "mixed_script_words": len(mixed)})
        return True
    return False


def _is_list(text):
    """Comma-, semicolon- or line-separated short items (a list of names has no function words either)."""
    items = [s for s in re.split(r"[,;\n]", text) if s.strip()]
    short = [s for s in items if len(s.split()) <= 3]
    return len(items) >= 10 and len(short) >= 0.6 * len(items)


def _word_salad(text, details):
    nonspace = [ch for ch in text if not ch.isspace()]
    if not nonspace or sum(1 for ch in nonspace if ch in _SYNTAX_CHARS) / float(len(nonspace)) > MAX_SYNTAX_FRACTION:
        return False    # code, JSON, markup: not prose
    words = _LETTER_WORD_RE.findall(text)
    latin = [w for w in words if _scripts(w) == set(["LATIN"])]
    if len(latin) < MIN_PROSE_WORDS or len(latin) < 0.7 * len(words) or _is_list(text):
        return False
    fraction = sum(1 for w in latin if w.lower() in _FUNCTION_WORDS) / float(len(latin))
    if fraction < MAX_FUNCTION_WORD_FRACTION:
        details["function_word_fraction"] = round(fraction, 3)
        return True
    return False


def _tail(text):
    """The last third of a long text: where a coherent start drifts into garbage."""
    words = text.split()
    if len(words) < 3 * MIN_PROSE_WORDS:
        return None
    return " ".join(words[-(len(words) // 3):])


def _check_salads(text, details, _opt):
    for part, where in ((text, "text"), (_tail(text), "tail")):
        if part is None:
            continue
        if _script_salad(part, details):
            details["salad_in"] = where
            return "multilingual_salad"
        if _word_salad(part, details):
            details["salad_in"] = where
            return "word_salad"
    return None


_CHECKS = (_check_empty, _check_template, _check_whitespace, _check_encoding, _check_digits, _check_char_runs, _check_symbols,
           _check_exact_loop, _check_near_loop, _check_salads, _check_duplicates, _check_word_stats)
