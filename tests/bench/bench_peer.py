# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model copy from a peer against rsync of the same files over the same link, in the two-node lab.

CT 131 on kpro7 gets --files files of --size random bytes (its /srv/bench); CT 129 on kpro5 copies them with
kpro.gpu_serving.hf_model (sources: the peer, ssh root@10.213.5.3 then pct exec 131; a manifest of their sha256 in
place of the hub's listing: no hub is asked), then from a mirror directory in CT 129 itself (the source's fixed cost
without a link); then rsync over ssh pulls the same files on kpro5's node (the network namespace CT 129 shares) from
CT 131's root as kpro7 sees it (/proc/<its init>/root), and scp does the same. Prints bytes, seconds and MB/s per
source and the ratio to rsync. The lab comes up with two nodes for it (labctl.py up --nodes 2) and goes down after,
unless it was up.

    .venv/bin/python tests/tools/lablock.py .venv/bin/python tests/bench/bench_peer.py [--files 4 --size 256MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchlab import BIN, LABCTL, REPO

INV = os.path.join(REPO, "inventories", "lab-two-nodes", "hosts.yml")
RUN = os.path.join(REPO, "tests", "lab", ".run")
SSH = "ssh -i /root/.kpgs-bench/id -o UserKnownHostsFile=/root/.kpgs-bench/known_hosts -o StrictHostKeyChecking=yes " \
      "-o IdentitiesOnly=yes -o BatchMode=yes -o Compression=no"


def lab(*args, data=None):
    r = subprocess.run([os.path.join(BIN, "python"), LABCTL] + list(args), input=data, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, check=False)
    if r.returncode != 0:
        raise SystemExit("labctl %s: %s" % (" ".join(args), (r.stderr or r.stdout).decode()[-2000:]))
    return r.stdout.decode()


def node(name, script, data=None):
    return lab("--node", name, "exec", "--", "sh", "-c", script, data=data)


def ct(name, vmid, script):
    return lab("--node", name, "exec", "--", "pct", "exec", vmid, "--", "sh", "-c", script)


def parse_size(text):
    units = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}
    for u, n in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * n)
    return int(text)


def make_files(n, size):
    """n random files in CT 131's /srv/bench; their manifest (path, size, sha256)."""
    ct("kpro7", "131", "rm -rf /srv/bench && mkdir -p /srv/bench && for i in $(seq 1 %d); do "
       "head -c %d /dev/urandom > /srv/bench/shard-$i.bin; done" % (n, size))
    out = ct("kpro7", "131", "cd /srv/bench && sha256sum shard-*.bin")
    return [{"path": name, "size": size, "sha256": digest} for digest, name in (ln.split() for ln in out.splitlines())]


def hf_copy(tmp, dest, sources, manifest):
    """hf_model in CT 129 (its stock python3: a peer and a manifest need no huggingface_hub); (seconds, result)."""
    play = os.path.join(tmp, "copy.yml")
    with open(play, "w", encoding="utf-8") as f:
        f.write("---\n- name: bench\n  hosts: ct129\n  gather_facts: false\n  tasks:\n"
                "    - name: copy\n      kpro.gpu_serving.hf_model:\n        repo_id: bench/files\n"
                "        revision: \"%s\"\n        local_dir: %s\n        root: /srv\n"
                "        sources: %s\n        manifest: %s\n        ssh_key_file: /root/.kpgs-bench/id.copy\n"
                "        ssh_known_hosts_file: /root/.kpgs-bench/known_hosts\n" % (
                    "0" * 40, dest, json.dumps(sources), json.dumps(manifest)))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    # the module takes its key file over (it reads and removes it): a fresh copy per run
    ct("kpro5", "129", "cp /root/.kpgs-bench/id /root/.kpgs-bench/id.copy && chmod 600 /root/.kpgs-bench/id.copy")
    t = time.time()
    r = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", INV, play, "-v"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, check=False)
    secs = time.time() - t
    if r.returncode != 0:
        sys.stdout.write(r.stdout[-4000:])
        raise SystemExit("the copy failed")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith(("changed: [ct129] => ", "ok: [ct129] => ")))
    return secs, json.loads(line.split(" => ", 1)[1])


def setup_keys():
    """The lab's key and known_hosts in CT 129 and on kpro5's node (where rsync runs)."""
    with open(os.path.join(RUN, "ssh", "id_ed25519"), "rb") as f:
        key = f.read()
    with open(os.path.join(RUN, "ssh", "known_hosts"), "rb") as f:
        known = f.read()
    for write in (lambda s, d: lab("--node", "kpro5", "exec", "--", "pct", "exec", "129", "--", "sh", "-c", s, data=d),
                  lambda s, d: node("kpro5", s, data=d)):
        write("umask 077 && mkdir -p /root/.kpgs-bench && cat > /root/.kpgs-bench/id", key)
        write("cat > /root/.kpgs-bench/known_hosts", known)


def rate(nbytes, secs):
    return nbytes / secs / 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args(argv)
    size = parse_size(args.size)
    was_up = subprocess.run([os.path.join(BIN, "python"), LABCTL, "status"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, check=False).returncode == 0
    lab("up", "--nodes", "2")
    try:
        return measure(args.files, size)
    finally:
        if not (was_up or args.keep):
            lab("down")


def measure(files, size):
    tmp = tempfile.mkdtemp(prefix="kpgs-bench-peer-")
    manifest = make_files(files, size)
    total = files * size
    setup_keys()
    with open(os.path.join(lab("--node", "kpro7", "root").strip(), "var/lib/kpro-lab/state.json")) as f:
        init = str(json.load(f)["guests"]["131"]["pid"])  # CT 131's init on kpro7 (the lab's guest state)
    rows = []
    ct("kpro5", "129", "rm -rf /srv/bench-peer /srv/bench-mirror /srv/bench-src")
    secs, res = hf_copy(tmp, "/srv/bench-peer", [{"type": "peer", "ssh": "root@10.213.5.3", "path": "/srv/bench",
                                                  "vmid": 131}], manifest)
    rows.append(("hf_model, peer (ssh + pct exec 131)", sum(res["bytes_by_source"].values()), res["elapsed_s"]))
    print("hf_model from the peer: %.1f s with ansible-playbook's start, %.1f s the copy itself" % (secs, res["elapsed_s"]))
    ct("kpro5", "129", "mkdir -p /srv/bench-src && cp /srv/bench-peer/shard-*.bin /srv/bench-src/")
    secs, res = hf_copy(tmp, "/srv/bench-mirror", [{"type": "mirror", "path": "/srv/bench-src"}], manifest)
    rows.append(("hf_model, mirror (same disk, no link)", sum(res["bytes_by_source"].values()), res["elapsed_s"]))
    src = "/proc/%s/root/srv/bench/" % init if init.isdigit() else None
    if src:
        node("kpro5", "rm -rf /tmp/kpgs-rsync /tmp/kpgs-scp && mkdir -p /tmp/kpgs-scp")
        t = time.time()
        node("kpro5", "rsync -a --whole-file -e '%s' root@10.213.5.3:%s /tmp/kpgs-rsync/" % (SSH, src))
        rows.append(("rsync -a --whole-file over ssh (kpro5 <- kpro7)", total, time.time() - t))
        t = time.time()
        node("kpro5", "scp -q -i /root/.kpgs-bench/id -o UserKnownHostsFile=/root/.kpgs-bench/known_hosts "
                      "'root@10.213.5.3:%sshard-*.bin' /tmp/kpgs-scp/" % src)
        rows.append(("scp over ssh (kpro5 <- kpro7)", total, time.time() - t))
        node("kpro5", "rm -rf /tmp/kpgs-rsync /tmp/kpgs-scp /root/.kpgs-bench")
    ct("kpro5", "129", "rm -rf /srv/bench-peer /srv/bench-mirror /srv/bench-src /root/.kpgs-bench")
    ct("kpro7", "131", "rm -rf /srv/bench")
    print("%d files x %d bytes (%.0f MB), two-node lab link (veth + bridge), 2 cores" % (files, size, total / 1e6))
    for name, nbytes, secs in rows:
        print("%-50s %12d bytes %7.2f s %8.1f MB/s" % (name, nbytes, secs, rate(nbytes, secs)))
    if src:
        print("peer / rsync rate: %.2f" % (rate(rows[0][1], rows[0][2]) / rate(rows[2][1], rows[2][2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
