"""The model on storage that outlives the container (issue 32): CT 129 destroyed and re-created moves 0 model bytes.

One converge with lxc_gpu_model_volume set (the lxc stage adds the mpN bind mount, makes the host directory, restarts
the container), then `pct destroy 129` (refused while running, with PVE's message) and `pct create 129` from the stock
template, then the converge again: the model stage finds the model on the volume and fetches no file from the hub's
stand-in, and the server passes the gate.
"""

from __future__ import annotations

import json
import os
import time

from test_container_model_stage import hub_log
from test_gpu_host_stage import play, recap

VOLUME = {"host_path": "/var/lib/vz/kpro-models", "mp": "/srv/models"}
TEMPLATE = "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst"
# what the seed's CT 129 has, less the GPUs and the snapshot: a stock container re-created by an operator
CREATE = ["--hostname", "sglang", "--rootfs", "local-zfs:200", "--memory", "131072", "--swap", "8192", "--cores", "32",
          "--features", "nesting=1", "--onboot", "1",
          "--net0", "name=eth0,bridge=vmbr0,firewall=1,gw=10.213.6.1,hwaddr=BC:24:11:7C:12:9A,ip=10.213.6.129/24,type=veth"]


def converge():
    out = play("-e", json.dumps({"lxc_gpu_model_volume": VOLUME}))
    assert recap(out.stdout)["failed"] == 0 and recap(out.stdout, "ct129")["failed"] == 0, out.stdout[-4000:]
    return out.stdout


def test_recreated_container_finds_the_model_on_the_volume(lab):
    t0 = time.time()
    converge()
    root = lab.root
    conf = open(os.path.join(root, "etc/pve/lxc/129.conf")).read()
    assert "\nmp0: /var/lib/vz/kpro-models,mp=/srv/models\n" in conf, conf
    host_dir = os.path.join(root, VOLUME["host_path"].lstrip("/"))
    assert os.stat(host_dir).st_uid == 100000  # the unprivileged CT's root (default idmap)
    assert os.path.isfile(os.path.join(host_dir, "Qwen3.6-27B", "config.json"))

    refused = lab.exec("pct", "destroy", "129", check=False)
    assert refused.returncode == 255 and "unable to destroy CT 129 - container is running" in refused.stderr
    lab.exec("pct", "stop", "129")
    lab.exec("pct", "destroy", "129")
    assert not os.path.exists(os.path.join(root, "etc/pve/lxc/129.conf"))
    assert os.path.isfile(os.path.join(host_dir, "Qwen3.6-27B", "config.json"))  # a bind mount is not the CT's volume
    lab.exec("pct", "create", "129", TEMPLATE, *CREATE)
    lab.exec("pct", "start", "129")
    assert lab.exec("pct", "exec", "129", "--", "ls", "/opt", check=False).stdout.strip() == ""  # a stock CT again

    hub_log(clear=True)
    t1 = time.time()
    out = converge()
    files = [e for e in hub_log() if "/resolve/" in e.get("path", "") or "/_cdn/" in e.get("path", "")]
    assert files == [], files  # only the hub's metadata: no file byte
    assert "complete, nothing fetched" in out, out[-4000:]
    assert "sglang.service ready in" in out, out[-4000:]
    print("model volume: first converge %.0fs, re-created CT converge %.0fs" % (t1 - t0 - 0, time.time() - t1))
