"""Issue 14 in the lab: a kernel upgrade and a reboot never strand the GPUs.

On the converged lab (the serve tests' approach: converge once unless CT 129 already serves), in one sequence, as an
operator would: upgrade the kernel through the node's apt (headers available), the pre-reboot check names the new
kernel, a reboot brings CT 129 and the server back without a playbook run; the same upgrade without headers: the check
fails naming the kernel and the package, and a gpu_host run says what it cannot do; Secure Boot: with DKMS left to sign
with its own key the check names that key, the gpu_host stage points DKMS at the enrolled key and rebuilds, the module
carries the enrolled key's signature and loads at the next boot. The lab is left serving, Secure Boot off.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from conftest import REPO
from test_gpu_host_stage import ANSIBLE_PLAYBOOK, play, recap
from test_serve_safety import ask, serving_now

V = "580.126.09"
# published with its headers / without headers first: the next releases after the node's (PVE 8: 6.8.12-9-pve; on a
# PVE 9 node, KPGS_LAB_RELEASE=pve9, 6.17.13-2-pve; this file runs on PVE 8 in make test)
NEXT_KERNELS = {"pve8": ("6.8.12-11-pve", "6.8.12-12-pve"), "pve9": ("6.17.13-3-pve", "6.17.13-4-pve")}
NEW, BARE = NEXT_KERNELS[os.environ.get("KPGS_LAB_RELEASE") or "pve8"]
CHECK = os.path.join(REPO, "playbooks", "pre-reboot-check.yml")
KEY, CERT = "/root/kpro-mok/MOK.priv", "/root/kpro-mok/MOK.der"


def check(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", os.path.join(REPO, "inventories", "lab"), CHECK] + list(extra),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False, cwd=REPO)


def upgrade(lab, release, headers=True):
    r = lab.labctl("publish-kernel", release, *([] if headers else ["--no-headers"]))
    assert r.returncode == 0, r.stderr
    r = lab.sh("DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && "
               "DEBIAN_FRONTEND=noninteractive apt-get full-upgrade -y -q 2>&1", check=False)
    assert r.returncode == 0, r.stdout[-3000:]
    return r.stdout


def back_by_itself(lab, timeout=90):
    """After a reboot, no playbook run: CT 129 sees its GPUs and the server answers."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if serving_now(lab):
            break
        time.sleep(3)
    got = ask(lab)
    assert got[:2] == ["200", "200"], got
    gpus = lab.exec("pct", "exec", "129", "--", "nvidia-smi", "-L", check=False).stdout
    assert gpus.count("GPU ") == 2, gpus


@pytest.fixture(scope="module")
def serving(lab):
    if not serving_now(lab):
        out = play()
        assert recap(out.stdout, "ct129")["failed"] == 0, out.stdout[-4000:]
    yield lab
    lab.labctl("secure-boot", "off", check=False)


def test_kernel_upgrade_check_reboot_back_by_itself(serving):
    lab = serving
    out = upgrade(lab, NEW)
    assert NEW in lab.exec("proxmox-boot-tool", "kernel", "list").stdout
    ok = check()
    assert recap(ok.stdout)["failed"] == 0, ok.stdout[-3000:]
    assert "ready to reboot into %s" % NEW in ok.stdout
    r = lab.labctl("reboot")
    assert r.returncode == 0 and NEW in r.stdout, r.stdout + r.stderr
    assert lab.exec("cat", "/proc/sys/kernel/osrelease").stdout.strip() == NEW
    back_by_itself(lab)
    assert out  # the upgrade's output (dkms's hook) is kept for the failure message above


def test_kernel_without_headers_check_fails_and_the_stage_says_why(serving):
    lab = serving
    upgrade(lab, BARE, headers=False)
    bad = check()
    assert recap(bad.stdout)["failed"] == 1, bad.stdout[-3000:]
    assert "next_boot_module_missing" in bad.stdout and "not ready to reboot into %s" % BARE in bad.stdout
    build = "dkms install -m nvidia -v %s -k %s" % (V, BARE)
    assert "apt-get install proxmox-headers-%s && %s" % (BARE, build) in bad.stdout, bad.stdout[-3000:]
    run = play("--tags", "gpu_host")
    assert recap(run.stdout)["failed"] == 1, run.stdout[-3000:]
    assert "boot_kernel_headers_missing" in run.stdout and "proxmox-headers-%s" % BARE in run.stdout, run.stdout[-3000:]
    # the check's remedy, both halves: the headers arrive, which alone builds nothing (Proxmox's headers postinst runs
    # no dkms hook: tests/lab/aptrepo.py), then the build; the check passes again
    assert lab.labctl("publish-kernel", BARE).returncode == 0
    lab.sh("apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q proxmox-headers-%s" % BARE)
    assert lab.exec("modinfo", "-k", BARE, "-F", "filename", "nvidia", check=False).returncode != 0
    lab.sh(build)
    ok = check()
    assert recap(ok.stdout)["failed"] == 0 and "ready to reboot into %s" % BARE in ok.stdout, ok.stdout[-3000:]


def test_secure_boot_enrolled_key_signs_every_rebuild(serving):
    lab = serving
    lab.sh("mkdir -p /root/kpro-mok && cd /root/kpro-mok && [ -f MOK.der ] || openssl req -new -x509 -newkey rsa:2048 "
           "-nodes -days 3650 -subj '/CN=kpro lab MOK' -keyout MOK.priv -outform DER -out MOK.der 2>/dev/null")
    assert lab.labctl("mok-enroll", CERT).returncode == 0
    assert lab.labctl("secure-boot", "on").returncode == 0
    # DKMS signs with its own key (framework.conf untouched): the check names that key
    bad = check("-e", "gpu_host_module_signing_cert=" + CERT)
    assert recap(bad.stdout)["failed"] == 1, bad.stdout[-3000:]
    assert "module_wrong_key" in bad.stdout and "/var/lib/dkms/mok.key" in bad.stdout, bad.stdout[-3000:]
    # the collection's rebuild: DKMS pointed at the enrolled key, each bootable kernel's module signed with it
    run = play("--tags", "gpu_host", "-e", "gpu_host_module_signing_key=" + KEY, "-e", "gpu_host_module_signing_cert=" + CERT)
    assert recap(run.stdout)["failed"] == 0, run.stdout[-3000:]
    assert "mok_signing_key=%s" % KEY in lab.exec("cat", "/etc/dkms/framework.conf").stdout
    signer = lab.exec("modinfo", "-k", BARE, "-F", "signer", "nvidia").stdout.strip()
    assert signer == "kpro lab MOK"
    ok = check("-e", "gpu_host_module_signing_cert=" + CERT)
    assert "ready to reboot into %s" % BARE in ok.stdout, ok.stdout[-3000:]
    assert lab.labctl("reboot").returncode == 0
    back_by_itself(lab)
