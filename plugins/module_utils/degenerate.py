# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is a model's completion degenerate? (empty, a run of newlines, a loop, one token repeated, mojibake)

Used by the completion gate's smoke probe (SGLang's own warmup only checks HTTP 200) and by the
``kpro.gpu_serving.degenerate`` filter. The thresholds are chosen so that normal output is not
flagged: short answers ("4", "Paris"), code, lists, tables, JSON, a poem with a refrain.
Standard library only; Python 3.9+.
"""

from __future__ import annotations

import re
from collections import Counter

# Thresholds (exposed so callers can tune them).
MIN_NEWLINE_RUN = 8            # this many newlines in a row (blank lines allowed to hold spaces)
MAX_WHITESPACE_FRACTION = 0.6  # of the text, for texts of 16+ characters
MIN_CHAR_RUN = 10              # a run of one non-space character counts toward "repeated character"
MAX_CHAR_RUN_FRACTION = 0.5    # of the non-space characters, for texts of 16+ non-space characters
MIN_LOOP_TOKENS = 24           # a loop must cover at least this many tokens ...
MIN_LOOP_FRACTION = 0.3        # ... and this fraction of all tokens (or MIN_LOOP_ABS tokens)
MIN_LOOP_ABS = 200
MIN_LOOP_REPEATS = 4           # consecutive repeats of a short unit (period < 8 tokens) ...
MIN_LOOP_REPEATS_LONG = 3      # ... or of a long one (a sentence or paragraph)
MAX_LOOP_PERIOD = 256
MAX_ANALYSED_TOKENS = 4000
MAX_TOP_TOKEN_FRACTION = 0.5   # one word making more than half of 20+ words ...
MAX_TOP_TOKEN_DISTINCT = 3     # ... among at most this many distinct words
MIN_DISTINCT_RATIO = 0.12      # distinct/total word tokens, for 100+ words
MAX_REPLACEMENT = 3            # U+FFFD characters
MAX_MOJIBAKE = 3               # UTF-8-read-as-Latin-1 sequences ("Ã©", "â€™")
MAX_CONTROL_FRACTION = 0.05    # C0/C1 control characters other than \t \n \r

MAX_SEPARATOR_WIDTH = 120
_SEPARATOR_CHARS = "=-_*#~+.|/\\<>"
_CHAR_RUN_RE = re.compile(r"(\S)\1{%d,}" % (MIN_CHAR_RUN - 1))
_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_WORD_RE = re.compile(r"\w+", re.UNICODE)
_NEWLINE_RUN_RE = re.compile(r"(?:[ \t]*\r?\n){%d,}" % MIN_NEWLINE_RUN)
_MOJIBAKE_RE = re.compile(u"(?:\u00c3[\u0080-\u00bf]|\u00e2\u20ac[\u0098-\u009d\u2122\u0153\u201c\u201d\u2018\u2019\u00a6\u00a2]"
                          u"|\u00c2[\u00a0-\u00bf]|\u00e2\u20ac)")
_CONTROL_RE = re.compile(u"[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]")


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


def detect(text, min_loop_tokens=MIN_LOOP_TOKENS):
    """Return dict(degenerate: bool, reason: str | None, details: dict) for one completion text.

    Reasons: empty, whitespace_only, newline_run, whitespace_heavy, repeated_character, repeating_loop,
    repeated_token, low_diversity, replacement_characters, mojibake, control_characters.
    """
    if text is None:
        return _res(True, "empty", {"length": 0})
    if not isinstance(text, str):
        text = str(text)
    details = {"length": len(text)}
    if text == "":
        return _res(True, "empty", details)
    if not text.strip():
        details["newlines"] = text.count("\n")
        return _res(True, "whitespace_only", details)
    m = _NEWLINE_RUN_RE.search(text)
    if m:
        details["newline_run"] = m.group(0).count("\n")
        return _res(True, "newline_run", details)
    ws = sum(1 for ch in text if ch.isspace())
    if len(text) >= 16 and ws / float(len(text)) > MAX_WHITESPACE_FRACTION:
        details["whitespace_fraction"] = round(ws / float(len(text)), 2)
        return _res(True, "whitespace_heavy", details)

    rep = text.count(u"\ufffd")
    if rep >= MAX_REPLACEMENT:
        details["replacement_characters"] = rep
        return _res(True, "replacement_characters", details)
    moji = len(_MOJIBAKE_RE.findall(text))
    if moji >= MAX_MOJIBAKE:
        details["mojibake_sequences"] = moji
        return _res(True, "mojibake", details)
    ctrl = len(_CONTROL_RE.findall(text))
    if ctrl and ctrl / float(len(text)) > MAX_CONTROL_FRACTION:
        details["control_characters"] = ctrl
        return _res(True, "control_characters", details)

    nonspace = [ch for ch in text if not ch.isspace()]
    if len(nonspace) >= 16:
        covered = 0
        for m in _CHAR_RUN_RE.finditer(text):
            run = m.group(0)
            # separator lines ("=====", "-----", "|---|") of normal width are formatting, not a loop
            line_start = text.rfind("\n", 0, m.start()) + 1
            line_end = text.find("\n", m.end())
            line = text[line_start:len(text) if line_end < 0 else line_end].strip()
            if run[0] in _SEPARATOR_CHARS and len(run) <= MAX_SEPARATOR_WIDTH and len(line) <= MAX_SEPARATOR_WIDTH + 4:
                continue
            covered += len(run)
        if covered / float(len(nonspace)) > MAX_CHAR_RUN_FRACTION:
            details["repeated_character_fraction"] = round(covered / float(len(nonspace)), 2)
            return _res(True, "repeated_character", details)

    tokens = _TOKEN_RE.findall(text)
    details["tokens"] = len(tokens)
    if len(tokens) > MAX_ANALYSED_TOKENS:
        # a loop that runs until max_tokens sits at the end
        tokens = tokens[-MAX_ANALYSED_TOKENS:]
    if len(tokens) >= 2 * 2:
        period, start, length = _longest_periodic_run(tokens)
        repeats = length / float(period) if period else 0
        need_repeats = MIN_LOOP_REPEATS if period < 8 else MIN_LOOP_REPEATS_LONG
        if (period and repeats >= need_repeats and length >= min_loop_tokens
                and (length >= MIN_LOOP_FRACTION * len(tokens) or length >= MIN_LOOP_ABS)):
            unit = " ".join(tokens[start:start + period])
            details.update({"loop_period_tokens": period, "loop_repeats": round(repeats, 1), "loop_tokens": length,
                            "loop_unit": unit[:120]})
            return _res(True, "repeating_loop", details)
    words = [w.lower() for w in _WORD_RE.findall(text)]
    if len(words) >= 20:
        counts = Counter(words)
        top, top_n = counts.most_common(1)[0]
        if top_n / float(len(words)) > MAX_TOP_TOKEN_FRACTION and len(counts) <= MAX_TOP_TOKEN_DISTINCT:
            details.update({"top_token": top, "top_token_fraction": round(top_n / float(len(words)), 2)})
            return _res(True, "repeated_token", details)
        if len(words) >= 100 and len(counts) / float(len(words)) < MIN_DISTINCT_RATIO:
            details["distinct_ratio"] = round(len(counts) / float(len(words)), 3)
            return _res(True, "low_diversity", details)
    return _res(False, None, details)


def is_degenerate(text):
    return detect(text)["degenerate"]


def _res(deg, reason, details):
    return {"degenerate": deg, "reason": reason, "details": details}
