"""Issue 14 in the lab: a reboot of a converged host brings the server back by itself, without a playbook run.

``labctl.py reboot`` is a shutdown (CT 129 and the services stopped), the boot loader's kernel, a fresh /dev,
systemd's units (the collection's nvidia-device-nodes.service remakes /dev/nvidia*, ordered before
pve-guests.service) and PVE's start of the onboot guests (startall). The converged node comes from the
serving fixture (test_serve_safety.py: it converges once unless CT 129 already serves). Both tests run on the
session's release ($KPGS_LAB_RELEASE, default pve8; `make lab-test-pve9` runs them on a PVE 9 node).
"""

from __future__ import annotations

import os
import time

from test_gpu_host_stage import play, recap
from test_serve_safety import ask, serving  # noqa: F401  pylint: disable=unused-import


# What the real dkms package's kernel hook says when the new kernel has no headers (/etc/kernel/postinst.d/dkms ->
# dkms_autoinstaller): bookworm's 3.0.10-8+deb12u1 and trixie's 3.2.2-1~deb13u1 (dkms v3.2.2 dkms_autoinstaller.in:33).
HOOK_SKIPPED = {
    "pve8": "autoinstall for kernel %s was skipped since the kernel headers",
    "pve9": "Automatic installation of modules for kernel %s was skipped since the kernel headers for this kernel do "
            "not seem to be installed.",
}


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


def test_kernel_upgrade_without_headers_strands_the_gpus_at_the_next_boot(serving):
    """The failure issue 14 is about, as the lab now shows it: apt full-upgrade brings a kernel whose headers are not
    there, dkms's hook skips it, and at the next boot the device-node unit fails and PVE refuses CT 129."""
    lab = serving
    import labstate
    old = lab.state()["kernel"]["release"]
    new = labstate.next_release(old)
    lab.labctl("publish-kernel", new, "--no-headers")
    up = lab.sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get full-upgrade -y -q 2>&1")
    assert "Setting up proxmox-kernel-%s" % new in up.stdout, up.stdout[-3000:]
    assert HOOK_SKIPPED[lab.release] % new in up.stdout, up.stdout[-3000:]
    assert lab.exec("proxmox-boot-tool", "kernel", "list").stdout.rstrip().endswith(new)
    try:
        assert "kpro5 rebooted into %s" % new in lab.labctl("reboot").stdout
        r = lab.exec("modprobe", "nvidia", check=False)
        assert r.stderr.strip() == "modprobe: FATAL: Module nvidia not found in directory /lib/modules/%s" % new
        assert "stopped" in lab.exec("pct", "status", "129").stdout
        journal = open(os.path.join(lab.root, "var/log/kpro-lab/journal.log")).read().rsplit("-- Boot", 1)[-1]
        assert "Failed to start Create NVIDIA device nodes for LXC guests." in journal, journal[-3000:]
        assert "Starting CT 129 failed: Device /dev/nvidia" in journal and "does not exist" in journal, journal[-3000:]
    finally:
        # the operator's way back: the previous kernel for one boot, then the unusable kernel removed
        lab.exec("proxmox-boot-tool", "kernel", "pin", old, "--next-boot")
        assert "kpro5 rebooted into %s" % old in lab.labctl("reboot").stdout
        # the kernel meta packages depend on the newest kernel, so removing it removes them too: apt refuses that for the
        # one the gpu_host stage holds ("Held packages were changed"), so the hold comes off first (docs/verify.md)
        lab.sh("apt-mark unhold proxmox-default-kernel >/dev/null 2>&1; "
               "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q proxmox-kernel-%s" % new)
        # and the lab's repository as it was: the meta packages (removed with it) point at the old kernel again
        lab.labctl("unpublish-kernel", new)
        lab.sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q proxmox-default-kernel")
    assert new not in lab.state()["kernel"]["installed"]
    series = "proxmox-kernel-" + ".".join(old.split(".")[:2])
    assert lab.exec("dpkg-query", "-W", "-f", "${Version}", series).stdout == old.rsplit("-", 1)[0]
    answered, _waited = wait_answering(lab)
    assert answered[:2] == ["200", "200"], answered
