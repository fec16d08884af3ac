# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""proxmox_api against a PVE API, in a child interpreter that sees one proxmoxer: Debian 12's 1.2.0 or 2.x.

``python [-S] proxmox_api_scenarios.py '<json>'`` with ``{"paths": [...], "scenario": name, "params": {...},
"vmid": N}``; prints one JSON line: what the scenario observed (messages, task exit statuses, states), plus the
proxmoxer and Python that ran it. Standard library only: the Debian 12 stack has no pytest.
test_proxmox_api_compat.py runs these and asserts on the observations.
"""

import json
import sys
import time


def _err(fn, *args, **kwargs):
    """The message of the ProxmoxApiError that ``fn`` raises (the scenario expects one), else a marker."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # the type is part of what the test checks
        return "%s: %s" % (type(e).__name__, e)
    return "no error"


def power(pa, spec):
    """status -> start (task wait) -> restart (shutdown + start) -> a start that PVE refuses; the config."""
    s = pa.connect(spec["params"])
    vmid = spec["vmid"]
    node = pa.find_node(s, vmid)
    seen = {"node": node, "authuser": s.authuser, "before": pa.ct_status(s, node, vmid)["status"]}
    seen["start"] = pa.ct_start(s, node, vmid, task_timeout=60)["exitstatus"]
    seen["after_start"] = pa.ct_status(s, node, vmid)["status"]
    seen["restart"] = [t["exitstatus"] for t in pa.ct_restart(s, node, vmid, task_timeout=60, shutdown_timeout=10)]
    seen["after_restart"] = pa.ct_status(s, node, vmid)["status"]
    seen["start_again"] = _err(pa.ct_start, s, node, vmid, task_timeout=60)
    seen["digest_len"] = len(pa.ct_config(s, node, vmid).get("digest") or "")
    seen["stop"] = pa.ct_stop(s, node, vmid, task_timeout=60)["exitstatus"]
    return seen


def start_fails(pa, spec):
    """A start task that ends in an error: the task's exit status and log reach the message."""
    s = pa.connect(spec["params"])
    return {"error": _err(pa.ct_start, s, spec.get("node") or "kpro5", spec["vmid"], task_timeout=60)}


def devn(pa, spec):
    """devN through the API as root@pam; PVE's per-parameter error for a bad value."""
    s = pa.connect(spec["params"])
    node, vmid = spec.get("node") or "kpro5", spec["vmid"]
    pa.set_devn(s, node, vmid, {"dev0": "/dev/nvidia0,mode=0666"})
    seen = {"dev0": pa.ct_config(s, node, vmid).get("dev0")}
    seen["bad"] = _err(pa.set_devn, s, node, vmid, {"dev1": "/tmp/not-a-device"})
    seen["token_refused"] = _err(pa.set_devn, pa.Session(s.api, "https", "root@pam", token_id="x"), node, vmid,
                                 {"dev1": "/dev/nvidiactl"})
    return seen


def connect_error(pa, spec):
    """connect + one read that must fail: the message and how long it took."""
    t0 = time.monotonic()
    seen = {"error": _err(lambda: pa.ct_status(pa.connect(spec["params"]), spec.get("node") or "kpro5", spec["vmid"]))}
    seen["seconds"] = round(time.monotonic() - t0, 1)
    return seen


def problem(pa, spec):
    """What the module would say before connecting (missing or unusable proxmoxer)."""
    return {"problem": pa.proxmoxer_problem(spec["params"].get("api_backend") or "https",
                                            token=bool(spec["params"].get("api_token_id"))),
            "connect": _err(pa.connect, spec["params"])}


SCENARIOS = {"power": power, "start_fails": start_fails, "devn": devn, "connect_error": connect_error,
             "problem": problem}


def main():
    spec = json.loads(sys.argv[1])
    sys.path[:0] = spec["paths"]
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import proxmox_api as pa
    try:
        import proxmoxer
        version = getattr(proxmoxer, "__version__", "?")
    except ImportError:
        version = None
    out = {"proxmoxer": version, "python": "%d.%d" % sys.version_info[:2]}
    out.update(SCENARIOS[spec["scenario"]](pa, spec))
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
