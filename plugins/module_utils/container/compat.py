# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compatibility table: SGLang version range x model architecture x tensor parallel size -> refuse or warn.

Checked by the preflight play and before install (stage 5); a refusal is the gate's
``known_bad_version`` phase. Versions and ranges follow PEP 440 (release, pre, post, dev
segments and ``==X.*`` wildcards), implemented here because ``packaging`` may be missing on the
target. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container.sglang_releases import NEWEST, REGENERATE, VERSIONS, not_in_table

DENSE_QWEN35 = ["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"]

# Each rule: id, sglang (PEP 440 specifier set), architectures (list, "*" = any), tp (">1", "any", ">=N", "==N"),
# action (refuse | warn), pr, reason, remedy; optional "when" (a condition on the model config, see _when()) and
# "symptom": "start" for a bug that stops the server's start (check() leaves it out unless asked: start_failures).
RULES = [
    {
        "id": "sglang-0.5.9-qwen3.5-dense-tp",
        "sglang": ">=0.5.9.dev0,<0.5.10",
        "architectures": DENSE_QWEN35,
        "tp": ">1",
        "action": "refuse",
        "pr": "#19070",
        "reason": ("SGLang 0.5.9 never all-reduces the dense Qwen3.5 MLP output across TP ranks (the ForwardBatch lands in "
                   "should_allreduce_fusion), so every layer is wrong at TP > 1: garbled, repeated or empty output. Fixed by "
                   "sgl-project/sglang PR #19070 (with #19411, the last-layer all-reduce fusion fix), after 0.5.9."),
        "remedy": "Pin sglang >= 0.5.11 (0.5.10.x has the GDN regression of PR #22312), or run at --tp-size 1.",
        "sources": ["https://github.com/sgl-project/sglang/pull/19070", "https://github.com/sgl-project/sglang/pull/19411",
                    "https://github.com/gpustack/gpustack/issues/4730", "https://github.com/THUDM/slime/issues/1671"],
    },
    {
        "id": "sglang-0.5.10-qwen3.5-gdn-noncontiguous",
        "sglang": ">=0.5.10.dev0,<0.5.11",
        "architectures": DENSE_QWEN35,
        "tp": "any",
        "when": {"gdn_head_ratio_not_in": [1, 2, 4]},
        "action": "refuse",
        "pr": "#22312",
        "reason": ("SGLang 0.5.10 and 0.5.10.post1 take the fallback BA path of Qwen3_5GatedDeltaNet when linear_num_value_heads / "
                   "linear_num_key_heads is not 1, 2 or 4 (Qwen3.5/3.6-27B: 48/16 = 3); its non-contiguous a/b views make GDN "
                   "gating wrong (accuracy regression 49/50 -> 3/50). Fixed by sgl-project/sglang PR #22312 (issue #22311), in 0.5.11."),
        "remedy": "Pin sglang >= 0.5.11.",
        "sources": ["https://github.com/sgl-project/sglang/pull/22312", "https://github.com/sgl-project/sglang/issues/22311"],
    },
    {
        # 0.5.11 (PR #23707 put the code in; 0.5.10.post1 has no jit_kernel/activation.py and runs sgl_kernel's
        # prebuilt silu_and_mul), 0.5.12 and 0.5.12.post1 carry jit_kernel/csrc/elementwise/activation.cuh:94-96 unchanged;
        # 0.5.13 has PR #26444's kernel_fn_t. Compiled here with sglang's flags, nvcc 13.0.88 + g++ 12.2: 0.5.11, 0.5.12,
        # 0.5.12.post1 fail with the error below, 0.5.13 builds (its unary kernel included).
        "id": "sglang-jit-activation-nvcc",
        "sglang": ">=0.5.11.dev0,<0.5.13",
        # every model with a SiLU (or GELU) gated MLP on CUDA: srt/layers/activation.py:54-59 imports silu_and_mul from
        # sglang.jit_kernel.activation whenever is_cuda()
        "architectures": ["*"],
        "tp": "any",
        # warn: the failure depends on the nvcc / host compiler pair of the container, which the table cannot see
        "action": "warn",
        # the server fails to start; a server that answers is past it (known_answer's suspects leave it out)
        "symptom": "start",
        "pr": "#26444",
        "reason": ("SGLang 0.5.11 to 0.5.12.post1 run SiluAndMul through their own JIT kernel (jit_kernel/csrc/elementwise/"
                   "activation.cuh, built by tvm-ffi with nvcc at the first forward pass); its select_kernel's trailing "
                   "decltype does not compile with some nvcc / host compiler pairs (sgl-project/sglang#25487: nvcc 13.0 with "
                   "torch 2.11.0+cu130; #25682: nvcc 12.9; reproduced with nvcc 13.0.88 and g++ 12.2): 'activation.cuh:95:52: "
                   "error: type/value mismatch at argument 1 in template parameter list ... expected a type, got "
                   "ActivationKind::kSiLU' inside 'ninja exited with status 1'. The first start then fails during CUDA graph "
                   "capture, after the model has loaded (with --disable-cuda-graph, at the warmup request). Fixed by "
                   "sgl-project/sglang PR #26444, in 0.5.13."),
        "remedy": ("Pin sglang >= 0.5.13 (sglang_install_version, and regenerate the lock: roles/sglang_install/files/locks/"
                   "regenerate.sh), or, when this container's nvcc and g++ are known to compile it, override the rule "
                   "knowingly (sglang_install_compat_overrides: {sglang-jit-activation-nvcc: ignore})."),
        "sources": ["https://github.com/sgl-project/sglang/pull/26444", "https://github.com/sgl-project/sglang/issues/25487",
                    "https://github.com/sgl-project/sglang/issues/25682", "https://github.com/sgl-project/sglang/pull/24136"],
    },
]

_ACTION_RANK = {"ok": 0, "ignore": 0, "warn": 1, "refuse": 2}
# what an override may set a rule's action to
ACTIONS = ("ignore", "warn", "refuse")

# --------------------------------------------------------------------------------------------
# PEP 440 (the subset that release versions of Python packages use)
# --------------------------------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>a|b|rc|alpha|beta|c|pre|preview)[-_.]?(?P<pre_n>\d+)?)?"
    r"(?:(?:-(?P<post_n1>\d+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?))?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$",
    re.IGNORECASE,
)
_PRE_MAP = {"a": "a", "alpha": "a", "b": "b", "beta": "b", "rc": "rc", "c": "rc", "pre": "rc", "preview": "rc"}
_PRE_ORDER = {"a": 0, "b": 1, "rc": 2}


class InvalidVersion(ValueError):
    pass


def parse_version(text):
    """Parse a PEP 440 version into a dict (epoch, release tuple, pre, post, dev, local)."""
    m = _VERSION_RE.match(str(text))
    if not m:
        raise InvalidVersion("not a PEP 440 version: %r" % (text,))
    pre = None
    if m.group("pre_l"):
        pre = (_PRE_MAP[m.group("pre_l").lower()], int(m.group("pre_n") or 0))
    post = None
    if m.group("post_n1") is not None:
        post = int(m.group("post_n1"))
    elif m.group("post_l"):
        post = int(m.group("post_n2") or 0)
    dev = int(m.group("dev_n") or 0) if m.group("dev_l") else None
    release = tuple(int(x) for x in m.group("release").split("."))
    return {"epoch": int(m.group("epoch") or 0), "release": release, "pre": pre, "post": post, "dev": dev,
            "local": m.group("local")}


def _release_key(release):
    r = list(release)
    while len(r) > 1 and r[-1] == 0:
        r.pop()
    return tuple(r)


def version_key(text):
    """A tuple that sorts versions the way PEP 440 does (local segments ignored)."""
    v = parse_version(text) if not isinstance(text, dict) else text
    inf = float("inf")
    # pre-release: dev-only versions sort before a/b/rc of the same release
    if v["pre"] is not None:
        pre = (_PRE_ORDER[v["pre"][0]], v["pre"][1])
    elif v["dev"] is not None and v["post"] is None:
        pre = (-1, 0)
    else:
        pre = (inf, 0)
    post = (-1,) if v["post"] is None else (v["post"],)
    dev = (inf,) if v["dev"] is None else (v["dev"],)
    return (v["epoch"], _release_key(v["release"]), pre, post, dev)


def compare(a, b):
    ka, kb = version_key(a), version_key(b)
    return (ka > kb) - (ka < kb)


def _is_prerelease(v):
    return v["pre"] is not None or v["dev"] is not None


def _match_clause(version, op, spec):
    v = parse_version(version)
    if op in ("==", "!=") and spec.endswith(".*"):
        prefix = parse_version(spec[:-2])["release"]
        rel = v["release"] + (0,) * max(0, len(prefix) - len(v["release"]))
        eq = rel[:len(prefix)] == prefix
        return eq if op == "==" else not eq
    if op == "===":
        return str(version).strip().lower() == spec.strip().lower()
    s = parse_version(spec)
    c = compare(v, s)
    if op == "==":
        return c == 0
    if op == "!=":
        return c != 0
    if op == "<=":
        return c <= 0
    if op == ">=":
        return c >= 0
    if op == "<":
        # "<V" excludes pre-releases of V (PEP 440) unless V itself is one
        if c >= 0:
            return False
        return not (_is_prerelease(v) and not _is_prerelease(s) and _release_key(v["release"]) == _release_key(s["release"]))
    if op == ">":
        # ">V" excludes post-releases of V unless V itself is one
        if c <= 0:
            return False
        return not (v["post"] is not None and s["post"] is None and _release_key(v["release"]) == _release_key(s["release"]))
    if op == "~=":
        rel = s["release"]
        if len(rel) < 2:
            raise InvalidVersion("~= needs at least two release segments: %r" % spec)
        upper = ".".join(str(x) for x in rel[:-1]) + ".*"
        return compare(v, s) >= 0 and _match_clause(version, "==", upper)
    raise InvalidVersion("unknown operator %r" % op)


_CLAUSE_RE = re.compile(r"^\s*(===|~=|==|!=|<=|>=|<|>)\s*(\S+)\s*$")


def version_matches(version, specifier, prereleases=None):
    """True when ``version`` satisfies the PEP 440 ``specifier`` set (comma-separated clauses; "" or "*" = any).

    prereleases: None (the PEP's default: a pre-release matches only when a clause names one), True or False.
    """
    spec = (specifier or "").strip()
    if spec in ("", "*"):
        return True
    clauses = []
    for part in spec.split(","):
        m = _CLAUSE_RE.match(part)
        if not m:
            raise InvalidVersion("bad specifier clause %r" % part)
        clauses.append((m.group(1), m.group(2)))
    v = parse_version(version)
    if _is_prerelease(v):
        allowed = prereleases
        if allowed is None:
            allowed = any(_is_prerelease(parse_version(s)) for _op, s in clauses if not s.endswith(".*"))
        if not allowed:
            return False
    return all(_match_clause(version, op, s) for op, s in clauses)


# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------

def _tp_matches(expr, tp):
    expr = str(expr or "any").strip()
    if expr in ("any", "*", ""):
        return True
    if tp is None:
        return True  # unknown TP: the rule may apply
    m = re.match(r"^(>=|<=|==|>|<)?\s*(\d+)$", expr)
    if not m:
        raise ValueError("bad tp expression %r" % expr)
    op, n = m.group(1) or "==", int(m.group(2))
    tp = int(tp)
    return {"==": tp == n, ">": tp > n, "<": tp < n, ">=": tp >= n, "<=": tp <= n}[op]


def _when(cond, config):
    """Conditions on the model config; with no config the rule is assumed to apply."""
    if not cond:
        return True
    if config is None:
        return True
    tc = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    ratio_not_in = cond.get("gdn_head_ratio_not_in")
    if ratio_not_in is not None:
        kh, vh = tc.get("linear_num_key_heads"), tc.get("linear_num_value_heads")
        if not kh or not vh:
            return False
        return (int(vh) // int(kh)) not in ratio_not_in or int(vh) % int(kh) != 0
    return True


def check(version, architecture, tp, overrides=None, rules=None, config=None, start_failures=False):
    """Check an SGLang version against the table for one model architecture and TP size.

    overrides: dict {rule_id: "ignore" | "warn" | "refuse"} from the inventory, to downgrade (or upgrade) a
      rule knowingly; an override is reported in the result.
    rules: the table to use (default RULES; the inventory may extend it: RULES + extra).
    config: the model's config.json dict, for rules with a condition on the model.
    start_failures: also the rules with "symptom": "start" (a bug that stops the server's start, such as a JIT compile
      error at the first forward). verdict(), the preflight's and stage 5's question, asks for them; the suspects of a
      running server's wrong answer (known_answer.py) do not: a server that answers is past them.

    Returns dict(action: ok | warn | refuse, phase: "known_bad_version" | None, rules: [matched rules with their
    effective action], message, remedy).
    """
    overrides = overrides or {}
    table = RULES if rules is None else rules
    matched = []
    for rule in table:
        if rule.get("symptom") == "start" and not start_failures:
            continue
        archs = rule.get("architectures") or ["*"]
        if "*" not in archs and architecture not in archs:
            continue
        # a known-bad range also covers its pre-releases (0.5.9rc1 is as bad as 0.5.9)
        if not version_matches(version, rule.get("sglang", ""), prereleases=True):
            continue
        if not _tp_matches(rule.get("tp", "any"), tp):
            continue
        if not _when(rule.get("when"), config):
            continue
        r = dict(rule)
        if rule.get("id") in overrides:
            r["overridden_from"] = rule.get("action")
            r["action"] = overrides[rule["id"]]
        matched.append(r)
    action = "ok"
    for r in matched:
        if _ACTION_RANK.get(r["action"], 0) > _ACTION_RANK[action]:
            action = r["action"]
    if action == "ignore":
        action = "ok"
    effective = [r for r in matched if r["action"] in ("warn", "refuse")]
    if not effective:
        msg = "sglang %s with %s at tp=%s: no known problem." % (version, architecture, tp)
        if matched:
            msg += " Overridden: %s." % ", ".join("%s (%s -> %s)" % (r["id"], r["overridden_from"], r["action"]) for r in matched)
        return {"action": "ok", "phase": None, "rules": matched, "message": msg, "remedy": ""}
    verb = "is refused" if action == "refuse" else "has a known problem"
    msg = "sglang %s with %s at tp=%s %s: %s" % (
        version, architecture, tp, verb, " ".join("[%s, PR %s] %s" % (r["id"], r.get("pr", "?"), r.get("reason", "")) for r in effective))
    remedy = " ".join(sorted(set(r.get("remedy", "") for r in effective if r.get("remedy"))))
    return {"action": action, "phase": "known_bad_version" if action == "refuse" else None, "rules": matched, "message": msg,
            "remedy": remedy}


def _newest_post(version, ok):
    """The last post release of ``version``'s release in the table that ``ok`` accepts (0.5.13 -> 0.5.13.post1)."""
    same = [v for v in VERSIONS if parse_version(v)["release"] == parse_version(version)["release"] and ok(v)]
    return same[-1] if same else version


def newer_fixes(version, architecture, tp, matched, overrides=None, config=None):
    """Recommend, do not guess: for each rule that warns or refuses (``matched``: check()'s rules), the first release of
    the release table after ``version``, outside the rule's range, for which the table knows no problem at this
    architecture and TP. One line each: 'SGLang X fixes <rule id> (<PR>); consider sglang_install_version: X ...'."""
    def ok(v):
        return check(v, architecture, tp, overrides=overrides, config=config, start_failures=True)["action"] == "ok"
    out = []
    for rule in [r for r in matched if r.get("action") in ("warn", "refuse")]:
        fixed = [v for v in VERSIONS if compare(v, version) > 0 and not version_matches(v, rule.get("sglang", ""), True) and ok(v)]
        if fixed:
            pick = _newest_post(fixed[0], ok)
            out.append("SGLang %s fixes %s (%s); consider sglang_install_version: %s (a lock: %s %s <Python X.Y>, one per "
                       "container Python; docs/sglang-releases.md)" % (fixed[0], rule["id"], rule.get("pr") or "no PR", pick,
                                                                       REGENERATE, pick))
    return out


def verdict(version, architecture, tp, overrides=None, model_config=None, warn=None):
    """check() on the options of kpro.gpu_serving.sglang_compat (the module, and the filter of the same name that the
    roles use: the table and the inputs are the controller's). A refusal or an invalid input is raised as Failure;
    a rule that warns, and an override that names no rule, go to ``warn``. Returns the module's result."""
    warn = warn or (lambda msg: None)
    overrides = overrides or {}
    bad = dict((k, v) for k, v in overrides.items() if v not in ACTIONS)
    if bad:
        raise Failure("bad_input", "overrides: each value must be one of %s; got %s." % (", ".join(ACTIONS), bad))
    known = set(r["id"] for r in RULES)
    unknown = sorted(set(overrides) - known)
    try:
        result = check(version, architecture, tp, overrides=overrides, config=model_config, start_failures=True)
    except InvalidVersion as e:
        raise Failure("bad_version", "version %r: %s" % (version, e), remedy="Give a PEP 440 version such as 0.5.11.",
                      action="refuse", rules=[], prs=[], message=str(e))
    rules = [dict((k, v) for k, v in r.items() if k in ("id", "action", "overridden_from", "pr", "reason", "remedy", "sources"))
             for r in result["rules"]]
    prs = [r.get("pr") for r in result["rules"] if r.get("action") in ("warn", "refuse") and r.get("pr")]
    out = dict(changed=False, action=result["action"], phase=result["phase"], rules=rules, prs=prs,
               message=result["message"], remedy=result["remedy"])
    if unknown:
        warn("overrides name no rule of the compatibility table: %s (known: %s)." % (", ".join(unknown), ", ".join(sorted(known))))
    # a release after the table's newest: "no known problem" would claim what nobody has checked
    if compare(version, NEWEST) > 0:
        warn(not_in_table(version))
    if result["action"] == "warn":
        # the remedy too: a warning is all a normal run shows of a rule that warns (the filter's Display().warning)
        warn(result["message"] + (" Remedy: %s" % result["remedy"] if result["remedy"] else ""))
    # after the rule's own words: which release of the table fixes it (the preflight's and stage 5's one verdict)
    for line in newer_fixes(version, architecture, tp, result["rules"], overrides, model_config):
        warn(line)
    if result["action"] == "refuse":
        raise Failure("known_bad_version", result["message"], remedy=result["remedy"],
                      evidence=["rule %s (%s)" % (r["id"], r.get("pr") or "no PR") for r in rules if r.get("action") == "refuse"],
                      **dict((k, v) for k, v in out.items() if k not in ("phase", "remedy")))
    return out
