# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is a model's completion degenerate? (garbage a broken server or a bad speculative draft produces)

Used by the completion gate (its content probe and its known-answer checks, module_utils/serve/sglang_ready.py and
known_answer.py, inside the container, on the target's Python), by the log diagnosis (sglang_log.py) and by the
``kpro.gpu_serving.degenerate`` filter (on the controller).

It judges language, not examples: what makes a text language is checked in general terms, each with its evidence.

- structure: nothing, only whitespace, runs of newlines, near-empty JSON (``{"``), symbols with few letters in them
  (``38"4EC$!31=.4<H0+``), punctuation without words (``, , the,``), lines that are single symbols;
- encoding damage: U+FFFD, UTF-8 read as Latin-1, control characters;
- leakage: chat-template and special tokens of any family (``<|...|>``, ``<end_of_turn>``, ``<pad>``, ``[control_12]``,
  ``⁇``, byte tokens), a reasoning end tag between an answer and its repeat, Harmony channel names glued to the text;
- repetition at several scales (module_utils/serve/repetition.py): a character or short unit, a unit glued to the front
  of the answer, a token sequence repeated exactly, a loop whose repeats vary, a sentence said twice in a row,
  words duplicated in place, a text made of one word; the compression ratio is reported;
- words (module_utils/serve/language.py): each word looked up in word-frequency lists of 31 languages (the share of words
  no list knows, which ones), words glued from two scripts, and the frequency profile (prose without function words
  is a salad of real words; function words alone are one too), on the whole text and on its last third;
- the prompt, where the caller has it: an answer that only echoes the prompt.

Why a vendored word list and not the ``wordfreq`` library: the gate runs as an Ansible module on the container's
system Python, where only what AnsiballZ ships (the collection's Python files) is there; wordfreq would need pip there
plus regex, msgpack, langcodes and ftfy (about 30 MB with its data). module_utils/serve/language_words.py holds wordfreq's
own lists (CC BY-SA 4.0), cut to the frequent words: English to Zipf 3.3 (19.6k words), de, fr, es, it, pt, nl to 4.3,
the other 24 languages wordfreq has in Latin or Cyrillic script to 4.5. That is 1.05 MB of text, 0.41 MB compressed:
the AnsiballZ payload of the modules that import it (sglang_service, sglang_gate, sglang_diagnose) grows by about
0.55 MB. It is compiled and parsed on first use (about 0.03 s); a check takes about 0.5 ms for an answer of a
sentence and 4 ms per 1,000 characters of a long one (the loop search most). tests/tools/wordlist.py derives the list
and checks that it is current.

CJK text is not judged by word (no spaces to find words by): only for script mixing and repetition. Standard library
only; Python 3.9+.
"""

from __future__ import annotations

import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import language, repetition

MIN_NEWLINE_RUN = 8            # this many newlines in a row (blank lines allowed to hold spaces)
MAX_WHITESPACE_FRACTION = 0.6  # of the text, for texts of 16+ characters
MIN_LOOP_TOKENS = repetition.MIN_LOOP_TOKENS
MIN_DIGIT_RUN = 50             # digits in a row
MAX_REPLACEMENT = 3            # U+FFFD characters
MAX_MOJIBAKE = 3               # UTF-8-read-as-Latin-1 sequences ("Ã©", "â€™")
MAX_CONTROL_FRACTION = 0.05    # C0/C1 control characters other than \t \n \r
MIN_SYMBOL_FRACTION = 0.4      # symbols among 12+ non-space characters, with unbalanced brackets or broken words
MIN_MARKS = 3                  # punctuation marks ...
MIN_MARKS_PER_TOKEN = 1.5      # ... per word or number ("Yes,!! I! can!")
MIN_FRAGMENT_LINES = 6         # lines, of which ...
MIN_FRAGMENT_FRACTION = 0.4    # ... this share are a symbol or two and nothing else
_NEWLINE_RUN_RE = re.compile(r"(?:[ \t]*\r?\n){%d,}" % MIN_NEWLINE_RUN)
_DIGIT_RUN_RE = re.compile(r"\d{%d,}" % MIN_DIGIT_RUN)
_MOJIBAKE_RE = re.compile(u"(?:\u00c3[\u0080-\u00bf]|\u00e2\u20ac[\u0098-\u009d\u2122\u0153\u201c\u201d\u2018\u2019\u00a6\u00a2]"
                          u"|\u00c2[\u00a0-\u00bf]|\u00e2\u20ac)")
_CONTROL_RE = re.compile(u"[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]")
# Special tokens a working server strips or stops at, of any template family: <|im_start|>, <|endofchunk|>,
# <｜Assistant｜>, <end_of_turn>, <pad>, <unused12>, [control_12], <BOS_TOKEN>, [PAD], byte tokens, SentencePiece's
# unknown-piece mark. Tags that are also HTML or plain text (<s>, [INST], <image>) count from their second time.
_SPECIAL_RE = re.compile(r"<\|[^|<>\s]{1,40}\|>|<\uff5c[^\uff5c<>]{1,40}\uff5c>|</?(?:unk|pad|eos|bos|mask|sep|cls|eot)>"
                         r"|</?(?:end_of_turn|start_of_turn|unused\d+|end_of_text|endoftext)>|<[A-Z_]+_TOKEN>"
                         r"|\[(?:PAD|UNK|CLS|SEP|MASK|control_\d+)\]|<0x[0-9A-F]{2}>|\u2047", re.I)
_WEAK_SPECIAL_RE = re.compile(r"</?s>|\[/?INST\]|<</?SYS>>|</?image>")
_LIST_MARK_RE = re.compile(r"(?m)^[ \t]*(?:[-*+\u2022]|\d+[.)])[ \t]+")
_MATH_RE = re.compile(u"\\\\[a-zA-Z]{2,}|\\$[^$\\n]+\\$|[\u00b1\u00b2\u00b3\u00d7\u00f7\u2211\u221a\u221e\u2260\u2264\u2265\u222b\u03c0]")
_HARMONY_RE = re.compile(r"^\s*(?:analysis|commentary)(?=[A-Z])|assistant(?:final|commentary|analysis)(?=\w)")
THINK_START, THINK_END = "<think>", "</think>"


def detect(text, min_loop_tokens=MIN_LOOP_TOKENS, prompt=None):
    """Return dict(degenerate, reason, confidence, evidence, details) for one completion text.

    ``confidence`` is how sure the verdict is (0.5-1.0), ``evidence`` says why in words (which words are not words,
    which unit repeats). ``prompt``, where known, lets an answer that only echoes it count as degenerate.
    Reasons: empty, whitespace_only, near_empty_structured, template_leak, reasoning_leak, prompt_echo, newline_run,
    whitespace_heavy, replacement_characters, mojibake, control_characters, runaway_digits, repeated_character,
    repeated_unit, json_prefix, symbol_salad, punctuation_salad, repeating_loop, near_repeating_loop, duplicated_words,
    repeated_token, low_diversity, multilingual_salad, nonword_salad, word_salad, function_word_salad.
    """
    if text is None:
        return _res(True, "empty", 1.0, ["no text"], {"length": 0})
    if not isinstance(text, str):
        text = str(text)
    details = {"length": len(text)}
    ctx = {"min_loop_tokens": min_loop_tokens, "prompt": prompt}
    for check in _CHECKS:
        found = check(text, details, ctx)
        if found:
            return _res(True, found[0], round(found[1], 2), found[2], details)
    return _res(False, None, _normal_confidence(details), [], details)


def is_degenerate(text):
    return detect(text)["degenerate"]


def _res(deg, reason, confidence, evidence, details):
    return {"degenerate": deg, "reason": reason, "confidence": confidence, "evidence": evidence, "details": details}


def _normal_confidence(details):
    """Sure of a normal text in proportion to the words it could judge (a bare number says little)."""
    judged = details.get("judged_words", 0)
    return round(min(0.99, 0.6 + 0.04 * judged * (1 - details.get("unknown_share", 0))), 2)


# --------------------------------------------------------------------------------------------
# The checks, in order: each returns None or (reason, confidence, evidence) and records its numbers in ``details``.
# --------------------------------------------------------------------------------------------

def _check_empty(text, details, _ctx):
    if text == "":
        return "empty", 1.0, ["empty text"]
    stripped = text.strip()
    if not stripped:
        details["newlines"] = text.count("\n")
        return "whitespace_only", 1.0, ["%d whitespace characters and nothing else" % len(text)]
    if stripped[0] in "{[" and len(stripped) <= 16 and not re.search(r"\w", stripped):
        details["structured_text"] = stripped     # '{"', '{}', '[]': structured output with nothing in it
        return "near_empty_structured", 0.9, ["structured output with nothing in it: %r" % stripped]
    return None


def _check_leaks(text, details, _ctx):
    strong = _SPECIAL_RE.findall(text)
    weak = _WEAK_SPECIAL_RE.findall(text)
    found = strong + (weak if len(weak) >= 2 else [])
    if found:
        details.update({"template_tokens": len(found), "template_token": found[0]})
        return "template_leak", min(1.0, 0.8 + 0.05 * len(found)), ["special tokens in the text: %s (%d)" % (found[0], len(found))]
    harmony = _HARMONY_RE.search(text)
    if harmony:
        return "template_leak", 0.8, ["Harmony channel name glued to the text: %r" % text[harmony.start():harmony.end() + 12]]
    return _reasoning_leak(text, details)


def _reasoning_leak(text, details):
    """One reasoning block (closed, or opened by the template) is a thinking model's answer; a second end tag, or
    the answer before the tag said again after it, is the parser's or the model's leak."""
    ends = text.count(THINK_END)
    if not ends:
        return None
    before, after = text.rsplit(THINK_END, 1)
    answer = after.strip()
    twice = bool(answer) and before.rstrip().endswith(answer)
    if ends >= 2 or text.count(THINK_START) >= 2 or twice:
        details["think_end_tags"] = ends
        return "reasoning_leak", 0.8, ["%s %d times%s" % (THINK_END, ends, ", the answer %r on both sides" % answer[:40] if twice else "")]
    return None


def _check_prompt(text, details, ctx):
    prompt = (ctx.get("prompt") or "").strip()
    if len(prompt) < 12:
        return None
    echoes = text.count(prompt)
    rest = text.replace(prompt, " ").strip()
    if echoes and (not rest or echoes >= 2):
        details["prompt_echoes"] = echoes
        return "prompt_echo", 0.8, ["the prompt %d times%s" % (echoes, " and nothing else" if not rest else "")]
    return None


def _check_whitespace(text, details, _ctx):
    m = _NEWLINE_RUN_RE.search(text)
    if m:
        details["newline_run"] = m.group(0).count("\n")
        return "newline_run", 0.9, ["%d newlines in a row" % details["newline_run"]]
    ws = sum(1 for ch in text if ch.isspace())
    if len(text) >= 16 and ws / float(len(text)) > MAX_WHITESPACE_FRACTION:
        details["whitespace_fraction"] = round(ws / float(len(text)), 2)
        return "whitespace_heavy", 0.8, ["%d%% of the text is whitespace" % (details["whitespace_fraction"] * 100)]
    return None


def _check_encoding(text, details, _ctx):
    counts = (("replacement_characters", text.count(u"\ufffd"), MAX_REPLACEMENT),
              ("mojibake", len(_MOJIBAKE_RE.findall(text)), MAX_MOJIBAKE))
    for reason, n, limit in counts:
        if n >= limit:
            details[reason if reason != "mojibake" else "mojibake_sequences"] = n
            return reason, 0.9, ["%d %s" % (n, reason.replace("_", " "))]
    ctrl = len(_CONTROL_RE.findall(text))
    if ctrl and ctrl / float(len(text)) > MAX_CONTROL_FRACTION:
        details["control_characters"] = ctrl
        return "control_characters", 0.9, ["%d control characters" % ctrl]
    runs = [len(m) for m in _DIGIT_RUN_RE.findall(text)]
    if runs:
        details["digit_run"] = max(runs)
        return "runaway_digits", 0.9, ["a number of %d digits" % max(runs)]
    return None


def _check_json_prefix(text, details, _ctx):
    """A JSON answer with symbols glued to its front (".{", "{\"{\"summary\"...": a grammar or parser slip)."""
    stripped = text.strip()
    for i, ch in enumerate(stripped[1:17], 1):
        prefix = stripped[:i]
        if ch in "{[" and not any(c.isalnum() or c.isspace() for c in prefix) and repetition._is_json(stripped[i:]):
            details["json_prefix"] = prefix
            return "json_prefix", 0.8, ["%r glued to the front of a JSON answer" % prefix]
    return None


def _balanced(text):
    return sum(text.count(c) for c in "([{") == sum(text.count(c) for c in ")]}") and text.count('"') % 2 == 0


def _check_symbols(text, details, _ctx):
    """Symbols with few letters ("38\"4EC$!31=.4<H0+"), punctuation without words, lines of a symbol or two.
    Code, JSON, math and tables have symbols too, but balanced and around whole words; a list has one separator."""
    body = _LIST_MARK_RE.sub("", text)
    nonspace = "".join(body.split())
    symbols = [ch for ch in nonspace if not ch.isalnum()]
    runs = re.findall(r"[^\W\d_]+", body)
    # short letter runs are broken words, unless the text is math (LaTeX commands, $...$, math signs)
    broken = len(runs) >= 3 and sum(map(len, runs)) / float(len(runs)) <= 2.5 and not _MATH_RE.search(text)
    rules = all(len(set(line.strip())) <= 2 and set(line.strip()) <= set(repetition.SEPARATOR_CHARS) for line in text.splitlines() if line.strip())
    only = not any(ch.isalnum() for ch in nonspace)
    varied = only or len(set(symbols)) >= 3     # "A, B, C, D" has one kind of symbol
    if len(nonspace) >= 12 and not rules and len(symbols) >= MIN_SYMBOL_FRACTION * len(nonspace) and varied and \
            (not runs or broken or not _balanced(text)) and not repetition._is_json(text.strip()):
        details["symbol_fraction"] = round(len(symbols) / float(len(nonspace)), 2)
        return "symbol_salad", 0.8, ["%d%% symbols, words: %s" % (details["symbol_fraction"] * 100, ", ".join(repr(r) for r in runs[:6]) or "none")]
    marks, toks = len(re.findall(r"[,;:!?]", text)), len(re.findall(r"\w+", text))
    if marks >= MIN_MARKS and marks >= MIN_MARKS_PER_TOKEN * max(toks, 1):
        details["marks_per_token"] = round(marks / float(max(toks, 1)), 2)
        return "punctuation_salad", 0.75, ["%d punctuation marks for %d words: %r" % (marks, toks, text.strip()[:60])]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    # a line of brackets alone ("{", "]," in pretty JSON or code) is structure, not a fragment
    bits = [line for line in lines if len(line) <= 3 and re.search(r"[^\w\s\[\](){},;]", line) and not rules]
    if len(lines) >= MIN_FRAGMENT_LINES and len(bits) >= MIN_FRAGMENT_FRACTION * len(lines):
        details["fragment_lines"] = len(bits)
        return "symbol_salad", 0.75, ["%d of %d lines are a symbol or two: %s" % (len(bits), len(lines), ", ".join(repr(b) for b in bits[:6]))]
    return None


def _tail(text):
    """The last third of a long text: where a coherent start drifts into garbage."""
    words = text.split()
    return " ".join(words[-(len(words) // 3):]) if len(words) >= 3 * language.MIN_PROSE_WORDS else None


def _check_language(text, details, _ctx):
    found = language.salad(text, details)
    if found:
        details["salad_in"] = "text"
    elif _tail(text):
        found = language.salad(_tail(text), {})
        if found:
            details["salad_in"] = "tail"
    return found


def _repeat(check):
    return lambda text, details, ctx: check(text, details)


_CHECKS = (_check_empty, _check_leaks, _check_prompt, _check_whitespace, _check_encoding, _repeat(repetition.char_runs),
           _repeat(repetition.leading_unit), _check_json_prefix, _check_symbols,
           lambda text, details, ctx: repetition.exact_loop(text, details, ctx["min_loop_tokens"]),
           _repeat(repetition.near_loop), _repeat(repetition.repeated_sentence), _check_language,
           _repeat(repetition.duplicates), _repeat(repetition.word_stats))
