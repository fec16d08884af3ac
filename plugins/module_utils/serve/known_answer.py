# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's known-answer check: a few prompts with exact, cheap answers, asked at temperature 0 through the endpoints
users call, after the content probe passed.

A server that answers HTTP 200 with plausible but wrong text (a TP all-reduce bug, speculative decoding that drops or
duplicates draft tokens, a reasoning parser that swallows the answer) passes a one-regex probe; it does not count from 1
to 20, add two numbers, name a capital and follow an exact output format. The checks run concurrently (SGLang batches
them), so the whole check takes about as long as its longest answer.

Each check: ``name``, ``endpoint`` (``chat``: ``/v1/chat/completions`` with the model's chat template and the server's
reasoning parser; ``completions``: ``/v1/completions``, raw text), ``prompt``, ``expected``, ``match`` (how the answer is
compared, see :func:`matches`), ``max_tokens``, and optionally ``min_mean_logprob`` (the mean log-probability of the
greedy answer's tokens must be above it; SGLang returns it with ``logprobs``; it drops for numerically broken tensor
parallelism) and ``chat_template_kwargs`` (this check's own, over the run's; ``{}`` sends none, as an ordinary client).

A chat answer whose ``content`` holds the model's thinking (a ``<think>`` or ``</think>`` tag) fails as
``thinking_in_content``: every client that does not turn thinking off gets it. A Qwen3 model thinks unless the request
sends ``chat_template_kwargs: {enable_thinking: false}``; Qwen3.5/3.6's template opens ``<think>`` in the prompt, so the
generated text is the thinking, ``</think>``, the answer. SGLang 0.5.11 separates it only with ``--reasoning-parser
qwen3``: serving_chat.py:1059-1105 runs the parser (none configured: all of the text is content) with
``force_reasoning`` true for every request that does not send ``enable_thinking: false`` (serving_chat.py:1396-1401),
and Qwen3Detector.detect_and_parse (parser/reasoning_parser.py:55-102, 217-247) puts the text before ``</think>`` into
``reasoning_content`` and the rest into ``content``. The default check ``plain_chat`` asks the way such a client does.
Standard library only; Python 3.9+.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import compat
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve.degenerate import detect as detect_degenerate

COUNT_TO = 20
DEFAULT_CHECKS = [
    # one number per line: a dropped or duplicated draft token shows as a missing, doubled or glued line
    {"name": "count", "endpoint": "chat", "prompt": "Count from 1 to %d, one number per line, with nothing else." % COUNT_TO,
     "expected": "\n".join(str(i) for i in range(1, COUNT_TO + 1)), "match": "lines", "max_tokens": 96},
    # multi-digit arithmetic with carries, through the raw completions endpoint
    {"name": "arithmetic", "endpoint": "completions", "prompt": "Question: What is 4823 + 7619? Answer with the number only.\nAnswer:",
     "expected": "12442", "match": "number", "max_tokens": 12},
    {"name": "fact", "endpoint": "chat", "prompt": "What is the capital of Japan? Answer with the city name only.",
     "expected": "Tokyo", "match": "word", "max_tokens": 16},
    {"name": "format", "endpoint": "chat", "prompt": 'Reply with only the word "ready" in upper case inside square brackets.',
     "expected": "[READY]", "match": "exact", "max_tokens": 16},
    # the greedy answer's mean log-probability is measured and returned; min_mean_logprob (null: none) makes it a check
    {"name": "logprob", "endpoint": "completions", "prompt": "The capital city of France is", "expected": "Paris", "match": "word",
     "max_tokens": 8, "min_mean_logprob": None},
    # as an ordinary client asks (no chat_template_kwargs: a Qwen3 model thinks first): the thinking must not come back in
    # content (--reasoning-parser qwen3 moves it to reasoning_content), the answer must; max_tokens leaves room to think
    {"name": "plain_chat", "endpoint": "chat", "prompt": "What is the capital of Italy? Answer with the city name only.",
     "expected": "Rome", "match": "word", "max_tokens": 2048, "chat_template_kwargs": {}},
]
DEFAULT_CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}
MATCHES = ("exact", "lines", "number", "word")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# the kinds a reasoning parser (or its absence) causes: their remedy is the parser's, not the suspects'
PARSER_KINDS = ("reasoning_only", "thinking_in_content")
# The gate's content probe by default (sglang_gate's probe_prompt, expected_probe_regex; the role's sglang_server_probe).
PROBE_PROMPT, PROBE_REGEX = "The capital city of France is", "(?i)paris"
SPEC_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")

THINK_START, THINK_END = "<think>", "</think>"
_THINK_RE = re.compile(r"<think>.*?</think>", re.S)
_FENCE_RE = re.compile(r"^```[\w-]*\n?(.*?)\n?```$", re.S)
_NUMBER_RE = re.compile(r"-?\d+(?:[,_ ]\d{3})*(?:\.\d+)?")


def normalize(text):
    """The answer without what real models wrap around it: a thinking block closed before the answer (with or without
    its opening tag, which Qwen3.5+ templates put in the prompt), surrounding whitespace, a code fence, bold markers,
    quotes, a trailing period."""
    text = _THINK_RE.sub("", text or "")
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    text = text.strip()
    m = _FENCE_RE.match(text)
    if m:
        text = m.group(1).strip()
    for left, right in (("**", "**"), ("`", "`"), ('"', '"'), ("'", "'")):
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
            text = text[len(left):-len(right)].strip()
    return text.rstrip(".").strip()


_BULLET_RE = re.compile(r"^(?:[-*\u2022]\s+)")


def _lines(text, expected=None):
    """Non-empty lines without trailing punctuation or list bullets; with ``expected``, without a leading preamble line
    ("Here are the numbers:") that the expected answer does not have."""
    out = [_BULLET_RE.sub("", ln.strip()).rstrip(".,;").strip() for ln in normalize(text).splitlines() if ln.strip()]
    if expected and out and out[0].endswith(":") and out[0] != expected[0]:
        out = out[1:]
    return out


def _numbers(text, skip=()):
    out = []
    for raw in _NUMBER_RE.findall(text or ""):
        n = re.sub(r"[,_ ]", "", raw)
        if n not in skip:
            out.append(n)
    return out


def _looks_like(line, expected):
    """What an unexpected line is made of: an expected line doubled ('33'), two consecutive ones glued ('34')."""
    for a in expected:
        if a and line == a + a:
            return " (%s doubled)" % a
    for a, b in zip(expected, expected[1:]):
        if line == a + b:
            return " (%s and %s glued)" % (a, b)
    return ""


def line_difference(expected, received):
    """What a line-by-line answer lost or gained: missing, duplicated and unexpected lines, and the first difference."""
    exp, got = list(expected), list(received)
    missing = [x for x in exp if x not in got]
    duplicated = sorted(set(x for x in got if got.count(x) > exp.count(x) and x in exp), key=got.index)
    extra = [x for x in got if x not in exp]
    first = next((i for i, (a, b) in enumerate(zip(exp, got)) if a != b), min(len(exp), len(got)))
    parts = []
    if missing:
        parts.append("missing %s" % ", ".join(missing[:8]))
    if duplicated:
        parts.append("duplicated %s" % ", ".join(duplicated[:8]))
    if extra:
        parts.append("unexpected %s" % ", ".join(repr(x) + _looks_like(x, exp) for x in extra[:8]))
    parts.append("first difference at line %d (%d lines, expected %d)" % (first + 1, len(got), len(exp)))
    return "; ".join(parts)


def matches(match, expected, received, prompt=""):
    """(ok, why not). ``exact``: the normalized answer equals ``expected``; ``lines``: line by line (see
    :func:`_lines`); ``number``: the first number of the answer that is not in the prompt equals
    ``expected`` (thousands separators allowed); ``word``: ``expected`` occurs as a whole word, case-insensitively."""
    if match == "lines":
        exp = _lines(expected)
        got = _lines(received, exp)
        return (True, "") if exp == got else (False, line_difference(exp, got))
    if match == "number":
        got = _numbers(normalize(received), skip=set(_numbers(prompt)))
        if got and got[0] == re.sub(r"[,_ ]", "", str(expected)):
            return True, ""
        return False, ("the answer's first number is %s, not %s" % (got[0], expected)) if got else "the answer has no number"
    if match == "word":
        if re.search(r"(?<!\w)%s(?!\w)" % re.escape(str(expected)), normalize(received), re.I):
            return True, ""
        return False, "%r is not in the answer" % str(expected)
    got = normalize(received)
    return (True, "") if got == normalize(str(expected)) else (False, "the answer is not exactly %r" % str(expected))


def request_body(check, model, chat_template_kwargs):
    """The request of one check: greedy (temperature 0), not streamed; completions ask for the tokens' logprobs. A chat
    check sends its own ``chat_template_kwargs`` when it has them (``{}``: none), else the run's."""
    body = {"model": model, "max_tokens": int(check.get("max_tokens") or 64), "temperature": 0, "stream": False}
    if check.get("endpoint", "chat") == "chat":
        body["messages"] = [{"role": "user", "content": check["prompt"]}]
        if check.get("chat_template_kwargs") is not None:
            chat_template_kwargs = check["chat_template_kwargs"]
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
        if check.get("min_mean_logprob") is not None:
            body["logprobs"] = True
    else:
        body.update(prompt=check["prompt"], logprobs=1)
    return body


def mean_logprob(choice):
    """The mean log-probability of the answer's tokens (completions: ``logprobs.token_logprobs``, chat:
    ``logprobs.content[].logprob``), or None when the server returned none."""
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(lp, dict):
        return None
    vals = lp.get("token_logprobs")
    if vals is None and isinstance(lp.get("content"), list):
        vals = [t.get("logprob") for t in lp["content"] if isinstance(t, dict)]
    vals = [float(v) for v in vals or [] if isinstance(v, (int, float))]
    return round(sum(vals) / len(vals), 3) if vals else None


def answer_of(endpoint, resp):
    """(content, reasoning_content, choice) of a response."""
    choices = resp.get("choices") if isinstance(resp, dict) else None
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    if endpoint == "chat":
        msg = choice.get("message") or {}
        return msg.get("content"), msg.get("reasoning_content"), choice
    return choice.get("text"), None, choice


def thinking_in(content):
    """The thinking a chat answer's ``content`` holds, or None when it has no ``<think>``/``</think>`` tag: the text
    before the last ``</think>`` (Qwen3.5/3.6: no opening tag, it is in the prompt), else the text after ``<think>``."""
    text = content or ""
    if THINK_END in text:
        return text.rsplit(THINK_END, 1)[0].replace(THINK_START, "").strip() or "(an empty thinking block)"
    if THINK_START in text:
        return text.split(THINK_START, 1)[1].strip() or "(an empty thinking block)"
    return None


def judge(check, status, resp):
    """One check's outcome: dict(name, endpoint, prompt, expected, received, ok, kind, why, mean_logprob).
    kind: None (passed), ``http`` (no answer), ``reasoning_only`` (empty content, the answer in reasoning_content),
    ``thinking_in_content`` (chat content holds the thinking; the answer is still matched after it), ``degenerate``
    (garbage), ``wrong`` (a readable wrong answer), ``low_logprob``."""
    endpoint = check.get("endpoint", "chat")
    out = {"name": check.get("name") or check["prompt"][:24], "endpoint": PATHS[endpoint], "prompt": check["prompt"],
           "expected": str(check["expected"]), "received": None, "ok": False, "kind": None, "why": "", "mean_logprob": None}
    if status != 200 or not isinstance(resp, dict):
        out.update(kind="http", why="HTTP %s: %s" % (status, str(resp)[:200] if resp is not None else "no answer"))
        return out
    content, reasoning, choice = answer_of(endpoint, resp)
    out["received"], out["mean_logprob"] = content, mean_logprob(choice)
    if reasoning:
        out["reasoning_content"] = reasoning[:300]
    if not (content or "").strip() and (reasoning or "").strip():
        out.update(kind="reasoning_only", why="content is empty; the whole answer is in reasoning_content")
        return out
    thought = thinking_in(content) if endpoint == "chat" else None
    if thought is not None:
        if THINK_END in content:
            ok, why = matches(check.get("match") or "exact", check["expected"], content.rsplit(THINK_END, 1)[1], check["prompt"])
            after = "after it the answer matches" if ok else "after it the answer does not match either: " + why
        else:
            after = "the thinking did not close within max_tokens (no answer after it)"
        out.update(kind="thinking_in_content", thinking=thought[:300], why="content holds the model's thinking (%s tag); %s" % (
            THINK_END if THINK_END in content else THINK_START, after))
        return out
    deg = detect_degenerate(content, prompt=check["prompt"])
    if deg["degenerate"]:
        out.update(kind="degenerate", why="degenerate text (%s)" % deg["reason"])
        return out
    ok, why = matches(check.get("match") or "exact", check["expected"], content, check["prompt"])
    if not ok:
        out.update(kind="wrong", why=why)
        return out
    floor, mean = check.get("min_mean_logprob"), out["mean_logprob"]
    if floor is not None and mean is not None and mean < float(floor):
        out.update(kind="low_logprob", why="mean logprob %s of the greedy answer is below %s" % (mean, floor))
        return out
    out.update(ok=True)
    return out


def probe_check(prompt, regex, text):
    """The gate's content probe (``/v1/completions``) as a failed check: readable text that misses its regex."""
    return {"name": "probe", "endpoint": PATHS["completions"], "prompt": prompt, "expected": "text matching %r" % regex, "received": text,
            "ok": False, "kind": "wrong", "why": "the text does not match %r" % regex, "mean_logprob": None}


def run_checks(post, checks, model, chat_template_kwargs=None, workers=8):
    """Ask every check concurrently; ``post(path, body)`` -> (status, parsed JSON). Returns dict(passed, elapsed_s, checks)."""
    t0 = time.time()
    checks = list(checks or [])

    def one(check):
        endpoint = check.get("endpoint", "chat")
        status, resp = post(PATHS[endpoint], request_body(check, model, chat_template_kwargs))
        return judge(check, status, resp)

    if not checks:
        return {"passed": True, "elapsed_s": 0.0, "checks": []}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(checks)))) as pool:
        results = list(pool.map(one, checks))
    return {"passed": all(r["ok"] for r in results), "elapsed_s": round(time.time() - t0, 3), "checks": results}


def spec_on(server_args):
    return bool((server_args or {}).get("speculative_algorithm"))


# The collection's own expectations (its checks, its probe): a healthy server of the supported models meets them, so a
# miss is the server's. A run's own check or probe regex, or a min_mean_logprob floor (the run's: null by default), may
# be what cannot be met.
_SHIPPED = set((c["prompt"], str(c["expected"])) for c in DEFAULT_CHECKS) | {(PROBE_PROMPT, "text matching %r" % PROBE_REGEX)}


def _own_expectation(r):
    """Whether a failed check missed an expectation the run set: a readable answer (not garbage, not the parser's)."""
    return r["kind"] == "low_logprob" or (r["kind"] == "wrong" and (r["prompt"], r["expected"]) not in _SHIPPED)


def _fix_of(r):
    if r["kind"] == "low_logprob":
        return "%r: its min_mean_logprob (from a known-good run's mean_logprob, or null)" % r["name"]
    if r["name"] == "probe":
        return "the probe: sglang_server_probe.regex (the gate's expected_probe_regex)"
    return "%r: its expected and match in sglang_server_known_answer.checks (the gate's known_answer_checks)" % r["name"]


def expectation_suspect(failed, passed=0):
    """The suspect "the check's own expectation" of the failed checks that missed one the run set, or None."""
    own = [r for r in failed if _own_expectation(r)]
    if not own:
        return None
    return {"suspect": "the check's own expectation, on a server that is otherwise healthy (ready, /health, the content probe "
                       "readable, %d other check(s) passed): %s" % (passed, "; ".join(
                           "%r expects %s and got %s (%s)" % (r["name"], _show(r["expected"], 80), _show(r["received"], 80), r["why"])
                           for r in own)),
            "remedy": "if the answer is right, fix the check: " + "; ".join(_fix_of(r) for r in own)}


def suspects(server_args, version=None, architecture=None, config=None):
    """The suspects of a wrong answer, most likely first, each dict(suspect, remedy): speculative decoding when on, the
    SGLang version against the compatibility table, tensor parallelism when tp > 1."""
    sa = server_args or {}
    out = []
    if spec_on(sa):
        out.append({"suspect": "speculative decoding is on (--speculative-algorithm %s): a draft token accepted wrongly is dropped or "
                               "duplicated in the answer" % sa.get("speculative_algorithm"),
                    "remedy": "turn it off: set %s to null in sglang_server_options (or remove them there) and re-run the serve stage"
                              % ", ".join(SPEC_KEYS)})
    tp = sa.get("tp_size") or 1
    if version:
        res = compat.check(version, architecture or "?", tp, config=config)
        if res["action"] != "ok":
            out.append({"suspect": res["message"], "remedy": res["remedy"]})
        else:
            out.append({"suspect": "SGLang %s: the compatibility table knows no problem with %s at tp=%s, but a regression it does "
                                   "not list yet is possible" % (version, architecture or "this model", tp),
                        "remedy": "pin the last SGLang version that passed (sglang_install_version) and report the regression"})
    else:
        out.append({"suspect": "the SGLang version (not given to the gate): compare it with the compatibility table",
                    "remedy": "run kpro.gpu_serving.sglang_compat for the installed version, model architecture and tp_size"})
    if int(tp) > 1:
        out.append({"suspect": "tensor parallelism (tp_size=%s): a numerically broken all-reduce gives plausible but wrong answers" % tp,
                    "remedy": "try --disable-custom-all-reduce (sglang_server_options: {disable_custom_all_reduce: true}), or "
                              "sglang_install_tp: 1 when the model fits on one GPU"})
    return out


def _show(text, limit=160):
    return repr(text if text is None or len(text) <= limit else text[:limit] + "...")


def _phase(failed):
    kinds = set(r["kind"] for r in failed)
    if "degenerate" in kinds:
        return "degenerate_output"
    if kinds == {"http"}:
        return "warmup_failed"
    return "wrong_answer"


def _reasoning_remedy(server_args):
    parser = (server_args or {}).get("reasoning_parser")
    return ("The chat answer is only in reasoning_content: the reasoning parser (%s) took all of it as thinking, so a client "
            "reading content gets nothing. The chat template kept thinking on (the check sends chat_template_kwargs "
            "from sglang_server_known_answer; set what this model's template understands, Qwen3: {enable_thinking: false}), or "
            "the thinking did not close within the check's max_tokens; check that --reasoning-parser matches the model "
            "(qwen3 for Qwen3) or drop it from sglang_server_options." % ("--reasoning-parser %s" % parser if parser else "none configured"))


def reasoning_parser_for(architecture):
    """The SGLang reasoning parser of a model architecture (Qwen3 family: qwen3), or None when not known here."""
    return "qwen3" if (architecture or "").startswith("Qwen3") else None


def _thinking_remedy(server_args, architecture, names):
    sa = server_args or {}
    want = reasoning_parser_for(architecture)
    have = sa.get("reasoning_parser") if "reasoning_parser" in sa else "?"
    if have is None:
        how = "the server runs without --reasoning-parser, so all of the generated text, the thinking and its </think> too, is content"
    elif have == "?":
        how = "the server's reasoning parser did not separate it (or none is configured)"
    else:
        how = "the server's --reasoning-parser %s does not separate this model's thinking" % have
    return ("Chat clients get the model's thinking in content (check %s; plain_chat asks as a client that sends no "
            "chat_template_kwargs): %s. Run SGLang "
            "with the model's reasoning parser, %s (sglang_server_options.reasoning_parser: %s; the role sets it for the architectures "
            "in sglang_server_model_parsers, Qwen3.5/3.6 among them, unless sglang_server_options sets it to null), so that the "
            "thinking goes to reasoning_content and content holds the answer." % (
                ", ".join(names), how, "--reasoning-parser %s" % (want or "qwen3 for Qwen3"), want or "<the parser of this model>"))


def _parser_remedy(failed, server_args, architecture):
    """The remedies of the parser kinds among ``failed`` (the answer in reasoning_content only, thinking in content)."""
    out = []
    if any(r["kind"] == "reasoning_only" for r in failed):
        out.append(_reasoning_remedy(server_args))
    thinking = [r["name"] for r in failed if r["kind"] == "thinking_in_content"]
    if thinking:
        out.append(_thinking_remedy(server_args, architecture, thinking))
    return " ".join(out)


def failure(result, server_args=None, version=None, architecture=None, config=None):
    """dict(phase, evidence, remedy) for a known-answer result that did not pass: ``wrong_answer`` (a readable wrong answer,
    the answer only in reasoning_content, a low logprob), ``degenerate_output`` (garbage), ``warmup_failed`` (no answer).
    A readable miss of an expectation the run set (its own check, probe regex or logprob floor) makes that expectation a
    suspect: the first one when no other check failed, so a check that can never pass is not blamed on the server."""
    failed = [r for r in result["checks"] if not r["ok"]]
    phase = _phase(failed)
    evidence = []
    for r in failed:
        evidence += ["known-answer check %r failed (%s) via POST %s: %s" % (r["name"], r["kind"], r["endpoint"], r["why"]),
                     "  prompt:   %s" % _show(r["prompt"]), "  expected: %s" % _show(r["expected"]),
                     "  received: %s" % _show(r["received"])]
        if r.get("reasoning_content"):
            evidence.append("  reasoning_content: %s" % _show(r["reasoning_content"]))
        if r.get("thinking"):
            evidence.append("  thinking in content: %s" % _show(r["thinking"]))
        if r.get("mean_logprob") is not None:
            evidence.append("  mean logprob of the answer: %s" % r["mean_logprob"])
    if all(r["kind"] in PARSER_KINDS for r in failed):
        return {"phase": phase, "evidence": evidence, "remedy": _parser_remedy(failed, server_args, architecture)}
    found = suspects(server_args, version, architecture, config)
    own = expectation_suspect(failed, len(result["checks"]) - len(failed))
    if own:  # first when every failed check missed an expectation the run set; else after the server's suspects
        found = [own] + found if all(_own_expectation(r) for r in failed) else found + [own]
    evidence += ["suspect %d: %s" % (i + 1, s["suspect"]) for i, s in enumerate(found)]
    what = "degenerate text" if phase == "degenerate_output" else "wrong answers" if phase == "wrong_answer" else "no answer"
    remedy = "The server answers with %s to %d of %d known-answer checks at temperature 0. Suspects, most likely first: %s" % (
        what, len(failed), len(result["checks"]), " ".join("(%d) %s: %s." % (i + 1, s["suspect"], s["remedy"]) for i, s in enumerate(found)))
    if any(r["kind"] in PARSER_KINDS for r in failed):
        remedy += " " + _parser_remedy(failed, server_args, architecture)
    return {"phase": phase, "evidence": evidence, "remedy": remedy}
