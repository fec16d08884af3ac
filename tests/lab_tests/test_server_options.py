"""Issue 29 in the lab: pp_size and max_total_tokens set in the inventory reach the memory plan and change its figures,
and the server launched with them holds what the plan planned (the stand-in allocates per rank as SGLang 0.5.11 does).

On two RTX A6000 (49140 MiB) and Qwen3.6-27B: TP 1 alone is refused before the running server is touched (its weights
do not fit one GPU); TP 1 with pp_size 2 splits the layers over two pipeline stages and serves; TP 2 with pp_size 2
needs four GPUs and is refused; max_total_tokens caps the KV pool. The module's fixture converges the whole playbook
once unless CT 129 already serves (test_serve_safety.py); the last test serves the role's defaults again.
"""

from __future__ import annotations

import json
import re
import time

from test_gpu_host_stage import play, recap
from test_serve_safety import ask, ct, serving, unit_props  # noqa: F401  pylint: disable=unused-import

STATE = "/var/lib/kpro-gpu-serving/sglang.json"


def serve(tmp, name, options):
    """The serve stage with these sglang_server_options over the role's defaults (extra vars, as an inventory sets them)."""
    path = tmp / ("%s.json" % name)
    path.write_text(json.dumps({"sglang_server_options": options}))
    t0 = time.time()
    r = play("--tags", "serve", "--skip-tags", "preflight", "-e", "@%s" % path)
    print("%s: %.0fs" % (name, time.time() - t0))
    return r


def stored_plan(lab):
    """The plan the running launch was started with (the serve stage's state file in CT 129)."""
    return json.loads(ct(lab, "cat", STATE).stdout)["plan"]


def scheduler_log(lab):
    return ct(lab, "cat", "/var/log/sglang/sglang.log").stdout


def test_pp_size_and_max_total_tokens_change_the_plans_figures(serving, tmp_path):
    lab = serving
    base = stored_plan(lab)["per_gpu"]
    print("role defaults (tp_size 2): weights %d MiB/GPU, KV %d tokens" % (base["weights_mib"], base["kv_tokens"]))

    # max_total_tokens caps the pool: the plan's tokens, the server's and the summary's are the cap
    r = serve(tmp_path, "max_total_tokens", {"max_total_tokens": 100000})
    assert recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-4000:]
    capped = stored_plan(lab)["per_gpu"]
    print("max_total_tokens 100000: KV %d tokens (the memory holds %d)" % (capped["kv_tokens"], capped["kv_capacity_tokens"]))
    assert capped["kv_tokens"] == 100000 and capped["kv_capacity_tokens"] == base["kv_tokens"] > 100000
    assert capped["weights_mib"] == base["weights_mib"]
    assert "KV cache: 100000 tokens" in r.stdout and "max_total_num_tokens=100000," in scheduler_log(lab)

    # TP 1: the whole model on one GPU does not fit; refused before the running server is touched
    before = unit_props(lab)
    r = serve(tmp_path, "tp1", {"tp_size": 1})
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-4000:]
    out = " ".join(r.stdout.split())      # the result's long lines come folded
    whole = int(re.search(r"The weights per GPU \((\d+) MiB = \(total_size", out).group(1))
    assert "weights_oom" in out and whole > 49140 - 800
    assert unit_props(lab)["InvocationID"] == before["InvocationID"] and ask(lab)[:2] == ["200", "200"]

    # TP 1 with two pipeline stages: each GPU holds about half the layers, and the server runs so
    r = serve(tmp_path, "pp2", {"tp_size": 1, "pp_size": 2})
    assert recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-4000:]
    staged = stored_plan(lab)["per_gpu"]
    print("tp_size 1, pp_size 2: weights %d MiB/GPU (one GPU would need %d), KV %d tokens"
          % (staged["weights_mib"], whole, staged["kv_tokens"]))
    assert staged["weights_mib"] < whole * 0.55 and staged["weights_mib"] != base["weights_mib"]
    log = scheduler_log(lab)
    for stage in ("PP0", "PP1"):
        usage = float(re.search(r"%s\] Load weight end\. .* mem usage=([\d.]+) GB\." % stage, log).group(1))
        assert abs(usage * 1024 - staged["weights_mib"]) < 32, (stage, usage)
    assert "max_total_num_tokens=%d," % staged["kv_tokens"] in log or abs(
        int(re.search(r"max_total_num_tokens=(\d+),", log).group(1)) - staged["kv_tokens"]) <= 64

    # TP 2 with two stages needs four GPUs: refused before the running server is touched
    before = unit_props(lab)
    r = serve(tmp_path, "tp2pp2", {"pp_size": 2})
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-4000:]
    assert "needs 4 GPUs (tp_size x pp_size x dp_size from base_gpu_id) but NVML sees 2" in " ".join(r.stdout.split())
    assert unit_props(lab)["InvocationID"] == before["InvocationID"] and ask(lab)[:2] == ["200", "200"]


def test_the_role_defaults_serve_again(serving):
    """Leaves CT 129 serving the role's defaults, as the other serve tests expect; the re-run after it restarts nothing
    (the converge's look, with the gate's one dict of options, finds the server ready)."""
    r = play("--tags", "serve", "--skip-tags", "preflight")
    assert recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-4000:]
    assert stored_plan(serving)["per_gpu"]["kv_tokens"] == stored_plan(serving)["per_gpu"]["kv_capacity_tokens"]
    assert ask(serving)[:2] == ["200", "200"]
    again = play("--tags", "serve", "--skip-tags", "preflight")
    assert recap(again.stdout, "ct129")["changed"] == 0 and "unchanged" in again.stdout, again.stdout[-4000:]
