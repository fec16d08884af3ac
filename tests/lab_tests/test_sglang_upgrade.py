"""Issue 35 in the lab: an upgrade from SGLang 0.5.11 to the newest release of the table (0.5.23), and its rollback drill.

From the converged lab at 0.5.11 (test_serve_safety's fixture), two playbook runs:
1. the drill: the lab's drill file says ``wrong_answer_tp:0.5.23``, so only a server installed as 0.5.23 answers wrong
   (tests/lab/sglang_standin/sglang/srt/_kpro_lab/generate.py live_modes). The run with sglang_install_version=0.5.23
   (the lab inventory's lock for it, .run/locks/sglang-0.5.23-py3.11-x86_64.txt) fails the known-answer check and
   rolls back to 0.5.11 from the venv sglang_install kept; the time from the failure to serving again is printed and
   bounded.
2. the drill file emptied, the same upgrade again (sglang_server_rollback_retry: the recorded failure would fail it
   fast): it converges, passes the gate and the known-answer check, and the deployment record names 0.5.23.
3. the downgrade back to the inventory's 0.5.11 (a planned one, not a rollback): it converges, passes the gate, and
   the record names 0.5.11 again, so the tests after this file find the lab as the inventory has it.
"""

from __future__ import annotations

import re
import time

from test_container_model_stage import VENV_PY
from test_gpu_host_stage import play, recap
from test_gpu_p2p import drill
from test_rollback import SERVE, record, text
from test_serve_safety import ask, ct, serving  # noqa: F401  pylint: disable=unused-import

NEW, OLD = "0.5.23", "0.5.11"
# the rollback restarts the kept 0.5.11 and gates it: seconds in the lab (test_rollback prints about 10 s)
ROLLBACK_BOUND_S = 60


def running_version(lab):
    """The SGLang version of the venv the unit runs (the python its ExecStart names)."""
    unit = ct(lab, "systemctl", "cat", "sglang.service").stdout
    py = re.search(r"(/[^\s'\"]+/bin/python[0-9.]*)", unit).group(1)   # ExecStart runs the launcher with it
    return ct(lab, py, "-c", "import sglang; print(sglang.__version__)").stdout.strip()


def test_upgrade_to_the_newest_and_a_wrong_new_version_rolls_back(serving):
    lab = serving
    assert running_version(lab) == OLD
    if not record(lab).get("good"):
        assert recap(play(*SERVE).stdout, "ct129")["failed"] == 0
    assert record(lab)["good"]["sglang_version"] == OLD
    upgrade = ("--tags", "container,serve", "--skip-tags", "preflight", "-e", "sglang_install_version=%s" % NEW)

    drill("wrong_answer_tp:%s" % NEW)
    try:
        t0 = time.time()
        r = play(*upgrade)
        out = text(r)
        print("upgrade to %s that answers wrong, with its rollback: %.1fs" % (NEW, time.time() - t0))
    finally:
        drill(None)
    assert recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
    m = re.search(r"wrong_answer: .*; rolled back to (SGLang [^\n]*?), serving again \(([0-9.]+) s after the failure\)", out)
    assert m, out[-4000:]
    print("rolled back to %s; serving again %s s after the failure" % (m.group(1), m.group(2)))
    assert OLD in m.group(1) and float(m.group(2)) < ROLLBACK_BOUND_S
    assert running_version(lab) == OLD and "/venvs/" in ct(lab, "systemctl", "cat", "sglang.service").stdout
    answered = ask(lab)
    assert answered[:2] == ["200", "200"] and "Paris" in answered[2], answered
    rec = record(lab)
    assert rec["good"]["sglang_version"] == OLD and rec["failed"]["diagnosis"]["phase"] == "wrong_answer"

    t1 = time.time()
    r = play(*upgrade + ("-e", "sglang_server_rollback_retry=true"))
    print("upgrade to %s: %.1fs" % (NEW, time.time() - t1))
    assert recap(r.stdout, "ct129")["failed"] == 0, text(r)[-4000:]
    assert running_version(lab) == NEW
    assert ct(lab, VENV_PY, "-c", "import sglang; print(sglang.__version__)").stdout.strip() == NEW
    assert ask(lab)[:2] == ["200", "200"]
    assert record(lab)["good"]["sglang_version"] == NEW

    t2 = time.time()
    r = play("--tags", "container,serve", "--skip-tags", "preflight")
    print("downgrade to %s: %.1fs" % (OLD, time.time() - t2))
    assert recap(r.stdout, "ct129")["failed"] == 0, text(r)[-4000:]
    assert running_version(lab) == OLD and ask(lab)[:2] == ["200", "200"]
    assert record(lab)["good"]["sglang_version"] == OLD
