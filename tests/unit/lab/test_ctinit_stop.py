"""The container's systemd stand-in stops a stopped (SIGSTOPped) process as systemd does: the stop signal, then SIGCONT
(src/basic/process-util.c kill_and_sigcont()), so a process with its own SIGTERM handler ends at once, not at the SIGKILL
after TimeoutStopSec. A real process, no lab."""

import os
import runpy
import signal
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
HANDLES_TERM = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print('up', flush=True); time.sleep(60)"


# the stand-in's functions (run_path: no import machinery, no bytecode written into the lab's tree)
CT = runpy.run_path(os.path.join(REPO, "tests/lab/rootfs-ct/usr/lib/kpro-lab/ctinit.py"), run_name="kpgs_ctinit_stop")


def _stopped():
    proc = subprocess.Popen([sys.executable, "-c", HANDLES_TERM], stdout=subprocess.PIPE)
    proc.stdout.readline()          # its handler is installed
    proc.send_signal(signal.SIGSTOP)
    return proc


def test_a_stopped_process_gets_the_stop_signal_at_once():
    proc = _stopped()
    try:
        CT["kill_and_sigcont"]([proc.pid], signal.SIGTERM)
        assert proc.wait(timeout=5) == 7           # its own handler ran: SIGTERM, then SIGCONT
    finally:
        proc.kill()
        proc.wait()


def test_without_sigcont_the_stop_signal_waits():
    proc = _stopped()
    try:
        CT["kill"]([proc.pid], signal.SIGTERM)        # what the stand-in did before: the signal stays pending
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(timeout=5) == 7
    finally:
        proc.kill()
        proc.wait()
