"""Issue 28 in the lab: host states the real tools make, which a clean converge never shows.

- A driver loaded but unknown to DKMS: installed by hand without ``--dkms`` (the real 580 installer still puts the
  module sources and a dkms.conf in /usr/src/nvidia-<version>, and its modules in kernel/drivers/video). DKMS 3.0.10
  refuses to install its own build over a module of the same version ("exactly matches what is already found in
  kernel ... DKMS will not replace this module"), so the stage registers the sources with DKMS once, and a kernel
  upgrade afterwards gets its module from DKMS's own hook.
- Secure Boot turned on after the first converge: the next kernel's module is built by DKMS's hook and signed with
  DKMS's own key (framework.conf not yet pointing at the enrolled one), the kernel refuses it after the reboot. The
  stage points DKMS at the enrolled key first and rebuilds the module, instead of stopping at the refused modprobe.

Each test starts from a fresh node (a converge of the gpu_host stage, 1-2 min) and the node is reset afterwards.
"""

from __future__ import annotations

import pytest

from conftest import labctl
from test_gpu_host_stage import play, recap

V = "580.126.09"
NEW = "6.8.12-11-pve"   # published with its headers
RUN = "/var/cache/kpro-gpu-serving/NVIDIA-Linux-x86_64-%s.run" % V   # gpu_host_driver_path of the lab inventory
KEY, CERT = "/root/kpro-mok/MOK.priv", "/root/kpro-mok/MOK.der"
SIGNING = ("-e", "gpu_host_module_signing_key=" + KEY, "-e", "gpu_host_module_signing_cert=" + CERT)


@pytest.fixture(autouse=True, scope="module")
def fresh_node_afterwards():
    """These tests install the driver, a kernel and Secure Boot; the lab tests after them expect a node as booted."""
    yield
    labctl("reset")


@pytest.fixture()
def converged(lab):
    labctl("reset")
    first = play("--tags", "gpu_host")
    assert recap(first.stdout)["failed"] == 0, first.stdout[-3000:]
    return lab


def upgrade(lab, release):
    """A kernel upgrade through the node's apt, as an operator's: the kernel's postinst runs DKMS's hook."""
    assert lab.labctl("publish-kernel", release).returncode == 0
    r = lab.sh("DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && "
               "DEBIAN_FRONTEND=noninteractive apt-get full-upgrade -y -q 2>&1", check=False)
    assert r.returncode == 0, r.stdout[-3000:]
    return r.stdout


def dkms_status(lab):
    return lab.exec("dkms", "status", "-m", "nvidia").stdout


def loaded(lab):
    return "nvidia " in lab.exec("lsmod").stdout


def installed_without_dkms(lab):
    """The driver as an operator installed it by hand: the converged driver uninstalled (persistenced stopped first,
    it holds the GPUs) and the same installer run again with --no-dkms; the module is loaded, DKMS knows nothing."""
    r = lab.sh("systemctl stop nvidia-persistenced.service && nvidia-uninstall --silent && "
               "sh %s --silent --no-x-check --kernel-module-type=open --no-dkms --disable-nouveau --no-rebuild-initramfs "
               "&& systemctl start nvidia-persistenced.service" % RUN, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert loaded(lab) and "nvidia/%s" % V not in dkms_status(lab)
    kernel = lab.exec("uname", "-r").stdout.strip()
    assert "/kernel/drivers/video/" in lab.exec("modinfo", "-F", "filename", "nvidia").stdout
    assert lab.exec("test", "-f", "/usr/src/nvidia-%s/dkms.conf" % V, check=False).returncode == 0
    # DKMS's own answer to a build for that kernel: its check_version_sanity refuses to replace the same version
    refused = lab.exec("dkms", "install", "-m", "nvidia", "-v", V, "-k", kernel, check=False)
    assert refused.returncode != 0 and "DKMS will not replace this module" in refused.stderr, refused.stdout + refused.stderr
    return kernel


def test_driver_loaded_but_unknown_to_dkms_is_registered_once_and_a_new_kernel_gets_its_module(converged):
    lab = converged
    kernel = installed_without_dkms(lab)
    run = play("--tags", "gpu_host")
    assert recap(run.stdout)["failed"] == 0, run.stdout[-3000:]
    assert "register_dkms:" in run.stdout, run.stdout[-3000:]
    assert "nvidia/%s, %s, x86_64: installed" % (V, kernel) in dkms_status(lab)
    assert loaded(lab)
    again = play("--tags", "gpu_host")
    assert recap(again.stdout)["changed"] == 0 and recap(again.stdout)["failed"] == 0, again.stdout[-3000:]
    # the kernel upgrade: DKMS's hook builds the module for the new kernel, which boots with it
    out = upgrade(lab, NEW)
    assert "nvidia/%s, %s, x86_64: installed" % (V, NEW) in dkms_status(lab), out[-3000:]
    assert lab.exec("modinfo", "-k", NEW, "-F", "version", "nvidia").stdout.strip() == V
    r = lab.labctl("reboot")
    assert r.returncode == 0 and NEW in r.stdout, r.stdout + r.stderr
    assert loaded(lab), lab.exec("cat", "/var/log/kpro-lab/journal.log", check=False).stdout[-3000:]
    assert lab.exec("nvidia-smi", "-L").stdout.count("GPU ") == 2


def test_secure_boot_module_signed_by_dkms_own_key_is_rebuilt_with_the_enrolled_one(converged):
    lab = converged
    lab.sh("mkdir -p /root/kpro-mok && cd /root/kpro-mok && openssl req -new -x509 -newkey rsa:2048 -nodes -days 3650 "
           "-subj '/CN=kpro lab MOK' -keyout MOK.priv -outform DER -out MOK.der 2>/dev/null")
    assert lab.labctl("mok-enroll", CERT).returncode == 0
    assert lab.labctl("secure-boot", "on").returncode == 0
    # the next kernel comes before the stage ran with the key: DKMS's hook signs with its own, generated key
    upgrade(lab, NEW)
    assert lab.exec("modinfo", "-k", NEW, "-F", "signer", "nvidia").stdout.strip() == "DKMS module signing key"
    r = lab.labctl("reboot")
    assert r.returncode == 0 and NEW in r.stdout, r.stdout + r.stderr
    assert not loaded(lab)
    refused = lab.exec("modprobe", "nvidia", check=False)
    assert "Key was rejected by service" in refused.stderr, refused.stdout + refused.stderr
    # the stage with the enrolled key: DKMS pointed at it before any build, the refused module rebuilt and loaded
    run = play("--tags", "gpu_host", *SIGNING)
    assert recap(run.stdout)["failed"] == 0, run.stdout[-3000:]
    assert "mok_signing_key=%s" % KEY in lab.exec("cat", "/etc/dkms/framework.conf").stdout
    assert lab.exec("modinfo", "-k", NEW, "-F", "signer", "nvidia").stdout.strip() == "kpro lab MOK"
    assert loaded(lab) and lab.exec("nvidia-smi", "-L").stdout.count("GPU ") == 2
    again = play("--tags", "gpu_host", *SIGNING)
    assert recap(again.stdout)["changed"] == 0 and recap(again.stdout)["failed"] == 0, again.stdout[-3000:]
