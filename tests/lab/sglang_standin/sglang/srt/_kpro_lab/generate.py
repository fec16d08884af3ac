"""What the stand-in's model answers, and how the output drills spoil it.

The answer is derived from the prompt, as a small instruction-tuned model at temperature 0 would give it: counting
("count from A to B", one per line when asked), integer arithmetic (+, -, *), the capital of a country it knows, an
instruction to write a quoted word in upper or lower case inside square brackets, greetings; anything else gets a
fixed sentence. No prompt of kpro.gpu_serving's tests is stored here.

Output drills, read at every request (the drill file or $KPRO_LAB_SGLANG_DRILL), so a running server changes its
behaviour without a restart:

- ``dropped_draft_tokens``: every 7th token of the answer is lost (what speculative decoding does when accepted draft
  tokens are not committed), e.g. "3\\n4" -> "34";
- ``duplicated_tokens``: every 6th token is emitted twice (a draft token committed twice), e.g. "3" -> "33";
- ``wrong_answer_tp``: at --tp-size > 1 only, plausible but wrong answers (a carry lost in a sum, a neighbouring
  city, one number skipped in a count) with low log-probabilities, as a numerically broken all-reduce gives;
- ``reasoning_only``: chat answers land in ``reasoning_content`` with ``content`` null, as SGLang 0.5.11's reasoning
  parser does when the template forces reasoning and no ``</think>`` comes (sglang/srt/parser/reasoning_parser.py:55-89:
  without the end token "Assume reasoning was truncated before end token", all text is reasoning; then
  sglang/srt/entrypoints/openai/serving_chat.py:1062-1105 returns ``content=text if text else None``).
"""

import re

from sglang.srt._kpro_lab import util
from sglang.version import __version__

OUTPUT_DRILLS = ("dropped_draft_tokens", "duplicated_tokens", "wrong_answer_tp", "reasoning_only")

_TOK = re.compile(r"\w+|[^\w\s]|\n")
CAPITALS = {"france": "Paris", "japan": "Tokyo", "germany": "Berlin", "italy": "Rome", "spain": "Madrid", "canada": "Ottawa",
            "australia": "Canberra", "egypt": "Cairo", "kenya": "Nairobi", "peru": "Lima", "norway": "Oslo", "poland": "Warsaw"}
# the plausible wrong answer a broken server gives instead: the country's other big city
NEIGHBOURS = {"Paris": "Lyon", "Tokyo": "Kyoto", "Berlin": "Munich", "Rome": "Milan", "Madrid": "Barcelona", "Ottawa": "Toronto",
              "Canberra": "Sydney", "Cairo": "Alexandria", "Nairobi": "Mombasa", "Lima": "Cusco", "Oslo": "Bergen", "Warsaw": "Krakow"}


def live_modes(tp_size):
    """The output drills in force for this request: those in the drill source now (the environment, else the drill
    file), not those read at launch, so a drill ends when the file is emptied."""
    live, _unknown = util.read_drills()
    # ``name:<version>`` acts only on a server installed as that SGLang version (the lab's upgrade drill: the new release
    # answers wrong, the one rolled back to does not)
    modes = set(n for n, arg in live.items() if n in OUTPUT_DRILLS and arg in (None, __version__))
    if tp_size <= 1:
        modes.discard("wrong_answer_tp")     # a TP all-reduce bug needs TP
    return modes


def _count(low, wrong):
    m = re.search(r"count(?:ing)? from (-?\d+) to (-?\d+)", low)
    a, b = int(m.group(1)), int(m.group(2))
    nums = list(range(a, min(b, a + 999) + 1))
    if wrong and len(nums) > 3:
        del nums[(len(nums) * 2) // 3]
    return ("\n" if "line" in low else ", ").join(str(n) for n in nums)


def _arithmetic(m, wrong):
    x, op, y = int(m.group(1)), m.group(2), int(m.group(3))
    res = x + y if op == "+" else x - y if op == "-" else x * y
    return str(res - 10 if wrong else res)      # wrong: a lost carry


def _capital(low, completion, wrong):
    country = next((c for c in CAPITALS if re.search(r"\b%s\b" % c, low)), None)
    if country is None:
        return None
    city = CAPITALS[country]
    if wrong:
        city = NEIGHBOURS.get(city, city)
    if completion:
        if country == "france" and not wrong:
            return " Paris. It is the largest city in France and has been the country's capital for centuries."
        return " %s." % city
    if "only" in low or "one word" in low:
        return city
    return "The capital of %s is %s." % (country.title(), city)


def answer(prompt, completion=False, wrong=False):
    """The greedy answer to ``prompt`` (``wrong``: the plausible wrong one)."""
    p = (prompt or "").strip()
    low = p.lower()
    if re.search(r"count(?:ing)? from -?\d+ to -?\d+", low):
        text = _count(low, wrong)
        return ("\n" + text) if completion else text
    m = re.search(r"(-?\d+)\s*([+*x\-])\s*(-?\d+)", p)
    if m and ("what is" in low or "answer" in low or "=" in low or "compute" in low):
        text = _arithmetic(m, wrong)
        return (" " + text) if completion else text
    m = re.search(r"""word ["']([^"']+)["'] in (upper|lower) ?case inside square brackets""", p, re.I)
    if m:
        word = m.group(1).upper() if m.group(2).lower() == "upper" else m.group(1).lower()
        return "[%s]" % word
    if "capital" in low:
        text = _capital(low, completion, wrong)
        if text is not None:
            return text
    if "describe the image" in low:
        return "The image is a small, plain square."
    if re.search(r"\b(hello|hi)\b", low):
        return "Hello! How can I help you today?"
    if completion:
        return " a deterministic continuation from the SGLang lab stand-in, which answers every request the same way."
    return "This is a deterministic answer from the SGLang lab stand-in: the request was received and processed correctly."


def spoil(text, modes):
    """The answer as the output drills leave it: tokens dropped or duplicated (whitespace between tokens kept)."""
    every, dup = (7, False) if "dropped_draft_tokens" in modes else (6, True) if "duplicated_tokens" in modes else (0, False)
    if not every:
        return text
    out, last = [], 0
    for i, m in enumerate(_TOK.finditer(text)):
        out.append(text[last:m.start()])
        if i % every != every - 2:
            out.append(m.group(0))
        elif dup:
            out.append(m.group(0) * 2)
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def logprobs(text, chat, wrong):
    """OpenAI-style logprobs of the answer's tokens (completions: ``LogProbs``, chat: ``ChoiceLogprobs``), as SGLang's
    protocol.py (0.5.11: lines 80-100) defines them; a broken server's greedy tokens are far less likely."""
    toks = [m.group(0) for m in _TOK.finditer(text or "")]
    vals = [round((-2.4 if wrong else -0.02) - 0.01 * (i % 5), 4) for i in range(len(toks))]
    if chat:
        return {"content": [{"token": t, "bytes": list(t.encode()), "logprob": v, "top_logprobs": []} for t, v in zip(toks, vals)]}
    offsets, pos = [], 0
    for t in toks:
        pos = text.find(t, pos)
        offsets.append(pos)
        pos += len(t)
    return {"text_offset": offsets, "token_logprobs": vals, "tokens": toks, "top_logprobs": [None] * len(toks)}
