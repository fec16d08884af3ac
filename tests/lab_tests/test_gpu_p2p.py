"""Issue 27 in the lab: two GPUs really talk before a TP launch (roles/sglang_server/tasks/p2p.yml, gpu_p2p_check).

The check runs the SGLang venv's torch (the lab's stand-in, tests/lab/torch_standin) with the server's environment. With
the drill p2p_hang the serve stage ends in gpu_p2p_hang within seconds, with p2p_wrong_sum in gpu_p2p_wrong_result,
both before any launch (same InvocationID, no new launch log, even with sglang_server_force_restart); with
NCCL_P2P_DISABLE=1 in sglang_server_environment both pass (traffic through host memory). Without drills it passes,
and a second run skips it (the pass is stamped). The drills go in the node's drill file, which CT 129 sees.
"""

from __future__ import annotations

import json
import os
import re
import time

from conftest import labctl
from test_gpu_host_stage import play, recap
from test_serve_safety import ct, serving, unit_props  # noqa: F401  pylint: disable=unused-import

STAMP = "/var/lib/kpro-gpu-serving/gpu-p2p.json"
TASK = "TASK [kpro.gpu_serving.sglang_server : Check that the GPUs really talk to each other"


def drill(text):
    """The stand-ins' drill file on the node (CT 129 sees the node's /var/lib/kpro-lab); None removes it."""
    path = os.path.join(labctl("root").stdout.strip(), "var/lib/kpro-lab/sglang-drill")
    if text is None:
        if os.path.exists(path):
            os.unlink(path)
    else:
        with open(path, "w") as f:
            f.write(text + "\n")


def serve(tmp_path, name, extra):
    path = tmp_path / ("%s.json" % name)
    path.write_text(json.dumps(extra))
    t0 = time.time()
    r = play("--tags", "serve", "--skip-tags", "preflight", "-e", "@%s" % path)
    print("%s: %.1fs" % (name, time.time() - t0))
    return r


def check_status(out):
    """ok / changed / failed / fatal / skipping of the check task for ct129 (None when it did not run)."""
    i = out.find(TASK)
    if i < 0:
        return None
    block = out[i:out.find("\nTASK [", i + 1)]
    m = re.search(r"^(ok|changed|failed|fatal|skipping): \[ct129\]", block, re.M)
    return m.group(1) if m else None


def launch_logs(lab):
    return sorted(ct(lab, "ls", "/var/log/sglang").stdout.split())


def stamp(lab):
    r = ct(lab, "cat", STAMP, check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def test_without_drills_it_passes_and_the_rerun_skips_it(serving, tmp_path):
    lab = serving
    drill(None)
    first = serve(tmp_path, "first", {})
    assert recap(first.stdout, "ct129")["failed"] == 0, first.stdout[-4000:]
    assert check_status(first.stdout) in ("ok", "changed"), first.stdout[-4000:]
    st = stamp(lab)
    assert st and len(st["key"]["gpus"]) == 2 and st["key"]["environment"] == {} and st["passed"]["device_count"] == 2
    assert st["passed"]["torch"] == "2.11.0" and [s["first"] for s in st["passed"]["all_reduce"]] == [3.0, 3.0]
    again = serve(tmp_path, "again", {})
    assert recap(again.stdout, "ct129")["failed"] == 0 and check_status(again.stdout) == "ok", again.stdout[-4000:]
    assert "not run" in again.stdout.split(TASK)[1].split("\nTASK [")[0] or stamp(lab) == st


def _fails_before_any_launch(lab, tmp_path, name, text, phase, message):
    ct(lab, "rm", "-f", STAMP)          # as before the first launch
    before, logs = unit_props(lab), launch_logs(lab)
    drill(text)
    try:
        t0 = time.time()
        r = serve(tmp_path, name, {"sglang_server_p2p_timeout": 10, "sglang_server_force_restart": True})
        took = time.time() - t0
    finally:
        drill(None)
    out = r.stdout.replace("\\n", "\n")
    print(TASK + out.split(TASK)[-1][:2500])
    assert recap(r.stdout, "ct129")["failed"] == 1 and check_status(r.stdout) == "fatal", r.stdout[-4000:]
    assert message in out, r.stdout[-4000:]
    assert "phase: %s" % phase in out and "NCCL_P2P_DISABLE" in out and "pcie_acs_override" in out and "iommu=pt" in out
    assert "Converge the SGLang unit" not in r.stdout.split(TASK)[1]      # nothing after the check ran
    after = unit_props(lab)
    assert (after["MainPID"], after["InvocationID"]) == (before["MainPID"], before["InvocationID"])
    assert launch_logs(lab) == logs and stamp(lab) is None
    return took


def test_p2p_hang_is_gpu_p2p_hang_within_seconds_before_any_launch(serving, tmp_path):
    took = _fails_before_any_launch(serving, tmp_path, "hang", "p2p_hang", "gpu_p2p_hang",
                                    "gpu_p2p_hang: the two-GPU check did not finish within 10 s: it hung in the NCCL all-reduce")
    assert took < 120, took


def test_p2p_wrong_sum_is_gpu_p2p_wrong_result_before_any_launch(serving, tmp_path):
    _fails_before_any_launch(serving, tmp_path, "wrong", "p2p_wrong_sum", "gpu_p2p_wrong_result",
                             "gpu_p2p_wrong_result: the two-GPU check got wrong data: copy 0->1 (direct)")


def test_nccl_p2p_disable_cures_both_drills(serving, tmp_path):
    lab = serving
    drill("p2p_hang p2p_wrong_sum")
    try:
        r = serve(tmp_path, "cured", {"sglang_server_environment": {"NCCL_P2P_DISABLE": "1"}, "sglang_server_p2p_timeout": 10})
    finally:
        drill(None)
    assert recap(r.stdout, "ct129")["failed"] == 0 and check_status(r.stdout) == "changed", r.stdout[-4000:]
    st = stamp(lab)
    assert st["key"]["environment"] == {"NCCL_P2P_DISABLE": "1"} and st["passed"]["copy_path"] == "host"
    assert "NCCL_P2P_DISABLE=1" in ct(lab, "systemctl", "cat", "sglang.service").stdout     # the server runs with it
    # back to the inventory's environment: the check runs again for it (another NCCL environment) and passes
    back = serve(tmp_path, "back", {})
    assert recap(back.stdout, "ct129")["failed"] == 0 and check_status(back.stdout) == "changed", back.stdout[-4000:]
    assert stamp(lab)["key"]["environment"] == {}
