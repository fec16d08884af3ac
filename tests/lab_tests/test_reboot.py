"""Issue 14 in the lab: a reboot of a converged host brings the server back by itself, without a playbook run.

``labctl.py reboot`` is a shutdown (CT 129 and the services stopped), the boot loader's kernel, a fresh /dev,
systemd's units (the collection's nvidia-device-nodes.service remakes /dev/nvidia*, ordered before
pve-guests.service) and PVE's start of the onboot guests (startall). The converged node comes from the
serving fixture (test_serve_safety.py: it converges once unless CT 129 already serves).
"""

from __future__ import annotations

import os
import time

from test_gpu_host_stage import play, recap
from test_serve_safety import ask, serving  # noqa: F401  pylint: disable=unused-import


def wait_answering(lab, timeout=120):
    t0, answered = time.time(), None
    while time.time() - t0 < timeout:
        answered = ask(lab)
        if answered[:2] == ["200", "200"]:
            return answered, time.time() - t0
        time.sleep(2)
    return answered, time.time() - t0


def test_reboot_of_a_converged_host_brings_the_server_back_without_a_playbook_run(serving):
    lab = serving
    release = lab.state()["kernel"]["release"]
    boots = lab.state()["kernel"]["boots"]
    t0 = time.time()
    out = lab.labctl("reboot").stdout
    assert "kpro5 rebooted into %s" % release in out, out
    st = lab.state()
    assert st["kernel"]["boots"] == boots + 1
    assert lab.exec("uname", "-r").stdout.strip() == release
    # the device-node unit ran before PVE started the guests, on the fresh /dev
    journal = open(os.path.join(lab.root, "var/log/kpro-lab/journal.log")).read().split("-- Boot %d --" % st["kernel"]["boots"])[-1]
    assert "Finished Create NVIDIA device nodes for LXC guests." in journal, journal[-3000:]
    assert journal.index("Create NVIDIA device nodes") < journal.index("Starting PVE guests"), journal[-3000:]
    assert "Starting CT 129" in journal and "Starting CT 129 failed" not in journal, journal[-3000:]
    assert os.path.exists(os.path.join(lab.root, "dev/nvidia0")) and os.path.exists(os.path.join(lab.root, "dev/nvidia-uvm"))
    assert "running" in lab.exec("pct", "status", "129").stdout
    answered, waited = wait_answering(lab)
    print("reboot %.0fs, answering %.0fs after it: %s" % (time.time() - t0 - waited, waited, answered))
    assert answered[:2] == ["200", "200"] and "Paris" in answered[2], answered
    # the collection's gate, read-only (check mode): the server passes it again
    r = play("--check", "--tags", "serve")
    assert recap(r.stdout)["failed"] == 0 and recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-4000:]
    print("check-mode gate after the reboot: %.0fs in all" % (time.time() - t0))
