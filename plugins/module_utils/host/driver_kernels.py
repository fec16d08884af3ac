# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_driver's second half in host mode: the NVIDIA module built through DKMS for every kernel that can boot,
DKMS's signing key set to the enrolled one under Secure Boot, and each module's signature verified.

``Kernels(driver)`` uses the Driver's ``run``/``m``/``p`` (nvidia_host.py); the decisions are boot_kernels.py's and
module_signing.py's. Every command it runs in check mode is read-only (proxmox-boot-tool kernel list, dkms status,
modinfo, mokutil --test-key).
"""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import boot_kernels as bk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import module_signing as ms
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write, backup, read_text


def boot_listing(module):
    """``proxmox-boot-tool kernel list`` parsed, or None where the tool is absent or fails (plain GRUB hosts)."""
    tool = module.get_bin_path("proxmox-boot-tool")
    if not tool:
        return None
    rc, out, _err = module.run_command([tool, "kernel", "list"])
    return bk.parse_boot_tool_list(out) if rc == 0 else None


def modinfo(module, kernel, name="nvidia"):
    """modinfo's fields of ``name`` for ``kernel`` ({} when the kernel has no such module, or no kmod is installed:
    run_command would end the module on a missing executable)."""
    tool = module.get_bin_path("modinfo")
    if not tool:
        return {}
    rc, out, _err = module.run_command([tool, "-k", kernel, name])
    return ms.parse_modinfo_fields(out) if rc == 0 else {}


def read_certificate(path):
    """(identity, error): the certificate's serial and issuer CN, or why it cannot be read."""
    try:
        with open(path, "rb") as f:
            return ms.cert_identity(f.read()), None
    except (IOError, OSError, ValueError) as e:
        return None, "%s: %s" % (path, e)


def framework_texts(conf=ms.FRAMEWORK_CONF):
    """[(path, text)] in DKMS's reading order: framework.conf, then framework.conf.d/*.conf (beside it) sorted."""
    dropins = os.path.join(os.path.dirname(conf), "framework.conf.d")
    texts = [(conf, read_text(conf) or "")]
    try:
        names = sorted(n for n in os.listdir(dropins) if n.endswith(".conf"))
    except OSError:
        names = []
    return texts + [(os.path.join(dropins, n), read_text(os.path.join(dropins, n)) or "") for n in names]


def headers_candidate(module, package):
    """None when apt has ``package`` to install, else why not (read-only: ``apt-cache policy``, as C).

    apt-cache policy prints "  Installed: <v>|(none)" and "  Candidate: <v>|(none)" (apt, apt-private/private-show.cc,
    ShowPolicy; translated, hence LC_ALL=C), and nothing at all for a name no list knows. An apt-cache that is absent or
    fails answers None: apt-get decides then."""
    tool = module.get_bin_path("apt-cache")
    if not tool:
        return None
    rc, out, _err = module.run_command([tool, "policy", package], environ_update={"LC_ALL": "C"})
    if rc != 0:
        return None
    fields = dict(line.strip().split(": ", 1) for line in out.splitlines() if line.strip().startswith(("Installed: ", "Candidate: ")))
    candidate, installed = fields.get("Candidate", "(none)"), fields.get("Installed", "(none)")
    if candidate == "(none)":
        return "not installed, and apt has no installation candidate (apt-cache policy)"
    if candidate == installed:
        return "installed (%s), yet its build/include is missing: apt-get install --reinstall %s" % (installed, package)
    return None


BACKUP_SUFFIX = ".kpro-gpu-serving.bak"  # DKMS reads framework.conf.d/*.conf only: a backup here is never read


class Kernels(object):
    """The per-kernel work of one run; ``report`` is returned as the module's ``kernels``."""

    def __init__(self, driver, version):
        self.d, self.m, self.p, self.version = driver, driver.m, driver.p, version
        self.report = []
        self.problems = []  # (phase, kernel, message, evidence, package)

    def observe(self):
        installed = bk.installed_kernels(self.p["boot_dir"])
        running = self.d.kernel_release()
        listing = boot_listing(self.m)
        self.next_boot = bk.next_boot_kernel(listing, installed) or running
        kernels = bk.bootable_kernels(listing, installed, running)
        entries = self.d.dkms_entries()
        self.report = bk.kernel_report(kernels, self.version, entries, running, self.next_boot, self.p["modules_root"])
        return self.report

    def configure_signing(self):
        """Point DKMS at the enrolled key (backup first, diff, check mode honest); returns the key DKMS will use."""
        key, cert = self.p["module_signing_key"], self.p["module_signing_cert"]
        conf = self.p["dkms_framework_conf"]
        if not (key and cert):
            return ms.framework_settings(framework_texts(conf))["mok_signing_key"][0]
        old = read_text(conf) or ""
        new = ms.edit_framework_conf(old, key, cert)
        if new != old:
            self.d.changed = True
            self.d.diff.append({"before_header": conf, "after_header": conf, "before": old, "after": new})
            if not self.m.check_mode:
                if old:
                    entry = backup(old.encode("utf-8"), conf + BACKUP_SUFFIX)
                    self.d.log.append({"backup": entry})
                atomic_write(conf, new.encode("utf-8"), mode=MODE_DEFAULT, default_mode=0o644)
        texts = [(conf, new)] + framework_texts(conf)[1:]
        effective = ms.framework_settings(texts)
        for name, want in (("mok_signing_key", key), ("mok_certificate", cert)):
            value, where = effective[name]
            if value != want:
                raise Failure("module_wrong_key", "%s in %s sets %s=%s, overriding %s: DKMS would sign with %s." % (
                    where, os.path.dirname(where), name, value, conf, value),
                    remedy="remove %s from %s (DKMS reads it after framework.conf)" % (name, where))
        return key

    def wrong_key(self, kernel, fields):
        """Under Secure Boot, with the enrolled key and certificate given: the module (modinfo ``fields``) of ``kernel``
        is not signed by that certificate, so the kernel refuses it: built again rather than loaded."""
        cert_path = self.p["module_signing_cert"]
        cert = read_certificate(cert_path)[0] if cert_path and self.p["module_signing_key"] else None
        if not (cert and fields):
            return False
        try:
            ms.check_signature(kernel, fields, cert, cert_path, None)
        except Failure:
            return True
        return False

    def install_headers(self, entry):
        """apt-get install proxmox-headers-<kernel>; True when they are there afterwards. ``changed`` only when apt
        succeeded (or, in check mode, would run).

        A fallback kernel (neither running nor the next boot) is tried only when apt has something to install
        (``headers_candidate``): an old kernel whose headers left the repository stays a warning without an apt run
        and without changed on every run. Nothing is remembered between runs: apt's own lists decide."""
        if not self.p["install_headers"]:
            return False
        if not (entry["running"] or entry["next_boot"]):
            why = headers_candidate(self.m, entry["headers_package"])
            if why:
                entry["apt"] = why
                return False
        if self.m.check_mode:
            self.d.changed = True
            entry["action"] = "install_headers"
            return True
        apt = self.m.get_bin_path("apt-get", required=True)
        rc, out, err = self.d.run([apt, "install", "-y", "--no-install-recommends", entry["headers_package"]],
                                  environ={"DEBIAN_FRONTEND": "noninteractive"})
        entry["apt"] = ((err or out).strip().splitlines() or [""])[-1]
        self.d.changed = self.d.changed or rc == 0
        return rc == 0 and bk.headers_present(entry["kernel"], self.p["modules_root"])

    def build(self, entry, force=False):
        """dkms install for one kernel (build and install); a failure keeps make.log's last lines. ``changed`` only
        when dkms succeeded (or, in check mode, would run). A failed build of a fallback kernel is tried again on the
        next run (DKMS keeps no record of a failed build to read back), without changed. ``force``: past DKMS's
        check_version_sanity, which refuses a module of the same version already under /lib/modules/<kernel> (the
        installer's own, on a host whose driver was registered with DKMS afterwards)."""
        entry["action"] = "build"
        if self.m.check_mode:
            self.d.changed = True
            return
        dkms = self.m.get_bin_path("dkms") or "dkms"
        rc, out, err = self.d.run([dkms, "install"] + (["--force"] if force else []) +
                                  ["-m", "nvidia", "-v", self.version, "-k", entry["kernel"]])
        if rc == 0:
            self.d.changed = True
            entry["dkms"] = "installed"
            return
        why = bk.failed_build(self.version, entry["kernel"], ((err or out).strip().splitlines() or [""])[-1],
                              dkms_tree=self.p["dkms_tree"])
        entry.update(dkms="failed", make_log=why["make_log"], make_log_tail=why["make_log_tail"])
        self.problems.append(("dkms_build_failed", entry["kernel"], "dkms install -m nvidia -v %s -k %s failed (rc=%d): %s" % (
            self.version, entry["kernel"], rc, why["summary"]), why["evidence"] + why["make_log_tail"], None))

    def ensure_built(self):
        for entry in bk.kernels_to_build(self.report):
            if not entry["headers"] and not self.install_headers(entry):
                entry["action"] = "none"
                self.problems.append(("boot_kernel_headers_missing", entry["kernel"], "kernel %s can boot but has no headers "
                                      "(%s: %s): DKMS cannot build nvidia %s for it." % (
                                          entry["kernel"], entry["headers_package"], entry.get("apt") or "not installed",
                                          self.version),
                                      [], entry["headers_package"]))
                continue
            self.build(entry)

    def verify_signatures(self, dkms_key):
        """Under Secure Boot, each bootable kernel's nvidia module is signed by the enrolled certificate (modinfo)."""
        cert_path = self.p["module_signing_cert"]
        cert, error = read_certificate(cert_path) if cert_path else (None, "no module_signing_cert given")
        for entry in self.report:
            if entry.get("dkms") != "installed" or (self.m.check_mode and entry.get("action") == "build"):
                continue
            fields = modinfo(self.m, entry["kernel"])
            entry["signer"], entry["sig_key"] = fields.get("signer"), fields.get("sig_key")
            if cert is None and (fields.get("signer") or fields.get("sig_key")):
                continue  # signed, and no certificate to compare with: the kernel's keyring decides
            try:
                try:
                    ms.check_signature(entry["kernel"], fields, cert or {"serial": None}, cert_path, dkms_key)
                except Failure:
                    if not (cert and self.p["module_signing_key"]) or entry.get("action") == "build":
                        raise
                    self.resign(entry)  # built before DKMS had the enrolled key: build again, signed with it
                    if not self.m.check_mode and entry["dkms"] == "installed":
                        fields = modinfo(self.m, entry["kernel"])
                        entry["signer"], entry["sig_key"] = fields.get("signer"), fields.get("sig_key")
                        ms.check_signature(entry["kernel"], fields, cert, cert_path, dkms_key)
            except Failure as e:
                if cert is None:
                    e.msg += " (%s)" % error
                self.problems.append((e.phase, entry["kernel"], e.msg, [], None))

    def resign(self, entry):
        """dkms remove + install for one kernel: the module is built and signed again with the configured key."""
        if not self.m.check_mode:
            dkms = self.m.get_bin_path("dkms") or "dkms"
            rc = self.d.run([dkms, "remove", "-m", "nvidia", "-v", self.version, "-k", entry["kernel"]])[0]
            self.d.changed = self.d.changed or rc == 0  # the old module is gone, whatever the build does
        self.build(entry, force=True)
        entry["action"] = "resign"

    def run(self, secure_boot, dkms_key=None):
        """observe, sign, build, verify; raise the first problem's phase with every problem as evidence. ``dkms_key``:
        the key DKMS signs with, when configure_signing() already ran (the host step runs it before anything builds)."""
        self.observe()
        dkms_key = dkms_key or (self.configure_signing() if secure_boot else None)
        if self.p["dkms"]:
            self.ensure_built()
        if secure_boot:
            self.verify_signatures(dkms_key)
        # the next boot and the running kernel must have the module; an older fallback kernel without it is a warning
        must = (self.next_boot, self.d.kernel_release())
        for phase, kernel, msg, _ev, _pkg in [p for p in self.problems if p[1] not in must]:
            self.m.warn("%s: %s (a fallback kernel: the next boot is %s)" % (phase, msg, self.next_boot))
        self.problems = [p for p in self.problems if p[1] in must]
        if self.problems:
            raise self.failure()
        return self.report

    def failure(self):
        phase, kernel, msg = self.problems[0][:3]
        evidence = ["%s: %s" % (k, m) for _p, k, m, _e, _pkg in self.problems] + \
            [line for p in self.problems for line in p[3]]
        packages = [pkg for p in self.problems for pkg in [p[4]] if pkg]
        remedy = {
            "boot_kernel_headers_missing": "apt-get install %s (enable the Proxmox repository that has them), then re-run the "
                                           "gpu_host stage; or remove the kernel (apt-get remove proxmox-kernel-<kernel>) or pin "
                                           "another one (proxmox-boot-tool kernel pin <kernel>)" % " ".join(packages or ["?"]),
            "dkms_build_failed": "read %s; a driver branch too old for this kernel needs a newer gpu_host_driver_version, "
                                 "else pin the previous kernel: proxmox-boot-tool kernel pin <kernel>" % (
                                     ", ".join(e.get("make_log") or "make.log" for e in self.report if e.get("dkms") == "failed")),
        }.get(phase, "set mok_signing_key/mok_certificate in %s to the enrolled key (gpu_host_module_signing_key/_cert), then "
                     "dkms remove -m nvidia -v %s -k %s && dkms install -m nvidia -v %s -k %s (the gpu_host stage does it)" % (
                         self.p["dkms_framework_conf"], self.version, kernel, self.version, kernel))
        return Failure(phase, "%s (%d problem(s) over %d bootable kernel(s); next boot: %s)" % (
            msg, len(self.problems), len(self.report), self.next_boot), remedy=remedy, evidence=evidence,
            kernels=self.report, next_boot_kernel=self.next_boot)
