# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repetition at several scales, for module_utils/serve/degenerate.py: a character or a short unit ("!!!!", "nynyny"), a
word, a token sequence repeated exactly (a sentence, a paragraph, lines of code), a sequence repeated with small
variations (6-grams seen three times or more), a sentence said twice in a row, words duplicated in place, and how
well the text compresses. Each check returns None or (reason, confidence, evidence) and records its numbers in
``details``. Lists, tables and JSON records repeat their structure, not their content: the checks compare tokens,
so numbered items and different cells break a loop.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter

MIN_CHAR_RUN = 10              # a run of one non-space character counts toward "repeated character" ...
MIN_UNIT_REPEATS = 8           # ... or a unit of 2-8 characters repeated this many times ("nynyny...")
MAX_CHAR_RUN_FRACTION = 0.5    # of the non-space characters, for texts of 16+ non-space characters
LONG_CHAR_RUN = 24             # one character this many times in a row is a loop wherever it stands
LEADING_UNIT_REPEATS = 4       # a unit repeated this often at the very start, glued to the answer ("ssss{...")
MIN_LOOP_TOKENS = 24           # a loop must cover at least this many tokens ...
MIN_LOOP_FRACTION = 0.3        # ... and this fraction of all tokens (or MIN_LOOP_ABS tokens)
MIN_LOOP_ABS = 200
MIN_LOOP_REPEATS = 4           # consecutive repeats of a short unit (period < 8 tokens) ...
MIN_LOOP_REPEATS_LONG = 3      # ... or of a long one (a sentence or paragraph)
SHORT_TEXT_TOKENS = 30         # in a text this short, a unit said twice that covers SHORT_LOOP_FRACTION is a loop
SHORT_LOOP_FRACTION = 0.6
MAX_LOOP_PERIOD = 256
MAX_ANALYSED_TOKENS = 4000
NEAR_LOOP_N = 6                # n-grams of this many tokens ...
NEAR_LOOP_MIN_COUNT = 3        # ... seen this often ...
NEAR_LOOP_COVERAGE = 0.5       # ... covering this share of 40+ tokens: a loop whose repeats vary
MAX_CONTINUATION_VARIETY = 0.7  # ... whose repeats go on the same way (a template list fills new words each time)
STRETCH_N = 8                  # in prose of 60+ tokens, stretches of this many tokens seen twice ...
STRETCH_COVERAGE = 0.6         # ... covering this share: each phrase said twice (a stream whose chunks doubled)
MAX_SYNTAX_FRACTION = 0.08     # characters of code/markup syntax above which a text is not prose
MIN_SENTENCE_WORDS = 5         # a sentence of this many words said twice in a row
MIN_DUPLICATE_RUNS = 3         # separate places where a word is immediately repeated ("for for") ...
MIN_DUPLICATE_FRACTION = 0.02  # ... per word
MAX_TOP_TOKEN_FRACTION = 0.5   # one word making more than half of 20+ words ...
MAX_TOP_TOKEN_DISTINCT = 3     # ... among at most this many distinct words
MIN_DISTINCT_RATIO = 0.12      # distinct/total word tokens, for 100+ words
MAX_SEPARATOR_WIDTH = 120
SEPARATOR_CHARS = "=-_*#~+.|/\\<>"
_CHAR_RUN_RE = re.compile(r"(\S)\1{%d,}" % (MIN_CHAR_RUN - 1))
_UNIT_RUN_RE = re.compile(r"(\S{2,8}?)\1{%d,}" % (MIN_UNIT_REPEATS - 1))
# a unit of a letter and a symbol said four times in a row ("'s's's's"): no word or number is built like that
_MIXED_UNIT_RE = re.compile(r"((?=\S{0,3}[^\W\d_])(?=\S{0,3}[^\w\s])\S{2,4}?)\1{3,}")
_LEADING_RE = re.compile(r"\s*(\S{1,4}?)\1{%d,}" % (LEADING_UNIT_REPEATS - 1))
_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_LETTER_WORD_RE = re.compile(r"[^\W\d_]+", re.UNICODE)
_SENTENCE_RE = re.compile(r"[^.!?\n]+[.!?]")
_SYNTAX_CHARS = frozenset("{}[]()<>=;:\"`|\\/_#*$&^%@~+")


def tokens(text):
    return _TOKEN_RE.findall(text)


def _is_separator(run, text, start, end):
    """A separator line ("=====", "-----", "|---|") of normal width is formatting, not a loop."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line = text[line_start:len(text) if line_end < 0 else line_end].strip()
    return set(run) <= set(SEPARATOR_CHARS) and len(run) <= MAX_SEPARATOR_WIDTH and len(line) <= MAX_SEPARATOR_WIDTH + 4


def char_runs(text, details):
    nonspace = sum(1 for ch in text if not ch.isspace())
    stripped = text.strip()
    if nonspace >= 8 and len(set(stripped)) == 1 and not set(stripped) <= set(SEPARATOR_CHARS):
        return "repeated_character", 0.9, ["%r repeated %d times and nothing else" % (stripped[0], len(stripped))]
    if nonspace < 16:
        return None
    covered, longest = set(), ""
    for rx in (_CHAR_RUN_RE, _UNIT_RUN_RE, _MIXED_UNIT_RE):
        for m in rx.finditer(text):
            if not _is_separator(m.group(0), text, m.start(), m.end()):
                covered.update(range(m.start(), m.end()))
                longest = max(longest, m.group(0), key=len)
    fraction = len(covered) / float(nonspace)
    mixed = _MIXED_UNIT_RE.search(text)
    if fraction > MAX_CHAR_RUN_FRACTION or (len(longest) >= LONG_CHAR_RUN and len(set(longest)) == 1) or mixed:
        longest = mixed.group(0) if mixed and fraction <= MAX_CHAR_RUN_FRACTION else longest
        details["repeated_character_fraction"] = round(fraction, 2)
        return "repeated_character", min(1.0, 0.6 + fraction / 2), ["%r repeated (%d characters)" % (longest[:12], len(longest))]
    return None


def leading_unit(text, details):
    """A short unit repeated at the very start and glued to what follows ("!!!!!{\"a\": 1}", "ssssThe answer")."""
    m = _LEADING_RE.match(text)
    if not m or set(m.group(1)) <= set(SEPARATOR_CHARS + " ") or m.end() >= len(text.rstrip()):
        return None
    rest = text[m.end():]
    if rest[:1].isspace() or (m.group(1).isalpha() and len(m.group(0).strip()) < 12):
        return None     # "hahaha, fine" and a rule line are followed by a space or are short words
    details["leading_unit"] = m.group(1)
    return "repeated_unit", 0.8, ["%r repeated %d times before the answer" % (m.group(1), len(m.group(0).strip()) // len(m.group(1)))]


def _periodic_runs(toks, max_period=MAX_LOOP_PERIOD):
    """{period: (start, length)} of the longest stretch where tokens[i] == tokens[i - period], for each period."""
    out = {}
    n = len(toks)
    for p in range(1, min(max_period, n // 2) + 1):
        run, best = 0, (0, 0)
        for i in range(p, n):
            if toks[i] == toks[i - p]:
                run += 1
                if run + p > best[1]:
                    best = (i - run - p + 1, run + p)
            else:
                run = 0
        if best[1]:
            out[p] = best
    return out


def exact_loop(text, details, min_loop_tokens=MIN_LOOP_TOKENS):
    toks = tokens(text)
    details.update({"tokens": len(toks), "compression_ratio": compression(text)})
    toks = toks[-MAX_ANALYSED_TOKENS:]   # a loop that runs until max_tokens sits at the end
    if len(toks) < 4:
        return None
    # the shortest period that makes a loop: a word said 60 times also matches itself at a period of 56, once
    for period, (start, length) in sorted(_periodic_runs(toks).items()):
        repeats = length / float(period)
        need = MIN_LOOP_REPEATS if period < 8 else MIN_LOOP_REPEATS_LONG
        long_loop = repeats >= need and length >= min_loop_tokens and (length >= MIN_LOOP_FRACTION * len(toks) or length >= MIN_LOOP_ABS)
        unit = " ".join(toks[start:start + period])[:120]
        if set(unit) <= set(SEPARATOR_CHARS + " "):
            continue    # "# ======" is a rule line: character runs judge separators
        # "[0, 0, 0, 0]" is an answer; "The first . The first ." is not
        short_loop = len(toks) <= SHORT_TEXT_TOKENS and repeats >= 2 and length >= 6 and length >= SHORT_LOOP_FRACTION * len(toks) \
            and re.search(r"[^\W\d_]", unit) and not _is_json(text.strip())
        if long_loop or short_loop:
            details.update({"loop_period_tokens": period, "loop_repeats": round(repeats, 1), "loop_tokens": length, "loop_unit": unit})
            return "repeating_loop", min(1.0, 0.6 + 0.1 * repeats), ["%r repeated %.1f times" % (unit, repeats)]
    return None


def _is_json(text):
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def near_loop(text, details):
    """Repeats that vary a little ("thank-you" / "thank-youso much"; a sentence that shrinks each pass). A list
    made from a template ("Q: What is the capital of X?") repeats its frame too, but fills it with new words each
    time: a loop goes on the same way after its repeats, a template does not."""
    toks = tokens(text)[-MAX_ANALYSED_TOKENS:]
    nonspace = [ch for ch in text if not ch.isspace()]
    prose = sum(1 for ch in nonspace if ch in _SYNTAX_CHARS) <= MAX_SYNTAX_FRACTION * len(nonspace)
    if len(toks) < 40 or not prose:
        return None     # markup, code and JSON repeat their syntax; their loops repeat exactly (exact_loop)
    coverage, top, varied = _coverage(toks, NEAR_LOOP_N, NEAR_LOOP_MIN_COUNT)
    if coverage >= NEAR_LOOP_COVERAGE and varied <= MAX_CONTINUATION_VARIETY:
        details["loop_coverage"] = round(coverage, 2)
        return "near_repeating_loop", min(1.0, coverage + 0.2), ["%r and its variants cover %d%% of the tokens" % (top, coverage * 100)]
    if len(toks) >= 60:
        coverage, top, varied = _coverage(toks, STRETCH_N, 2)
        if coverage >= STRETCH_COVERAGE:
            details["loop_coverage"] = round(coverage, 2)
            return "near_repeating_loop", min(1.0, coverage + 0.1), ["phrases said twice (%r ...) cover %d%% of the tokens" % (top, coverage * 100)]
    return None


def _coverage(toks, n, count):
    """(share of tokens inside an n-gram seen ``count`` times or more, the most frequent n-gram, how varied the
    two tokens after each repeat are: 1.0 when every repeat goes on differently)."""
    grams = Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
    covered, after = set(), {}
    for i in range(len(toks) - n + 1):
        gram = tuple(toks[i:i + n])
        # one token repeated ("= = = =") is a character run: separators are judged there
        if grams[gram] >= count and len(set(gram)) > 1:
            covered.update(range(i, i + n))
            after.setdefault(gram, []).append(tuple(toks[i + n:i + n + 2]))
    varied = sum(len(set(nxt)) / float(len(nxt)) for nxt in after.values()) / len(after) if after else 1.0
    return len(covered) / float(len(toks)), " ".join(grams.most_common(1)[0][0]), varied


def compression(text):
    """Compressed size / size: about 0.5 for prose, much less for a text that repeats itself."""
    raw = text.encode("utf-8")
    return round(len(zlib.compress(raw)) / float(len(raw)), 2) if raw else 1.0


def repeated_sentence(text, details):
    """The same sentence of 5+ words twice in a row ("An image of a table. An image of a table.")."""
    sentences = [" ".join(s.split()).lower() for s in _SENTENCE_RE.findall(text)]
    for a, b in zip(sentences, sentences[1:]):
        if a == b and len(_LETTER_WORD_RE.findall(a)) >= MIN_SENTENCE_WORDS:
            details["repeated_sentence"] = a[:120]
            return "repeating_loop", 0.75, ["sentence said twice in a row: %r" % a[:120]]
    return None


def duplicates(text, details):
    """Words repeated in place ("for for x in in arr"): tokens a speculative draft emitted twice."""
    toks = [t.lower() for t in tokens(text)]
    words = [t for t in toks if t.isalpha()]
    runs = [toks[i] for i in range(1, len(toks)) if toks[i] == toks[i - 1] and toks[i].isalpha() and (i < 2 or toks[i - 1] != toks[i - 2])]
    if len(runs) >= MIN_DUPLICATE_RUNS and len(runs) / float(max(1, len(words))) >= MIN_DUPLICATE_FRACTION:
        details["duplicated_word_runs"] = len(runs)
        return "duplicated_words", 0.7, ["words said twice in place: %s" % ", ".join(repr(w) for w in runs[:6])]
    return None


def word_stats(text, details):
    words = [w.lower() for w in re.findall(r"\w+", text)]
    if len(words) < 3:
        return None
    counts = Counter(words)
    top, top_n = counts.most_common(1)[0]
    few = len(words) >= 20 and top_n / float(len(words)) > MAX_TOP_TOKEN_FRACTION and len(counts) <= MAX_TOP_TOKEN_DISTINCT
    # a short answer that is one word said three times in a row and little else ("Tạng Tạng Tạng ...", not "Yes, yes!")
    row = re.search(r"\b(\w+)(?:\s+\1\b){2}", text.lower())
    only = len(words) < 20 and top_n / float(len(words)) >= 0.6 and row is not None and not top.isdigit()
    if few or only:
        details.update({"top_token": top, "top_token_fraction": round(top_n / float(len(words)), 2)})
        return "repeated_token", 0.8, ["%r is %d of %d words" % (top, top_n, len(words))]
    if len(words) >= 100 and len(counts) / float(len(words)) < MIN_DISTINCT_RATIO:
        details["distinct_ratio"] = round(len(counts) / float(len(words)), 3)
        return "low_diversity", 0.7, ["%d distinct words among %d" % (len(counts), len(words))]
    return None
