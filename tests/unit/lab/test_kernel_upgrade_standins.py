"""Issue 14's lab stand-ins on a temp root (no lab): the kernel packages and their meta chain, the boot loader's
choice, the kernel's Secure Boot check against the MOK list, dkms signing as 3.0.10 does, modinfo's signer and
the boot's worst-case unit order."""

import errno
import os
import shutil
import subprocess
import sys

import pytest

from conftest import LAB, LABLIB, NEW_RELEASE, RELEASE, VERSION, lablib
# host is a fixture, used by name
from stock_host import HOST, host, install, stock  # noqa: F401  pylint: disable=unused-import


def test_kernel_packages_with_the_meta_chain(tmp_path):
    aptrepo = lablib("aptrepo")
    aptrepo.build_pve(str(tmp_path), [RELEASE], [RELEASE, NEW_RELEASE])
    repo = tmp_path / "build" / "apt" / "pve"
    stanzas = {s.split("\n")[0].split(": ")[1]: s for s in (repo / "Packages").read_text().strip().split("\n\n")}
    # proxmox-default-kernel -> proxmox-kernel-6.8 -> the newest published release (pve-kernel-meta)
    assert "Depends: proxmox-kernel-6.8\n" in stanzas["proxmox-default-kernel"]
    assert "Depends: proxmox-kernel-%s-signed | proxmox-kernel-%s\n" % (NEW_RELEASE, NEW_RELEASE) in stanzas["proxmox-kernel-6.8"]
    assert "Version: 6.8.12-11\n" in stanzas["proxmox-kernel-6.8"]
    # headers only where available: the new kernel has none
    assert "proxmox-headers-" + NEW_RELEASE not in stanzas and "Depends: proxmox-headers-%s\n" % RELEASE in stanzas["proxmox-headers-6.8"]
    deb = str(repo / ("proxmox-kernel-%s.deb" % NEW_RELEASE))
    files = subprocess.run(["dpkg-deb", "-c", deb], check=True, capture_output=True, text=True).stdout
    assert "./boot/vmlinuz-%s" % NEW_RELEASE in files and "./lib/modules/%s/" % NEW_RELEASE in files
    postinst = subprocess.run(["dpkg-deb", "-I", deb, "postinst"], check=True, capture_output=True, text=True).stdout
    assert ("run-parts --verbose --exit-on-error --arg=%s --arg=/boot/vmlinuz-%s /etc/kernel/postinst.d"
            % (NEW_RELEASE, NEW_RELEASE)) in postinst
    hdr = subprocess.run(["dpkg-deb", "-c", str(repo / ("proxmox-headers-%s.deb" % RELEASE))], check=True,
                         capture_output=True, text=True).stdout
    assert "-rwxr-xr-x root/root" in [ln for ln in hdr.splitlines() if ln.endswith("scripts/sign-file")][0]
    # Proxmox's headers postinst (pve-kernel debian/proxmox-headers.postinst.in) runs no /etc/kernel hook
    hdr_postinst = subprocess.run(["dpkg-deb", "-I", str(repo / ("proxmox-headers-%s.deb" % RELEASE)), "postinst"],
                                  check=True, capture_output=True, text=True).stdout
    assert "/etc/kernel" not in hdr_postinst and "run-parts" not in hdr_postinst


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_next_boot_newest_then_pin_then_next_boot_pin(tmp_path):
    labstate = lablib("labstate")
    root = str(tmp_path)
    st = {"kernel": {"release": RELEASE, "installed": [RELEASE, "6.8.12-4-pve"]}}
    assert labstate.next_boot_release(st, root) == RELEASE
    labstate.register_kernel(st, NEW_RELEASE)
    assert st["kernel"]["installed"] == ["6.8.12-4-pve", RELEASE, NEW_RELEASE]
    assert labstate.next_boot_release(st, root) == NEW_RELEASE  # newest, as systemd-boot/GRUB sort
    write(root, labstate.PIN_FILE, RELEASE + "\n")
    assert labstate.next_boot_release(st, root) == RELEASE
    write(root, labstate.NEXT_BOOT_PIN, "6.8.12-4-pve\n")
    assert labstate.next_boot_release(st, root) == "6.8.12-4-pve"
    assert labstate.boot_kernels(st, root) == ([], ["6.8.12-4-pve", RELEASE, NEW_RELEASE], RELEASE, "6.8.12-4-pve")
    labstate.unregister_kernel(st, "6.8.12-4-pve")  # a pin of a removed kernel is ignored
    assert labstate.next_boot_release(st, root) == RELEASE


def test_secure_boot_loads_only_modules_signed_by_an_enrolled_key():
    labstate = lablib("labstate")
    st = labstate.initial_state()
    rel = st["kernel"]["release"]
    st["kernel"]["secure_boot"] = True
    st["kernel"]["mok_enrolled"] = [{"signer": "kpro5 module signing", "sig_key": "1A:2B"}]
    st["modules"]["available"][rel] = ["nvidia"]
    st["nvidia"]["kernel_modules"] = {rel: {"version": VERSION, "signed": True, "signer": "DKMS module signing key",
                                            "sig_key": "7F:00"}}
    with pytest.raises(labstate.KernelError) as e:
        labstate.kmod_load(st, "nvidia")
    assert e.value.errno == errno.EKEYREJECTED
    assert str(e.value) == "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
    assert "DKMS module signing key" in labstate.module_signature_ok(st)[1]
    st["nvidia"]["kernel_modules"][rel].update(signer="kpro5 module signing", sig_key="1a:2b")
    assert labstate.module_signature_ok(st)[0]
    st["kernel"]["secure_boot"] = False  # without Secure Boot an unsigned module loads
    st["nvidia"]["kernel_modules"][rel] = {"version": VERSION, "signed": False}
    assert labstate.kmod_load(st, "nvidia") is True


def with_modinfo(root):
    shutil.copy(os.path.join(LAB, "rootfs", "usr", "sbin", "modinfo"), root.p("/usr/sbin/modinfo"))
    return root


def make_cert(root, key, cert, cn):
    subprocess.run(["openssl", "req", "-new", "-x509", "-nodes", "-days", "30", "-subj", "/CN=" + cn, "-newkey", "rsa:2048",
                    "-keyout", root.p(key), "-outform", "DER", "-out", root.p(cert)], check=True, capture_output=True)


def headers_with_sign_file(root, release):
    root.install_headers(release)
    os.chmod(root.p("/usr/src/linux-headers-%s/scripts/sign-file" % release), 0o755)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the keys")
def test_dkms_signs_with_the_framework_key_or_its_own_and_modinfo_shows_it(host):
    assert install(with_modinfo(host), *HOST).returncode == 0
    headers_with_sign_file(host, NEW_RELEASE)
    os.makedirs(host.p("/root"), exist_ok=True)
    make_cert(host, "/root/mok.key", "/root/mok.der", "kpro5 module signing")
    write(host.path, "etc/dkms/framework.conf.d/kpro.conf", 'mok_signing_key="/root/mok.key"\nmok_certificate=/root/mok.der\n')
    r = host.tool("/usr/sbin/dkms", "autoinstall", "--kernelver", NEW_RELEASE)
    assert r.returncode == 0, r.stderr
    assert "Sign command: /lib/modules/%s/build/scripts/sign-file" % NEW_RELEASE in r.stdout
    assert "Signing key: /root/mok.key\nPublic certificate (MOK): /root/mok.der" in r.stdout
    built = host.state()["nvidia"]["kernel_modules"][NEW_RELEASE]
    assert built["signed"] and built["signer"] == "kpro5 module signing" and ":" in built["sig_key"]
    r = host.tool("/usr/sbin/modinfo", "-k", NEW_RELEASE, "-F", "signer", "nvidia")
    assert r.returncode == 0 and r.stdout == "kpro5 module signing\n", r.stderr
    r = host.tool("/usr/sbin/modinfo", "-k", NEW_RELEASE, "nvidia")
    assert "sig_key:        %s\n" % built["sig_key"] in r.stdout and "version:        %s\n" % VERSION in r.stdout
    # without the configuration, dkms generates and uses its own key (/var/lib/dkms/mok.key, CN "DKMS module signing key")
    # (install --force keeps the module built before: dkms 3.0.10 do_install builds only what is not built, dkms.in:1177)
    os.unlink(host.p("/etc/dkms/framework.conf.d/kpro.conf"))
    r = host.tool("/usr/sbin/dkms", "install", "-m", "nvidia", "-v", VERSION, "-k", NEW_RELEASE, "--force")
    assert r.returncode == 0 and host.state()["nvidia"]["kernel_modules"][NEW_RELEASE]["signer"] == "kpro5 module signing"
    assert host.tool("/usr/sbin/dkms", "remove", "-m", "nvidia", "-v", VERSION, "-k", NEW_RELEASE).returncode == 0
    r = host.tool("/usr/sbin/dkms", "install", "-m", "nvidia", "-v", VERSION, "-k", NEW_RELEASE)
    assert r.returncode == 0, r.stderr
    assert "Certificate or key are missing, generating self signed certificate for MOK..." in r.stdout
    assert os.path.exists(host.p("/var/lib/dkms/mok.key")) and os.path.exists(host.p("/var/lib/dkms/mok.pub"))
    assert host.state()["nvidia"]["kernel_modules"][NEW_RELEASE]["signer"] == "DKMS module signing key"
    r = host.tool("/usr/sbin/dkms", "status")  # the key files in /var/lib/dkms are not modules
    assert r.returncode == 0 and "nvidia/%s, %s, x86_64: installed" % (VERSION, NEW_RELEASE) in r.stdout, r.stderr
    # no module for a kernel: kmod's message
    r = host.tool("/usr/sbin/modinfo", "-k", "6.8.12-4-pve", "nvidia")
    assert r.returncode == 1 and r.stderr == "modinfo: ERROR: Module nvidia not found.\n"


def test_dkms_without_sign_file_does_not_sign(host):
    assert install(with_modinfo(host), *HOST).returncode == 0
    host.install_headers(NEW_RELEASE)  # sign-file not executable: "won't be signed"
    r = host.tool("/usr/sbin/dkms", "autoinstall", "-k", NEW_RELEASE)
    assert r.returncode == 0 and "modules won't be signed" in r.stdout
    assert host.state()["nvidia"]["kernel_modules"][NEW_RELEASE]["signed"] is False
    assert host.tool("/usr/sbin/modinfo", "-k", NEW_RELEASE, "-F", "signer", "nvidia").stdout == ""


def test_boot_order_is_the_worst_case_for_the_guests(tmp_path):
    sys.path.insert(0, LABLIB)
    boot = lablib("boot")
    root = str(tmp_path)
    old, boot.ROOT = boot.ROOT, root
    try:
        units = {"etc/systemd/system/nvidia-device-nodes.service": "[Unit]\nDescription=Nodes\nBefore=pve-guests.service\n",
                 "etc/systemd/system/late.service": "[Unit]\nDescription=Late\n",
                 "etc/systemd/system/after-dkms.service": "[Unit]\nDescription=A\nAfter=dkms.service\nBefore=pve-guests.service\n",
                 "lib/systemd/system/dkms.service": "[Unit]\nDescription=DKMS\n",
                 "lib/systemd/system/cron.service": "[Unit]\nDescription=cron\n"}
        for rel, text in units.items():
            write(root, rel, text)
            link = os.path.join(root, boot.WANTS, os.path.basename(rel))
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink("/" + rel, link)
        enabled = boot.enabled_units()
        assert "cron.service" not in enabled  # the stock host's units are the lab's own processes
        seq = boot.order(enabled)
        # units ordered before the guests first (dkms.service before the one ordered after it), then the guests,
        # then the rest; dkms.service as late as nothing orders it
        assert seq.index("dkms.service") < seq.index("after-dkms.service") < seq.index("pve-guests.service")
        assert seq.index("nvidia-device-nodes.service") < seq.index("pve-guests.service") < seq.index("late.service")
    finally:
        boot.ROOT = old


def test_standins_cite_and_exist():
    for rel in ("rootfs/usr/sbin/modinfo", "rootfs/usr/sbin/proxmox-boot-tool", "rootfs/etc/kernel/postinst.d/initramfs-tools",
                "rootfs/etc/kernel/postinst.d/zz-proxmox-boot", "rootfs/usr/lib/kpro-lab/boot.py"):
        assert os.access(os.path.join(LAB, rel), os.X_OK) or rel.endswith(".py"), rel
