# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""driver_kernels.Kernels: nvidia built through DKMS for every kernel that can boot, the signing key set for DKMS."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import driver_kernels as dk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_host as nh
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

V = "580.126.09"
OLD, NEW = "6.8.12-9-pve", "6.8.12-10-pve"
LISTING = "Manually selected kernels:\nNone.\n\nAutomatically selected kernels:\n%s\n%s\n" % (NEW, OLD)


class Host(object):
    """A fake host: the kernels in /boot, headers, DKMS's state; ``dkms install`` builds when the headers are there."""

    def __init__(self, tmp, check_mode=False, headers=(OLD, NEW), apt_has=(), **params):
        self.tmp, self.check_mode, self.apt_has, self.ran, self.warnings = tmp, check_mode, set(apt_has), [], []
        self.apt_policy, self.apt_installed = params.pop("apt_policy", False), params.pop("apt_installed", {})
        for d in ("boot", "modules", "proc/sys/kernel", "dkms", "etc"):
            os.makedirs(os.path.join(tmp, d), exist_ok=True)
        with open(os.path.join(tmp, "proc/sys/kernel/osrelease"), "w") as f:
            f.write(OLD + "\n")
        for k in (OLD, NEW):
            open(os.path.join(tmp, "boot", "vmlinuz-" + k), "w").close()
        for k in headers:
            os.makedirs(os.path.join(tmp, "modules", k, "build", "include"), exist_ok=True)
        self.dkms = {OLD: "installed"}
        self.signer, self.sign_with = {}, None  # kernel -> (signer, sig_key) of its built module; what DKMS signs with now
        self.params = dict(version=V, install_headers=True, dkms=True, all_kernels=True, module_signing_key=None,
                           module_signing_cert=None, proc_root=os.path.join(tmp, "proc"), boot_dir=os.path.join(tmp, "boot"),
                           modules_root=os.path.join(tmp, "modules"), dkms_tree=os.path.join(tmp, "dkms"),
                           dkms_framework_conf=os.path.join(tmp, "etc", "framework.conf"), efivars_dir=os.path.join(tmp, "efi"))
        self.params.update(params)

    def get_bin_path(self, name, required=False):
        return "/usr/bin/" + name

    def warn(self, msg):
        self.warnings.append(msg)

    def run_command(self, argv, environ_update=None):
        self.ran.append(argv)
        tool = os.path.basename(argv[0])
        if tool == "proxmox-boot-tool":
            return 0, LISTING, ""
        if tool == "dkms" and argv[1] == "status":
            return 0, "".join("nvidia/%s, %s, x86_64: %s\n" % (V, k, s) for k, s in self.dkms.items()), ""
        if tool == "dkms" and argv[1] == "install":
            k = argv[-1]
            if not os.path.isdir(os.path.join(self.params["modules_root"], k, "build", "include")):
                log = os.path.join(self.params["dkms_tree"], "nvidia", V, "build")
                os.makedirs(log, exist_ok=True)
                with open(os.path.join(log, "make.log"), "w") as f:
                    f.write("DKMS make.log for nvidia-%s for kernel %s (x86_64)\nnv.c:1: error: boom\n"
                            "cc: error: unrecognized command-line option '-ftrivial-auto-var-init=zero'\n" % (V, k))
                return 10, "", "Error! Bad return status for module build on kernel: %s (x86_64)" % k
            self.dkms[k] = "installed"
            return 0, "", ""
        if tool == "dkms" and argv[1] == "remove":
            self.dkms.pop(argv[-1], None)
            self.signer.pop(argv[-1], None)
            return 0, "", ""
        if tool == "modinfo":
            signer, key = self.signer.get(argv[2]) or (self.sign_with or (None, None))
            self.signer[argv[2]] = (signer, key)
            sig = "signer: %s\nsig_key: %s\n" % (signer, key) if signer else ""
            return 0, "filename: /lib/modules/%s/updates/dkms/nvidia.ko\nversion: %s\n%s" % (argv[2], V, sig), ""
        if tool == "apt-cache" and self.apt_policy:
            pkg = argv[-1]  # apt-cache policy prints nothing for a name no list knows (apt 2.6, bookworm)
            if pkg not in self.apt_has and pkg not in self.apt_installed:
                return 0, "", ""
            installed = self.apt_installed.get(pkg, "(none)")
            return 0, "%s:\n  Installed: %s\n  Candidate: %s\n  Version table:\n" % (
                pkg, installed, "6.8.12-9" if pkg in self.apt_has else installed), ""
        if tool == "apt-get":
            pkg = argv[-1]
            if pkg in self.apt_has:
                os.makedirs(os.path.join(self.params["modules_root"], pkg.split("headers-")[1], "build", "include"))
                return 0, "", ""
            return 100, "", "E: Unable to locate package %s" % pkg
        return 1, "", "unexpected"


def kernels(host):
    d = nh.Driver(host)
    return d, dk.Kernels(d, V)


def test_builds_for_the_new_kernel_then_nothing_to_do(tmp_path):
    host = Host(str(tmp_path))
    d, k = kernels(host)
    report = k.run(secure_boot=False)
    assert d.changed and k.next_boot == NEW
    assert [(r["kernel"], r["dkms"], r.get("action")) for r in report] == [(NEW, "installed", "build"), (OLD, "installed", None)]
    assert ["/usr/bin/dkms", "install", "-m", "nvidia", "-v", V, "-k", NEW] in host.ran
    d, k = kernels(host)
    k.run(secure_boot=False)
    assert not d.changed  # a second run: changed=0


def test_check_mode_reports_the_build_and_runs_nothing(tmp_path):
    host = Host(str(tmp_path), check_mode=True)
    d, k = kernels(host)
    report = k.run(secure_boot=False)
    assert d.changed and report[0]["action"] == "build" and host.dkms == {OLD: "installed"}
    assert not any(a[1] == "install" for a in host.ran if "dkms" in a[0])


def test_phase_boot_kernel_headers_missing_names_kernel_and_package(tmp_path):
    host = Host(str(tmp_path), headers=(OLD,))
    d, k = kernels(host)
    with pytest.raises(Failure) as e:
        k.run(secure_boot=False)
    f = e.value
    assert f.phase == "boot_kernel_headers_missing"
    assert NEW in f.msg and "proxmox-headers-%s" % NEW in f.msg and "Unable to locate package" in f.msg
    assert "apt-get install proxmox-headers-%s" % NEW in f.remedy
    assert f.details["next_boot_kernel"] == NEW and f.details["kernels"][0]["dkms"] == "added"


def test_headers_installed_when_the_repository_has_them(tmp_path):
    host = Host(str(tmp_path), headers=(OLD,), apt_has=("proxmox-headers-%s" % NEW,))
    d, k = kernels(host)
    assert k.run(secure_boot=False)[0]["dkms"] == "installed"


def test_phase_dkms_build_failed_keeps_the_make_log_tail(tmp_path):
    host = Host(str(tmp_path), headers=(OLD,), install_headers=False)
    os.makedirs(os.path.join(host.params["modules_root"], NEW, "build"))  # headers package half there: no include/
    d, k = kernels(host)
    # headers counted missing (no include/): no build attempted, the headers are named
    with pytest.raises(Failure) as e:
        k.run(secure_boot=False)
    assert e.value.phase == "boot_kernel_headers_missing"
    # a build that fails for another reason: dkms_build_failed with make.log's last lines
    d, k = kernels(host)
    k.observe()
    entry = k.report[0]
    entry["headers"] = True
    k.build(entry)
    f = k.failure()
    assert f.phase == "dkms_build_failed" and "nv.c:1: error: boom" in f.evidence
    # why, from the compiler's words in make.log (installer_log.build_failure)
    assert "does not know the kernel's flag -ftrivial-auto-var-init=zero" in f.msg, f.msg
    assert "make.log" in f.remedy and entry["dkms"] == "failed"


def test_signing_key_set_in_framework_conf_with_backup_and_diff(tmp_path):
    host = Host(str(tmp_path), module_signing_key="/root/MOK.priv", module_signing_cert="/root/MOK.der")
    conf = host.params["dkms_framework_conf"]
    with open(conf, "w") as f:
        f.write("# mok_signing_key=/var/lib/dkms/mok.key\n# mok_certificate=/var/lib/dkms/mok.pub\n")
    d, k = kernels(host)
    assert k.configure_signing() == "/root/MOK.priv"
    assert d.changed and d.diff[0]["after"].endswith("mok_signing_key=/root/MOK.priv\nmok_certificate=/root/MOK.der\n")
    with open(conf + dk.BACKUP_SUFFIX) as f:
        assert f.read().startswith("# mok_signing_key")
    d, k = kernels(host)
    k.configure_signing()
    assert not d.changed and d.diff == []
    os.makedirs(os.path.join(str(tmp_path), "etc", "framework.conf.d"))
    with open(os.path.join(str(tmp_path), "etc", "framework.conf.d", "zz.conf"), "w") as f:
        f.write("mok_signing_key=/var/lib/dkms/mok.key\n")
    with pytest.raises(Failure) as e:
        k.configure_signing()
    assert e.value.phase == "module_wrong_key" and "zz.conf" in e.value.msg


def test_secure_boot_module_of_every_kernel_signed_with_the_enrolled_key(tmp_path):
    from test_module_signing import SERIAL, make_cert, modinfo_sig_key
    cert = tmp_path / "MOK.der"
    cert.write_bytes(make_cert("kpro MOK", SERIAL)[0])
    host = Host(str(tmp_path), module_signing_key="/root/MOK.priv", module_signing_cert=str(cert))
    host.signer[OLD] = ("DKMS module signing key", "3F:01")  # built earlier by DKMS with its own key
    host.sign_with = ("kpro MOK", modinfo_sig_key(SERIAL))  # DKMS now signs with the configured key
    d, k = kernels(host)
    report = k.run(secure_boot=True)
    assert [(r["kernel"], r.get("action"), r["signer"]) for r in report] == [(NEW, "build", "kpro MOK"), (OLD, "resign", "kpro MOK")]
    assert ["/usr/bin/dkms", "remove", "-m", "nvidia", "-v", V, "-k", OLD] in host.ran
    d, k = kernels(host)
    k.run(secure_boot=True)
    assert not d.changed


def test_secure_boot_without_the_key_names_dkms_own_key(tmp_path):
    from test_module_signing import SERIAL, make_cert
    cert = tmp_path / "MOK.der"
    cert.write_bytes(make_cert("kpro MOK", SERIAL)[0])
    host = Host(str(tmp_path), module_signing_cert=str(cert))
    host.sign_with = ("DKMS module signing key", "3F:01")
    d, k = kernels(host)
    with pytest.raises(Failure) as e:
        k.run(secure_boot=True)
    assert e.value.phase == "module_wrong_key" and "/var/lib/dkms/mok.key" in e.value.msg
    assert len(e.value.evidence) == 2  # both kernels


def test_a_fallback_kernel_without_headers_is_a_warning_not_a_failure(tmp_path):
    host = Host(str(tmp_path), headers=(NEW,))
    with open(os.path.join(host.params["proc_root"], "sys/kernel/osrelease"), "w") as f:
        f.write(NEW + "\n")  # running the new kernel; the old one stays bootable, its headers gone from the repository
    host.dkms = {NEW: "installed"}
    d, k = kernels(host)
    report = k.run(secure_boot=False)
    assert [(r["kernel"], r["dkms"]) for r in report] == [(NEW, "installed"), (OLD, "added")]
    assert len(host.warnings) == 1 and host.warnings[0].startswith("boot_kernel_headers_missing: kernel %s" % OLD)


def _running(host, kernel):
    with open(os.path.join(host.params["proc_root"], "sys/kernel/osrelease"), "w") as f:
        f.write(kernel + "\n")
    host.dkms = {kernel: "installed"}


def test_a_fallback_kernel_whose_headers_apt_cannot_install_is_not_retried(tmp_path):
    # running the new kernel; the old one stays bootable and its headers left the repository: apt-cache policy
    # knows no candidate, so no apt-get runs, nothing is changed, run after run; the warning stays
    host = Host(str(tmp_path), headers=(NEW,), apt_policy=True)
    _running(host, NEW)
    for _run in range(2):
        host.ran, host.warnings = [], []
        d, k = kernels(host)
        report = k.run(secure_boot=False)
        assert not d.changed and report[1]["action"] == "none"
        assert ["/usr/bin/apt-cache", "policy", "proxmox-headers-%s" % OLD] in host.ran
        assert not any(os.path.basename(a[0]) == "apt-get" or a[1] == "install" for a in host.ran)
        assert len(host.warnings) == 1 and "no installation candidate" in host.warnings[0] and OLD in host.warnings[0]
    # check mode agrees: nothing to install, changed=0
    host.check_mode = True
    d, k = kernels(host)
    k.run(secure_boot=False)
    assert not d.changed


def test_a_fallback_kernel_whose_headers_are_installed_but_broken_is_not_retried(tmp_path):
    host = Host(str(tmp_path), headers=(NEW,), apt_policy=True, apt_installed={"proxmox-headers-%s" % OLD: "6.8.12-9"})
    _running(host, NEW)
    d, k = kernels(host)
    k.run(secure_boot=False)
    assert not d.changed and not any(os.path.basename(a[0]) == "apt-get" for a in host.ran)
    assert "--reinstall proxmox-headers-%s" % OLD in host.warnings[0]


def test_a_fallback_kernel_with_installable_headers_gets_them(tmp_path):
    host = Host(str(tmp_path), headers=(NEW,), apt_policy=True, apt_has=("proxmox-headers-%s" % OLD,))
    _running(host, NEW)
    d, k = kernels(host)
    report = k.run(secure_boot=False)
    assert d.changed and report[1]["dkms"] == "installed" and host.warnings == []
    d, k = kernels(host)
    k.run(secure_boot=False)
    assert not d.changed


def test_a_failed_apt_or_build_of_a_fallback_kernel_is_not_a_change(tmp_path):
    # apt-cache unknown (no answer): apt-get is tried and fails -> changed=0; the next run the same
    host = Host(str(tmp_path), headers=(NEW,))
    _running(host, NEW)
    for _run in range(2):
        d, k = kernels(host)
        k.run(secure_boot=False)
        assert not d.changed and any(os.path.basename(a[0]) == "apt-get" for a in host.ran)
    # headers there but half (no include/ would be counted missing): a build that fails -> a warning, changed=0
    os.makedirs(os.path.join(host.params["modules_root"], OLD, "build", "include"))
    real = host.run_command

    def failing_build(argv, environ_update=None):
        if os.path.basename(argv[0]) == "dkms" and argv[1] == "install" and argv[-1] == OLD:
            host.ran.append(argv)
            return 10, "", "Error! Bad return status for module build on kernel: %s (x86_64)" % OLD
        return real(argv, environ_update)
    host.run_command = failing_build
    for _run in range(2):
        host.warnings = []
        d, k = kernels(host)
        report = k.run(secure_boot=False)
        assert not d.changed and report[1]["dkms"] == "failed"
        assert len(host.warnings) == 1 and host.warnings[0].startswith("dkms_build_failed: ")


def test_the_next_boot_kernel_still_fails_the_stage_without_a_change(tmp_path):
    host = Host(str(tmp_path), headers=(OLD,), apt_policy=True)
    d, k = kernels(host)
    with pytest.raises(Failure) as e:
        k.run(secure_boot=False)
    assert e.value.phase == "boot_kernel_headers_missing" and not d.changed
    assert ["/usr/bin/apt-get", "install", "-y", "--no-install-recommends", "proxmox-headers-%s" % NEW] in host.ran
