"""Issue 16 in the lab: a change whose server fails the gate is rolled back to the deployment that passed it.

From the converged lab (test_serve_safety's fixture), the serve stage runs with a configuration whose stand-in fails
the gate: the unit's environment sets KPRO_LAB_SGLANG_DRILL (the stand-in reads it before the lab's drill file,
tests/lab/sglang_standin/sglang/srt/_kpro_lab/util.py read_drills), so only that deployment fails and the restored one,
without it, serves. The play fails with the gate's phase and "rolled back to ..., serving again"; the time from the
failure to serving again is printed (docs/user-guide.md "Rollback"). The same configuration again fails fast and leaves the restored
server running; a run of the recorded configuration then passes the gate without a restart.
"""

from __future__ import annotations

import json
import re
import time

from test_gpu_host_stage import play, recap
from test_serve_safety import ask, ct, serving, unit_props  # noqa: F401  pylint: disable=unused-import

RECORD = "/var/lib/kpro-gpu-serving/sglang-deployment.json"
# the stand-in's failure for the new configuration, and the phase the gate gives it
# (wrong_answer_tp: plausible but wrong answers at tp > 1, the known-answer check's wrong_answer)
MODE, PHASE = "wrong_answer_tp", "wrong_answer"
SERVE = ("--tags", "serve", "--skip-tags", "preflight")


def record(lab):
    text = ct(lab, "cat", RECORD, check=False).stdout
    return json.loads(text) if text.strip() else {}


def text(r):
    return r.stdout.replace("\\n", "\n")


def test_a_failed_change_is_rolled_back_and_the_same_change_fails_fast(serving, tmp_path):
    lab = serving
    if not record(lab).get("good"):
        # a converge made before the record existed: one passing run records the deployment
        assert recap(play(*SERVE).stdout, "ct129")["failed"] == 0
    good = record(lab)["good"]
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps({"sglang_server_environment": {"KPRO_LAB_SGLANG_DRILL": MODE}, "sglang_server_gate_timeout": 120}))

    t0 = time.time()
    r = play(*SERVE + ("-e", "@%s" % failing))
    out = text(r)
    print("failing run with rollback: %.1fs" % (time.time() - t0))
    assert recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
    m = re.search(r"%s: .*; rolled back to (SGLang [^\n]*?), serving again \(([0-9.]+) s after the failure\)" % PHASE, out)
    assert m, out[-4000:]
    print("rolled back to %s; serving again %s s after the failure" % (m.group(1), m.group(2)))
    assert "KPRO_LAB_SGLANG_DRILL" not in ct(lab, "systemctl", "cat", "sglang.service").stdout
    answered = ask(lab)
    assert answered[:2] == ["200", "200"] and "Paris" in answered[2], answered
    rec = record(lab)
    assert rec["good"] == good and rec["failed"]["diagnosis"]["phase"] == PHASE
    assert rec["failed"]["changes"] == ['environment.KPRO_LAB_SGLANG_DRILL: null -> "%s"' % MODE]

    # the same failing configuration: fails fast with the recorded diagnosis, the restored server untouched
    before = unit_props(lab)
    t1 = time.time()
    r = play(*SERVE + ("-e", "@%s" % failing))
    out = text(r)
    print("the same failing configuration again: failed in %.1fs" % (time.time() - t1))
    assert recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
    assert "%s: this configuration failed the gate at" % PHASE in out and "which is still serving" in out, out[-4000:]
    assert "sglang_server_rollback_retry=true" in out
    after = unit_props(lab)
    assert (after["MainPID"], after["InvocationID"]) == (before["MainPID"], before["InvocationID"])
    assert ask(lab)[:2] == ["200", "200"]

    # the recorded deployment is what the inventory asks for again: it passes the gate, nothing restarted
    r = play(*SERVE)
    assert recap(r.stdout, "ct129")["failed"] == 0, text(r)[-4000:]
    assert unit_props(lab)["InvocationID"] == before["InvocationID"]
