"""Bad host-side inputs (docs/bad-inputs/host.md): each row fails with its message and the node's disk is
byte-identical afterwards; then the checks that need a converged node (credentials before a write, a device
node that drifted, a lock on a run with nothing to change)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from conftest import RUN, labctl
from test_gpu_host_stage import disk_digest, play, recap


@pytest.fixture(autouse=True, scope="module")
def fresh_node_afterwards():
    """These tests install the driver; the lab tests after them expect a node as booted."""
    yield
    labctl("reset")


def secrets():
    with open(os.path.join(RUN, "pve-credentials.json")) as f:
        creds = json.load(f)
    return [v for k, v in creds.items() if "secret" in k or "password" in k]


def refused(row, tags, *extra, skip_preflight=True):
    """Run the playbook with a bad input: it fails, names the cause, shows no secret and changes nothing."""
    before = disk_digest()
    args = ["--tags", tags] + (["--skip-tags", "preflight"] if skip_preflight else []) + list(extra)
    r = play(*args)
    assert recap(r.stdout)["failed"] == 1, r.stdout[-3000:]
    flat = " ".join(r.stdout.split())  # the yaml callback folds long messages
    for needle in row:
        assert " ".join(needle.split()) in flat, (needle, r.stdout[-3000:])
    for s in secrets() + ["wrong-secret-0123"]:
        assert s not in r.stdout
    assert disk_digest() == before
    return r


BUILD = os.path.join(RUN, "build")


def test_bad_driver_inputs_are_refused_before_any_host_change(lab):
    labctl("reset")
    # the role's first task: nothing at all has run
    refused(["bad_version", "[../x] is not an NVIDIA driver version", "Nothing was changed"], "gpu_host", "-e", "gpu_host_driver_version=../x")
    refused(["bad_version", "[580.126.9] is not an NVIDIA driver version"], "gpu_host",
            "-e", "gpu_host_driver_version=580.126.9")
    # a wrong checksum: the packages go in first (packages.yml), then the installer check fails before release.yml
    state_before = lab.state()
    boot_files = {k: v for k, v in disk_digest().items() if k.startswith(("etc/default/grub", "etc/kernel/", "etc/modprobe.d/",
                                                                          "etc/modules", "etc/pve/"))}
    r = play("--tags", "gpu_host", "--skip-tags", "preflight", "-e", "gpu_host_driver_checksum=sha256:" + "0" * 64)
    assert recap(r.stdout)["failed"] == 1 and "checksum_mismatch" in r.stdout and "0" * 64 in r.stdout, r.stdout[-3000:]
    after = lab.state()
    for key in ("pci", "boot", "nvidia"):  # no unbind, no boot file, no driver (apt adds headers)
        assert after.get(key) == state_before.get(key), key
    # the boot configuration is as it was (the dkms package adds its own hooks under etc/kernel, etc/modprobe.d)
    assert {k: v for k, v in disk_digest().items() if k in boot_files} == boot_files
    # from here every row leaves the disk byte-identical
    refused(["installer_version", "is the installer of driver 580.126.09, not of the requested 580.126"], "gpu_host",
            "-e", "gpu_host_driver_version=580.126")
    refused(["checksum_mismatch", "expected " + "1" * 64], "gpu_host", "-e", "gpu_host_driver_checksum=" + "1" * 64)
    refused(["bad_checksum", "is not a sha256"], "gpu_host", "-e", "gpu_host_driver_checksum=md5:0123")
    refused(["installer_missing", "/var/cache/kpro-gpu-serving/gone.run does not exist"], "gpu_host",
            "-e", "gpu_host_driver_src=", "-e", "gpu_host_driver_path=/var/cache/kpro-gpu-serving/gone.run")
    refused(["installer_checksum is required to download http://10.213.5.1:18600/x.run"], "gpu_host",
            "-e", "gpu_host_driver_version=580.159", "-e", "gpu_host_driver_src=", "-e", "gpu_host_driver_path=",
            "-e", "gpu_host_driver_checksum=", "-e", "gpu_host_driver_url=http://10.213.5.1:18600/x.run")
    refused(["gpu_host_kernel_module_type", "open, proprietary"], "gpu_host", "-e", "gpu_host_kernel_module_type=closed")


def test_bad_api_and_container_inputs(lab):
    r = play("--tags", "gpu_host,lxc_gpu", "--skip-tags", "preflight")
    assert recap(r.stdout)["failed"] == 0, r.stdout[-3000:]
    conf = os.path.join(lab.root, "etc/pve/lxc/129.conf")
    # the preflight names the cause (HTTP 401, the CA), never the secret
    refused(["HTTP 401", "The token ID or its secret is wrong", "pveum user token list root@pam"], "lxc_gpu",
            "-e", "pve_api_token_secret=wrong-secret-0123", skip_preflight=False)
    refused(["pve_api_ca_path /nonexistent/ca.pem does not exist on the controller"], "lxc_gpu",
            "-e", "pve_api_ca_path=/nonexistent/ca.pem", skip_preflight=False)
    # without the preflight: a change is needed (dev_mode) but the credentials fail first, nothing is written
    with open(conf) as f:
        before = f.read()
    refused(["401", "nothing was written"], "lxc_gpu", "-e", "pve_api_token_secret=wrong-secret-0123",
            "-e", "lxc_gpu_dev_mode=0660")
    with open(conf) as f:
        assert f.read() == before
    refused(["CT 999 does not exist here"], "lxc_gpu", "-e", "lxc_gpu_vmid=999")
    refused(["lxc_gpu_method", "devN, lxc_raw"], "lxc_gpu", "-e", "lxc_gpu_method=raw")
    refused(["is not an octal mode like 0666"], "lxc_gpu", "-e", "lxc_gpu_dev_mode=666")
    refused(["lxc_gpu_vmid", "int"], "lxc_gpu", "-e", "lxc_gpu_vmid=12x")
    refused(["gpus must be GPU indices"], "lxc_gpu", "-e", '{"lxc_gpu_gpus": ["zero"]}')


def ct_uvm_major(lab):
    pid = lab.state()["guests"]["129"]["pid"]
    return os.major(os.stat(os.path.join(lab.root, "proc", str(pid), "root", "dev", "nvidia-uvm")).st_rdev)


def test_drifted_uvm_node_restarts_the_container_and_a_lock_is_reported(lab):
    """Needs the converged node of the test before: uvm-reload, then a re-run restarts CT 129 once."""
    host = lab.state()["majors"]["nvidia-uvm"]
    assert ct_uvm_major(lab) == host
    labctl("uvm-reload")
    new = lab.state()["majors"]["nvidia-uvm"]
    assert new != host and ct_uvm_major(lab) == host
    r = play("--tags", "lxc_gpu", "--skip-tags", "preflight")
    assert recap(r.stdout)["changed"] >= 1 and "differ from the host's" in r.stdout, r.stdout[-3000:]
    assert ct_uvm_major(lab) == new
    r = play("--tags", "lxc_gpu", "--skip-tags", "preflight")
    assert recap(r.stdout)["changed"] == 0, r.stdout[-3000:]
    # a backup holds the CT: a run with nothing to change reports it and succeeds
    conf = os.path.join(lab.root, "etc/pve/lxc/129.conf")
    with open(conf) as f:
        text = f.read()
    with open(conf, "w") as f:
        f.write(re.sub(r"^(arch: .*\n)", r"\1lock: backup\n", text, count=1, flags=re.M))
    r = play("--tags", "lxc_gpu", "--skip-tags", "preflight")
    assert recap(r.stdout) == dict(recap(r.stdout), failed=0, changed=0), r.stdout[-3000:]
    assert "locked (lock: backup) but nothing needs to change" in r.stdout
    with open(conf, "w") as f:
        f.write(text)


def test_preflight_refusals_name_the_cause(lab, tmp_path):
    """Each preflight check that merged into one task still refuses with its own words, on the host it concerns, and
    changes nothing: the API's TLS (a CA that did not sign the node's certificate, through the pve_api lookup), the
    Proxmox VE release, the host's room for the driver, a container that is not configured, a VM's id in its place,
    the model's disk, a Python of the container with no lock (a stand-in that answers as a Python 3.14 would: the
    locks are for 3.11, 3.12, 3.13)."""
    py314 = "/usr/local/bin/python3.14"
    lab.exec("pct", "exec", "129", "--", "sh", "-c", "printf '#!/bin/sh\\necho 3.14\\n' > %s && chmod 755 %s" % (py314, py314))
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(other_ca), "-days", "1", "-subj", "/CN=not the lab's CA"], check=True, capture_output=True)
    rows = [
        ("kpro5", ["HTTP -1", "certificate verify failed", "The certificate is not trusted"],
         ["-e", "pve_api_ca_path=%s" % other_ca]),
        ("kpro5", ["Proxmox VE 8.4 is older than 99.0."], ["-e", "preflight_pve_min_release=99.0"]),
        ("kpro5", ["bytes free under /var/cache, 1000000000000000 needed."],
         ["-e", "preflight_host_min_free_bytes=1000000000000000"]),
        ("ct129", ["Container 998 is not configured on kpro5", "998"], ["-e", "pve_vmid=998"]),
        # the lab's VM 110 (seed.py: /etc/pve/nodes/kpro5/qemu-server/110.conf) named in place of the container
        ("ct129", ["pve_vmid 110 on kpro5 is a QEMU VM, not a container: set pve_vmid to the LXC container's id (pct list)",
                   "Nothing was changed"], ["-e", "pve_vmid=110"]),
        ("ct129", ["but the model needs 1000000000000000: grow the container's rootfs (pct resize 129 rootfs +NG)"],
         ["-e", "preflight_model_bytes=1000000000000000"]),
        ("ct129", ["CT 129 runs Debian GNU/Linux 12 (bookworm) (x86_64) with Python 3.14 (%s)" % py314,
                   "no lock for SGLang 0.5.11 on Python 3.14: it has locks for Python 3.11, 3.12, 3.13",
                   "regenerate.sh 0.5.11 3.14"],
         ["-e", "sglang_install_lock_file=", "-e", "sglang_install_python=%s" % py314]),
    ]
    for host, needles, extra in rows:
        before = disk_digest()
        r = play("--tags", "preflight", *extra)
        assert recap(r.stdout, host)["failed"] == 1, (extra, r.stdout[-3000:])
        flat = " ".join(r.stdout.split())
        if host != "kpro5":  # a container's refusal is its own: its host stops for it (the plan play), not for itself
            assert recap(r.stdout)["failed"] == 1, (extra, r.stdout[-3000:])
            assert "ct129 of this host failed the preflight: nothing is changed on kpro5" in flat, r.stdout[-3000:]
            assert flat.count("fatal: [kpro5]") == 1, (extra, r.stdout[-3000:])
        for needle in needles:
            assert needle in flat, (needle, r.stdout[-3000:])
        for s in secrets():
            assert s not in r.stdout
        assert disk_digest() == before
    lab.exec("pct", "exec", "129", "--", "rm", "-f", py314)


def test_a_vm_id_in_place_of_the_container_stops_its_host_before_any_stage(lab):
    """A whole run with a VM's id as pve_vmid: the container's preflight refuses it, and its Proxmox host does not go on
    to stages 1-3 for a container that left the run (the plan play's check); the node's disk is unchanged."""
    before = disk_digest()
    r = play("-e", "pve_vmid=110")
    flat = " ".join(r.stdout.split())
    assert recap(r.stdout, "ct129")["failed"] == 1 and recap(r.stdout, "kpro5")["failed"] == 1, r.stdout[-3000:]
    assert "pve_vmid 110 on kpro5 is a QEMU VM, not a container" in flat, r.stdout[-3000:]
    assert "ct129 of this host failed the preflight: nothing is changed on kpro5" in flat, r.stdout[-3000:]
    assert "Stage 1-2" not in r.stdout, r.stdout[-3000:]
    assert disk_digest() == before


def test_a_login_banner_on_the_host_changes_no_reading(lab):
    """root's .bashrc (Debian's has no "not interactive: return") runs for every ssh command, so what it prints comes
    first: the preflight's raw probes on the host are read from their marker on (roles/preflight/vars/main.yml), and
    the pct connection drops it before a raw task's lines or a module's JSON (START). The preflight reads the same
    host and container with the banner as without it."""
    def reports():
        r = play("--tags", "preflight")
        assert recap(r.stdout)["failed"] == 0 and recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-3000:]
        flat = " ".join(r.stdout.split())
        return [re.search(pattern, flat).group(0) for pattern in (r"kpro5: Proxmox VE [^']*", r"CT 129 on kpro5: [^']*")]

    plain = reports()
    bashrc = os.path.join(lab.root, "root/.bashrc")
    with open(bashrc) as f:
        before = f.read()
    try:
        with open(bashrc, "a") as f:
            f.write("echo 'Welcome to kpro5'; echo 'status: stopped'; echo present; echo '6.1.0-99-amd64'\n")
        with_banner = reports()
    finally:
        with open(bashrc, "w") as f:
            f.write(before)
    assert with_banner == plain
    assert "kernel 6.8.12-9-pve" in plain[0] and "status: running" in plain[1] and "GiB free for the model" in plain[1]
