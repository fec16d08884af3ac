# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is this text made of words? Word validity, the frequency profile and script mixing, for module_utils/serve/degenerate.py.

The words come from wordfreq's frequency lists (module_utils/serve/language_words.py, derived by tests/tools/wordlist.py;
why vendored: see degenerate.py). A text is judged in the language whose list knows most of its words, with English
always admitted (technical words and loanwords appear in every language). Judged are the runs of letters in
alphabetic scripts with a list (Latin, Cyrillic); CJK, Hangul and scripts without a list are not judged by word (CJK
has no spaces to find words by): they count only for script mixing. Left out as not-words-of-prose: code (fenced
blocks, `inline`, lines of a command or of code), URLs, LaTeX commands, identifiers (camelCase, snake_case, letters
glued to digits), acronyms (all capitals) and romanised Chinese. A capitalised word no list knows counts half (it
may be a name), and unknown capitalised words alone never make a salad (a list of capitals is an answer).
"""

from __future__ import annotations

import re
import unicodedata

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.language_words import WORDS

FUNCTION_ZIPF = 5.5      # words at least this frequent (the, of, und, de, ...) carry the grammar of prose
_CODE_RE = re.compile(r"```.*?(?:```|$)|`[^`\n]*`|https?://\S+|\S+@\S+\.\w+|\\[a-zA-Z]+", re.S)
_CHUNK_RE = re.compile(r"\S+")
_LETTERS_RE = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")
_IDENT_RE = re.compile(r"[a-z][A-Z]|_|^[A-Za-z]+\d+[A-Za-z]*$")
# a token of code or of a command line: an option, an assignment, a path, a pipe, a dotted name (sglang.service),
# a statement's end
_CODE_TOKEN_RE = re.compile(r"^-{1,2}\w|[=/\\|$<>{}_]|[^\W\d_]{2}\.[^\W\d_]{2}|;$")
_PINYIN_RE = re.compile(u"[\u0101\u0113\u012b\u014d\u016b\u01ce\u011b\u01d0\u01d2\u01d4\u01d6\u01d8\u01da\u01dc]")
_UNJUDGED = ("CJK", "HANGUL")
_LEXICON = {}


def lexicon():
    """{language: {word: zipf}}, built on first use (115k words in 31 languages, 0.02 s)."""
    if not _LEXICON:
        for lang, bands in WORDS.items():
            _LEXICON[lang] = dict((word, zipf) for zipf, words in reversed(bands) for word in words.split())
    return _LEXICON


def script(ch):
    """The writing system of a letter, with the CJK family (Han, kana) as one."""
    try:
        first = unicodedata.name(ch).split()[0]
    except ValueError:
        return None
    return "CJK" if first in ("CJK", "HIRAGANA", "KATAKANA", "HALFWIDTH", "FULLWIDTH", "IDEOGRAPHIC") else first


def _runs(chunk):
    """The chunk's letters split where the script changes: [(script, run)]."""
    out = []
    for ch in chunk:
        s = script(ch) if ch.isalpha() else None
        if s and out and out[-1][0] == s and out[-1][2]:
            out[-1] = (s, out[-1][1] + ch, True)
        else:
            out.append((s, ch, bool(s)))
    return [(s, run) for s, run, letter in out if letter]


def _glued(runs, latin_text):
    """A word whose letters come from two alphabetic scripts ("ьallis", "Votingेव"), or, in Latin text, a CJK or
    Hangul letter glued inside a Latin word ("gutterぼdiaeftry"). Chinese and Korean glue Latin words to their own."""
    scripts = [run[0] for run in runs]
    alpha = set(s for s in scripts if s not in _UNJUDGED)
    sandwiched = any(scripts[i] in _UNJUDGED and scripts[i - 1] == scripts[i + 1] == "LATIN" for i in range(1, len(scripts) - 1))
    return len(alpha) >= 2 or (latin_text and sandwiched)


def _drop_code_lines(text):
    """Lines of a command or of code (``journalctl -u x.service -n 50``) hold names no word list has."""
    keep = []
    for line in text.splitlines():
        toks = line.split()
        code = sum(1 for t in toks if _CODE_TOKEN_RE.search(t))
        if not code or (code < 0.3 * len(toks) and len(toks) > 12):
            keep.append(line)
    return "\n".join(keep)


def words(text):
    """(judged words [(word, capitalised)], words of two scripts, letters per script)."""
    prose = _CODE_RE.sub(" ", text.replace(u"\u2019", "'"))
    letters = {}
    for ch in prose:
        if ch.isalpha():
            s = script(ch)
            letters[s] = letters.get(s, 0) + 1
    latin_text = letters.get("LATIN", 0) > 0.8 * sum(letters.values()) if letters else False
    # code does not glue scripts either: words of two scripts are looked for everywhere
    glued = [chunk for chunk in _CHUNK_RE.findall(prose) if _glued(_runs(chunk), latin_text)]
    pinyin = bool(_PINYIN_RE.search(prose))     # romanised Chinese: its accented syllables are no list's words
    judged = []
    for chunk in _CHUNK_RE.findall(_drop_code_lines(prose)):
        for s, run in _runs(chunk):
            if s not in ("LATIN", "CYRILLIC") or len(run) < 2 or run.isupper() or _IDENT_RE.search(chunk) or \
                    (pinyin and not run.isascii()):
                continue    # not judged: other scripts, acronyms, identifiers
            for word in _LETTERS_RE.findall(run):
                judged.append((word, word[0].isupper()))
    return judged, glued, letters


def judge(text):
    """Word statistics of a text: the language its words fit best, the weight of judged and of unknown words, the
    unknown words themselves, the share of function words and the words glued from two scripts."""
    judged, glued, letters = words(text)
    lex = lexicon()
    best, best_known = "en", -1.0
    for lang, table in lex.items():
        known = sum(1 for word in judged if word[0].lower() in table or word[0].lower() in lex["en"])
        if known > best_known:
            best, best_known = lang, known
    table, total, unknown, function, missing, lower = lex[best], 0.0, 0.0, 0, [], 0
    for word, cap in judged:
        zipf = table.get(word.lower(), lex["en"].get(word.lower()))
        weight = 0.5 if cap and zipf is None else 1.0
        total += weight
        if zipf is None:
            unknown += weight
            missing.append(word)
            lower += not cap
        elif zipf >= FUNCTION_ZIPF:
            function += 1
    return {"language": best, "judged": total, "unknown": unknown, "unknown_words": missing, "unknown_lower": lower, "glued": glued,
            "function_share": function / float(len(judged)) if judged else 0.0, "words": len(judged), "letters": letters,
            "distinct": len(set(word[0].lower() for word in judged))}


# --------------------------------------------------------------------------------------------
# Decisions: each returns None or (reason, confidence, evidence) and records its numbers in ``details``.
# --------------------------------------------------------------------------------------------

MIN_UNKNOWN = 2                # words no list knows ...
SHORT_UNKNOWN_SHARE = 0.5      # ... making this share of the judged words (a 16-token salad is decided too)
LONG_WORDS = 20                # in a text of this many judged words ...
LONG_UNKNOWN_SHARE = 0.3       # ... this share of unknown words (0.5 in a language whose list stops at Zipf 4.3+) ...
SHALLOW_UNKNOWN_SHARE = 0.5
LONG_MAX_FUNCTION = 0.15       # ... with few function words (a language with a short list still has its grammar words)
MIN_GLUED = 2                  # words glued from two scripts ...
MIN_GLUED_FRACTION = 0.05      # ... per word
MIN_PROSE_WORDS = 30           # prose of this many words ...
MAX_FUNCTION_SHARE = 0.18      # ... with fewer function words than this ...
MAX_MARKS_PER_WORD = 0.05      # ... and hardly a comma or full stop (dense prose has few function words, not no sentences)
MIN_FUNCTION_WORDS = 20        # this many words ...
ONLY_FUNCTION_SHARE = 0.9      # ... nearly all of them function words ("a of the. which. a the") ...
MAX_FUNCTION_DISTINCT = 0.4    # ... and the same few again and again (plain talk uses common words, but many of them)
MAX_SYNTAX_FRACTION = 0.08     # characters of code/markup syntax above which a text is not prose
_SYNTAX_CHARS = frozenset("{}[]()<>=;:\"`|\\/_#*$&^%@~+")


def _quote(words, n=8):
    return ", ".join(repr(w) for w in words[:n]) + (" ..." if len(words) > n else "")


def _is_list(text):
    """Comma-, semicolon- or line-separated short items (a list of names has no function words either)."""
    items = [s for s in re.split(r"[,;\n]", text) if s.strip()]
    return len(items) >= 10 and sum(1 for s in items if len(s.split()) <= 3) >= 0.6 * len(items)


def _is_prose(text, j):
    nonspace = [ch for ch in text if not ch.isspace()]
    syntax = sum(1 for ch in nonspace if ch in _SYNTAX_CHARS) / float(len(nonspace)) if nonspace else 1.0
    return j["words"] >= MIN_PROSE_WORDS and syntax <= MAX_SYNTAX_FRACTION and not _is_list(text)


def salad(text, details):
    """Words that are not words, words glued from two scripts, or real words without grammar."""
    j = judge(text)
    share = j["unknown"] / j["judged"] if j["judged"] else 0.0
    details.update({"language": j["language"], "judged_words": j["words"], "unknown_share": round(share, 2),
                    "function_share": round(j["function_share"], 2)})
    chunks = max(1, len(text.split()))
    if len(j["glued"]) >= MIN_GLUED and len(j["glued"]) / float(chunks) >= MIN_GLUED_FRACTION:
        details["mixed_script_words"] = len(j["glued"])
        return "multilingual_salad", min(1.0, 0.6 + 0.1 * len(j["glued"])), ["words of two scripts: " + _quote(j["glued"])]
    # capitalised words alone may be names (a list of capitals): a salad has lower-case non-words too
    short = j["words"] < LONG_WORDS and len(j["unknown_words"]) >= MIN_UNKNOWN and j["unknown_lower"] and j["judged"] >= 3 \
        and share >= SHORT_UNKNOWN_SHARE
    # a language with a short list leaves more of a real text unknown (German compounds, Finnish endings)
    limit = LONG_UNKNOWN_SHARE if j["language"] == "en" else SHALLOW_UNKNOWN_SHARE
    long_ = j["words"] >= LONG_WORDS and share >= limit and j["function_share"] < LONG_MAX_FUNCTION
    if short or long_:
        return "nonword_salad", min(1.0, 0.4 + share), ["not words in %s or English: %s" % (j["language"], _quote(j["unknown_words"]))]
    marks = len(re.findall(r"[.,;:!?]", text)) / float(j["words"] or 1)
    if _is_prose(text, j) and j["function_share"] < MAX_FUNCTION_SHARE and marks < MAX_MARKS_PER_WORD:
        return "word_salad", 0.7, ["%d words with %d%% function words (prose has 30-60%%)" % (j["words"], j["function_share"] * 100)]
    distinct = j["distinct"] / float(max(1, j["words"]))
    if j["words"] >= MIN_FUNCTION_WORDS and j["function_share"] >= ONLY_FUNCTION_SHARE and distinct <= MAX_FUNCTION_DISTINCT:
        return "function_word_salad", 0.7, ["%d words, %d%% of them function words and no content" % (j["words"], j["function_share"] * 100)]
    return None
