"""A thinking model's chat answer, and what ``--reasoning-parser`` makes of it, as SGLang 0.5.11 does it.

The model. A Qwen3-family architecture (``Qwen3*`` in config.json's ``architectures``: Qwen3, Qwen3-MoE, Qwen3-Next,
Qwen3.5/3.6 ``Qwen3_5ForConditionalGeneration``) thinks before it answers unless the chat request turns thinking off.
Qwen3.5/3.6's chat template ends the prompt with ``<|im_start|>assistant\\n`` and then ``<think>\\n`` (the default), or
``<think>\\n\\n</think>\\n\\n`` when ``enable_thinking is defined and enable_thinking is false`` (Jinja's ``false`` test:
only the boolean). The thinking's opening tag is therefore in the prompt: the generated text is the thinking, then
``\\n</think>\\n\\n``, then the answer, and ``</think>`` is no special token (the tokenizer keeps it in the text). With
``enable_thinking: false`` the closed empty block is in the prompt and the text is the answer alone. A request with
``reasoning_effort: "none"`` gets ``enable_thinking: false`` (0.5.11 entrypoints/openai/protocol.py:726-735). The
completions endpoints apply no chat template: no thinking there.

The parser (non-streaming chat, 0.5.11 entrypoints/openai/serving_chat.py:1059-1105): only with ``--reasoning-parser``
and the request's ``separate_reasoning`` (default true, protocol.py:644), a ``ReasoningParser`` is made with
``force_reasoning = template_manager.force_reasoning or _get_reasoning_from_request(request)`` and its
``detect_and_parse`` (parser/reasoning_parser.py:55-102) splits the text: without the start tag and not forced, all of
it is content (60-63); forced or with the start tag, the text before ``</think>`` is reasoning_content and the rest,
stripped, content (91-99); with no ``</think>``, all of it is reasoning ("Assume reasoning was truncated before end
token", 88-89). The message has ``content=text if text else None`` and ``reasoning_content`` likewise (1099-1105).
``--reasoning-parser qwen3`` forces reasoning for every request that does not send ``enable_thinking: false``
(serving_chat.py:1396-1401), so Qwen3.6's thinking, which has no opening tag, is still taken as reasoning. Without a
parser the whole text, thinking and ``</think>`` included, is content.

The template's own force (0.5.11 managers/template_manager.py:94-96, set from the tokenizer's chat template at
144-148): the regex ``<\\|im_start\\|>assistant\\\\n<think>\\\\n`` over the template's source. Qwen3.6's template writes
``'<|im_start|>assistant\\n'`` and ``'<think>\\n'`` as two strings, so it does not match; a template that writes them as
one (Qwen3-Thinking-2507) forces reasoning even with ``enable_thinking: false`` (the ``reasoning_only`` drill's case).
"""

import json
import os
import re

THINK_START, THINK_END = "<think>", "</think>"

# 0.5.11 parser/reasoning_parser.py:542-561 (ReasoningParser.DetectorMap): parser -> (start, end, the detector's own
# force_reasoning when it ignores the one passed: DeepSeekR1Detector True (198-213), KimiDetector False (259-273)).
# gpt-oss's HarmonyParser (327-390) is approximated by its start and end tokens.
_QWEN3 = (THINK_START, THINK_END, None)
_R1 = (THINK_START, THINK_END, True)
DETECTORS = {
    "deepseek-r1": _R1, "deepseek-v3": _QWEN3, "glm45": _QWEN3, "hunyuan": _QWEN3,
    "gpt-oss": ("<|channel|>analysis<|message|>", "<|end|>", None), "kimi": ("\u25c1think\u25b7", "\u25c1/think\u25b7", False),
    "kimi_k2": _QWEN3, "mimo": _QWEN3, "qwen3": _QWEN3, "qwen3-thinking": _QWEN3, "minimax": _QWEN3,
    "minimax-append-think": _QWEN3, "step3": _R1, "step3p5": _R1, "mistral": ("[THINK]", "[/THINK]", None),
    "nemotron_3": _QWEN3, "interns1": _QWEN3, "gemma4": ("<|channel>", "<channel|>", None),
}
PARSERS = tuple(DETECTORS)
# reasoning_parser.py:577-579: these parsers always force reasoning
_FORCED = ("qwen3-thinking", "gpt-oss", "minimax")
# reasoning_parser.py:528 (Gemma4Detector.think_start_self_label)
_SELF_LABEL = {"gemma4": "thought\n"}
# template_manager.py:95
_FORCE_PATTERN = re.compile(r"<\|im_start\|>assistant\\n<think>\\n")


def thinks(arch):
    """Whether the model thinks before answering a chat request (a Qwen3-family architecture)."""
    return (arch or "").startswith("Qwen3")


def template_kwargs(body):
    """The chat template's keyword arguments of a request: its ``chat_template_kwargs``, with ``enable_thinking`` and
    ``thinking`` false when ``reasoning_effort`` is "none" (protocol.py:726-735)."""
    kw = body.get("chat_template_kwargs")
    kw = dict(kw) if isinstance(kw, dict) else None
    if body.get("reasoning_effort") == "none":
        kw = kw or {}
        kw.setdefault("thinking", False)
        kw.setdefault("enable_thinking", False)
    return kw


def thinking_on(kwargs):
    """Qwen3.5/3.6's template: thinking unless ``enable_thinking is defined and enable_thinking is false``."""
    return not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)


def thinking(prompt):
    """The short thinking the stand-in's model does before an answer (deterministic, about 30 tokens)."""
    p = " ".join((prompt or "").split())
    if len(p) > 100:
        p = p[:100] + "..."
    return "The user asks: \"%s\" This is simple. I will answer exactly in the form that is asked for, with nothing else." % p


def generated(prompt, answer):
    """The text a thinking model generates after the template's ``<think>\\n``: the thinking, the end tag, the answer."""
    return "%s\n%s\n\n%s" % (thinking(prompt), THINK_END, answer)


def template_forces_reasoning(model_path, chat_template=None):
    """0.5.11 TemplateManager.force_reasoning (template_manager.py:94-96 over the tokenizer's chat template, 144-148):
    the template from --chat-template (a file), else tokenizer_config.json's ``chat_template`` or chat_template.jinja."""
    source = None
    paths = [chat_template] if chat_template and os.path.isfile(chat_template) else []
    paths += [os.path.join(model_path or "", "chat_template.jinja")]
    for path in paths:
        if os.path.isfile(path):
            with open(path, errors="replace") as f:
                source = f.read()
            break
    if source is None:
        try:
            with open(os.path.join(model_path or "", "tokenizer_config.json")) as f:
                source = json.load(f).get("chat_template")
        except (OSError, ValueError, AttributeError):
            source = None
    if isinstance(source, list):     # named templates: [{"name": ..., "template": ...}]
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    return bool(isinstance(source, str) and _FORCE_PATTERN.search(source))


def reasoning_from_request(parser, kwargs, effort=None):
    """0.5.11 OpenAIServingChat._get_reasoning_from_request (serving_chat.py:1372-1420)."""
    if not parser:
        return False
    if parser == "deepseek-v3":
        return kwargs is not None and kwargs.get("thinking") is True
    if parser in ("gemma4", "mimo"):
        return kwargs is not None and kwargs.get("enable_thinking") is True
    if parser == "kimi_k2":
        return not kwargs or kwargs.get("thinking") is not False
    if parser in ("qwen3", "glm45", "nemotron_3", "interns1"):
        return not kwargs or kwargs.get("enable_thinking") is not False
    if parser == "hunyuan":
        return effort not in (None, "none", "no_think")
    if parser == "mistral":
        return effort is not None and effort != "none"
    return True


def detect_and_parse(parser, text, force_reasoning):
    """(reasoning_text, normal_text) of BaseReasoningFormatDetector.detect_and_parse (reasoning_parser.py:55-102) for
    ``parser``, as ReasoningParser sets it up (563-599); no tool start token, no continued final message."""
    start, end, fixed = DETECTORS[parser]
    if parser == "minimax-append-think":     # MiniMaxAppendThinkDetector (422-423): all content, <think> in front
        return "", start + text
    forced = fixed if fixed is not None else (True if parser in _FORCED else bool(force_reasoning))
    if not (forced or start in text):
        return "", text
    processed = text.replace(start + _SELF_LABEL.get(parser, ""), "").strip()
    if end not in processed:
        return processed, ""
    reasoning, normal = processed.split(end, 1)
    return reasoning, normal.strip()


def separate(text, parser, body, template_force=False):
    """(content, reasoning_content) of a non-streamed chat answer whose generated text is ``text``, as
    serving_chat.py:1059-1105 returns them (None for an empty one)."""
    reasoning = None
    if parser and body.get("separate_reasoning", True) is not False:
        force = template_force or reasoning_from_request(parser, template_kwargs(body), body.get("reasoning_effort"))
        reasoning, text = detect_and_parse(parser, text or "", force)
    return (text or None), (reasoning or None)
