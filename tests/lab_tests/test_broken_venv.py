"""Issue 30 "A broken venv is repaired", in the lab: with the venv's python removed in CT 129 after a converge, the
container stage used to fail ("virtual environment already exists" from uv) and a forced serve restart with "Error
executing command.". Now the stage names the damage, rebuilds the venv from the lock without touching the running
server (same MainPID), and a forced restart then runs the rebuilt venv.
"""

from __future__ import annotations

from test_gpu_host_stage import play, recap
from test_serve_safety import ask, ct, serving, unit_props  # noqa: F401  pylint: disable=unused-import

VENV = "/opt/sglang/venv"
SERVE = ("--tags", "serve", "--skip-tags", "preflight")


def text(r):
    return r.stdout.replace("\\n", "\n")


def test_a_venv_without_its_python_is_rebuilt_and_the_server_restarts_from_it(serving):
    lab = serving
    before = unit_props(lab)
    assert before["ActiveState"] == "active" and int(before["MainPID"]) > 0, before
    ct(lab, "rm", "-f", VENV + "/bin/python")

    r = play("--tags", "container", "--skip-tags", "preflight")
    out = text(r)
    assert recap(r.stdout, "ct129")["failed"] == 0, out[-4000:]
    assert "Remove the broken venv to rebuild it: %s/bin/python is missing or dangling" % VENV in " ".join(out.split())
    assert "already exists" not in out
    version = ct(lab, VENV + "/bin/python", "-c", "import sglang; print(sglang.__version__)").stdout.strip()
    assert version and ct(lab, "test", "-f", VENV + "/pyvenv.cfg").returncode == 0
    # the container stage never stops the server: same process, still answering
    assert unit_props(lab)["MainPID"] == before["MainPID"]
    assert ask(lab)[:2] == ["200", "200"]

    r = play(*SERVE + ("-e", "sglang_server_force_restart=true"))
    assert recap(r.stdout, "ct129")["failed"] == 0, text(r)[-4000:]
    after = unit_props(lab)
    assert after["ActiveState"] == "active" and after["MainPID"] not in ("0", before["MainPID"]), after
    argv = ct(lab, "cat", "/proc/%s/cmdline" % after["MainPID"]).stdout.split("\0")
    assert VENV + "/bin/python" in argv, argv
    answered = ask(lab)
    assert answered[:2] == ["200", "200"], answered

    # the repaired venv is in order: the next container stage changes nothing in it
    r = play("--tags", "sglang_install", "--skip-tags", "preflight")
    assert recap(r.stdout, "ct129")["failed"] == 0 and "Remove the broken venv" not in text(r), text(r)[-4000:]
