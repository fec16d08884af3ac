# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps of kpro.gpu_serving.nvidia_driver: observe (kernel, DKMS, NVML), get a verified installer, install or
rebuild, load, and verify. Each mode returns the module's result; a known failure is raised as ``Failure`` (failure.py)
with the old name in ``failure``. Only the module's main ends the module.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time

from ansible.module_utils.urls import fetch_url

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import boot_kernels as bk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import installer_log
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_installer as ni
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.driver_kernels import Kernels, modinfo
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import VOCABULARY, Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write, read_text
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.nvml import gpu_facts, read_proc_driver_version

INSTALLER_LOG = "/var/log/nvidia-installer.log"  # nvidia-installer 590.48.01 nvidia-installer.h:554
BUILDS = ("install", "rebuild_module", "resign_module", "register_dkms")  # the actions that build a module


class Driver(object):
    """The steps of kpro.gpu_serving.nvidia_driver (host, userspace, fetched); ``module`` is the AnsibleModule."""

    def __init__(self, module):
        self.m = module
        self.p = module.params
        self.changed = False
        self.log = []
        self.diff = []  # the systemd units written (or that check mode would write), before/after
        self.extra = {}  # more return values of the host step (the module's release look)
        self._dkms = None  # DKMS's nvidia entries, read once until run() changes the host
        self.kernels = None  # driver_kernels.Kernels of the host step

    def fail(self, kind, msg, **extra):
        """Raise the named failure; RV(failure) keeps its old name, RV(phase) is the vocabulary's (failure.py)."""
        phase = kind if kind in VOCABULARY else "nvml_unavailable"
        raise Failure(phase, msg, failure=kind, **extra)

    def run(self, argv, environ=None):
        """Run a command that changes the host and keep it in the returned ``steps`` (the operator sees what ran); what
        was read before it (DKMS's entries) is read again after it."""
        self._dkms = None
        rc, out, err = self.m.run_command(argv, environ_update=environ)
        self.log.append({"cmd": argv, "rc": rc})
        return rc, out, err

    def systemctl(self):
        return self.m.get_bin_path("systemctl", required=True)

    # --- observation -------------------------------------------------------------
    def kernel_release(self):
        rel = read_text(os.path.join(self.p["proc_root"], "sys/kernel/osrelease"))
        return rel.strip() if rel else os.uname()[2]

    def loaded(self):
        return read_proc_driver_version(self.p["proc_root"])

    def dkms_entries(self):
        """DKMS's nvidia entries, read once until a command changes the host (run()): the plan and the report of every
        kernel both ask, and ``dkms status`` is a shell script that walks /var/lib/dkms (a look read it twice)."""
        if self._dkms is None:
            dkms = self.m.get_bin_path("dkms")
            rc, out, _err = self.m.run_command([dkms, "status", "-m", "nvidia"]) if dkms else (1, "", "")
            self._dkms = ni.parse_dkms_status(out) if rc == 0 else []
        return self._dkms

    def nvml(self):
        # No nvidia-smi yet (no driver installed): only pynvml can answer, and will say why not.
        smi = self.m.get_bin_path("nvidia-smi")
        return gpu_facts(self.m.run_command if smi else None, smi_path=smi or "nvidia-smi", proc_root=self.p["proc_root"])

    # --- actions -----------------------------------------------------------------
    def ensure_headers(self, kernel):
        if os.path.exists("/lib/modules/%s/build" % kernel):
            return
        if not self.p["install_headers"]:
            self.fail("headers_unavailable", "Kernel headers for the running kernel %s are missing; install "
                      "proxmox-headers-%s or set install_headers." % (kernel, kernel))
        apt = self.m.get_bin_path("apt-get", required=True)
        errors = []
        for pkg in ni.headers_packages(kernel):
            rc, out, err = self.run([apt, "install", "-y", "--no-install-recommends", pkg],
                                    environ={"DEBIAN_FRONTEND": "noninteractive"})
            if rc == 0:
                self.changed = True
                return
            errors.append("%s: %s" % (pkg, (err or out).strip().splitlines()[-1:] or ""))
        self.fail("headers_unavailable", "Cannot install the headers for the running kernel %s (%s). Enable a "
                  "Proxmox repository that has them (pve-no-subscription) or boot a kernel whose headers are "
                  "available." % (kernel, "; ".join(errors)))

    def installer(self):
        """The verified installer's path: present (or downloaded) with the given sha256, of the requested version."""
        path = self.p["installer_path"] or os.path.join(self.p["download_dir"], ni.installer_filename(self.version))
        try:
            want = ni.parse_checksum(self.p["installer_checksum"])
        except ni.InstallerError as e:
            self.fail(e.kind, str(e))
        if os.path.exists(path):
            if want and self.sha256(path) != want:
                self.fail("checksum_mismatch", "%s has sha256 %s, expected %s." % (path, self.sha256(path), want))
            self.identify(path)
            return path
        if self.p["installer_path"] and not self.p["installer_url"]:
            self.fail("installer_missing", "installer_path %s does not exist on the host and no installer_url is given: "
                      "copy the installer there (gpu_host_driver_src) or give installer_url with installer_checksum." % path)
        if not want:
            self.fail("checksum_mismatch", "installer_checksum is required to download %s (no file at %s)." % (
                self.p["installer_url"] or ni.default_url(self.version), path))
        if self.m.check_mode:
            self.changed = True
            return path
        self.download(path, want)
        self.identify(path)
        return path

    def download(self, path, want):
        url = self.p["installer_url"] or ni.default_url(self.version)
        resp, info = fetch_url(self.m, url, timeout=self.p["timeout"])
        if info.get("status") != 200:
            self.fail("installer_failed", "Download of %s failed: HTTP %s %s" % (url, info.get("status"), info.get("msg")))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".download.")
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != want:
            os.unlink(tmp)
            self.fail("checksum_mismatch", "%s has sha256 %s, expected %s." % (url, digest.hexdigest(), want))
        os.rename(tmp, path)
        self.changed = True

    def identify(self, path):
        """The installer is the requested release: makeself's --info names it (changes nothing)."""
        rc, out, err = self.m.run_command(["sh", path, "--info"])
        try:
            ni.check_installer_version(self.version, out if rc == 0 else (err or out), path)
        except ni.InstallerError as e:
            self.fail(e.kind, str(e))

    @staticmethod
    def sha256(path):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()

    def run_installer(self, mode, kernel=None):
        path = self.installer()
        args = ni.installer_args(mode, self.p["kernel_module_type"], self.p["dkms"], kernel,
                                 self.p["module_signing_key"], self.p["module_signing_cert"])
        started = time.time()
        rc, out, err = self.run(["sh", path] + args)
        self.changed = True
        if rc != 0:
            self.installer_failed(rc, out, err, started)

    def dkms_failed(self, kernel, rc, out, err):
        """Fail with why DKMS could not build the module (the compiler's words in its make.log), else DKMS's words."""
        why = bk.failed_build(self.version, kernel, (err or out).strip(), dkms_tree=self.p["dkms_tree"])
        raise Failure("installer_failed", "dkms could not build nvidia %s for %s (rc=%d): %s" % (
            self.version, kernel, rc, why["summary"]), remedy=why["remedy"], evidence=why["evidence"],
            failure="installer_failed", make_log_tail=why["make_log_tail"])

    def installer_failed(self, rc, out, err, started=0):
        """Fail with why the installer failed (installer_log reads its output and the end of its log), else its words.
        The log is read only when this run wrote it: a wrapper that failed before nvidia-installer started (noexec or
        full /tmp) leaves an earlier run's log, whose cause is not this one's."""
        fresh = os.path.exists(INSTALLER_LOG) and os.stat(INSTALLER_LOG).st_mtime >= started - 1
        log = (read_text(INSTALLER_LOG) or "").strip().splitlines() if fresh else []
        why = installer_log.diagnose("\n".join([err or "", out or ""] + log[-400:]))
        said = "%s (%s)" % (why["summary"], why["cause"]) if why["cause"] else (err or out).strip()
        raise Failure("installer_failed", "The NVIDIA installer failed (rc=%d): %s" % (rc, said), remedy=why["remedy"],
                      evidence=why["evidence"], failure="installer_failed", installer_cause=why["cause"],
                      installer_log_tail=log[-15:])

    def modprobe(self):
        modprobe = self.m.get_bin_path("modprobe", required=True)
        for mod in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
            rc, out, err = self.run([modprobe, mod])
            if rc != 0:
                why = (err or out).strip()
                self.fail("driver_not_loaded", "modprobe %s failed: %s" % (mod, why), remedy=(
                    "Secure Boot refused the module's signature: give gpu_host_module_signing_key/_cert (a key enrolled as "
                    "MOK); the gpu_host stage points DKMS at it and builds the module again" if "Key was rejected" in why else ""))
        self.changed = True

    def ensure_unit(self, name, content):
        """Unit file written, enabled and active; the queries are read-only, so check mode is truthful."""
        path = os.path.join(self.p["systemd_dir"], name)
        old = read_text(path)
        write = old != content
        if write:
            self.diff.append({"before_header": path, "after_header": path, "before": old or "", "after": content})
        enabled = not write and self.m.run_command([self.systemctl(), "is-enabled", name])[1].strip() == "enabled"
        active = not write and self.m.run_command([self.systemctl(), "is-active", name])[1].strip() == "active"
        if write or not enabled or not active:
            self.changed = True
        if self.m.check_mode:
            return
        if write:
            atomic_write(path, content.encode("utf-8"), mode=MODE_DEFAULT, default_mode=0o644)
            self.run([self.systemctl(), "daemon-reload"])
        if not enabled:
            self.run([self.systemctl(), "enable", name])
        if not active:
            rc, out, err = self.run([self.systemctl(), "start", name])
            if rc != 0:
                self.fail("driver_not_loaded", "systemctl start %s failed: %s" % (name, (err or out).strip()))

    def verify(self, facts):
        if not facts.get("available"):
            self.fail(facts.get("reason") or "driver_not_loaded",
                      "NVML is not usable after the install: %s" % facts.get("msg", facts.get("reason")), nvml=facts)
        if facts.get("driver_version") != self.version:
            self.fail("version_mismatch", "NVML reports driver %s, expected %s." % (facts.get("driver_version"), self.version),
                      nvml=facts)
        gpus = facts.get("gpus", [])
        count, name = self.p["expected_gpu_count"], self.p["expected_gpu_name"]
        if count is not None and len(gpus) != count:
            self.fail("gpu_mismatch", "NVML sees %d GPU(s) (%s), expected %d." % (
                len(gpus), ", ".join(g.get("name", "?") for g in gpus), count), nvml=facts)
        if name and any(g.get("name") != name for g in gpus):
            self.fail("gpu_mismatch", "NVML GPU names %s, expected all %r." % ([g.get("name") for g in gpus], name), nvml=facts)

    # --- modes -------------------------------------------------------------------
    def checked_version(self):
        """The host-mode version, by format (it goes into a URL and a file name) before anything runs."""
        if not self.p["version"] or self.p["version"] == "auto":
            self.fail("bad_version", "version is required in host mode (for example 580.126.09).")
        try:
            return ni.check_version(self.p["version"])
        except ni.InstallerError as e:
            self.fail(e.kind, str(e))

    def fetched(self):
        """state=fetched: the installer is there (downloaded if need be), has its sha256 and is the requested release;
        nothing else on the host changes, so this runs before stage 1 touches the boot files."""
        self.version = self.checked_version()
        path = self.installer()
        return dict(changed=self.changed, action="fetched", reason="installer %s verified" % path, installer_path=path, steps=self.log)

    def host(self):
        self.version = self.checked_version()
        kernel = self.kernel_release()
        secure = bool(ni.secure_boot_enabled(self.p["efivars_dir"]))
        self.kernels = Kernels(self, self.version)
        # first: every DKMS build signs with framework.conf's key, and one made before it names the enrolled key is
        # signed with DKMS's own generated key, which the kernel refuses under Secure Boot
        dkms_key = self.kernels.configure_signing() if secure or self.p["module_signing_key"] else None
        action, reason = self.plan(kernel, secure)
        if action in BUILDS and secure and not self.p["module_signing_key"]:
            self.fail("secure_boot_unsigned_module", "Secure Boot is enabled: an unsigned NVIDIA module will not load. "
                      "Give module_signing_key/module_signing_cert (a key enrolled as MOK) or disable Secure Boot.")
        if not self.m.check_mode:
            self.act(action, kernel)
        elif action != "none":
            self.changed = True
        if self.p["device_nodes_unit"]:
            self.ensure_unit(ni.DEVICE_NODES_UNIT, ni.device_nodes_unit(self.p["expected_gpu_count"] or 1))
        if self.p["persistenced"]:
            self.ensure_unit(ni.PERSISTENCED_UNIT, ni.persistenced_unit())
        facts = self.nvml()
        if not (self.m.check_mode and action != "none"):
            self.verify(facts)
        kernels = self.every_kernel(secure, dkms_key)
        loaded = self.loaded()
        # would_change: check mode's changed, kept where a role's read-only probe reports changed=false (changed_when)
        return dict(changed=self.changed, would_change=bool(self.m.check_mode and self.changed), action=action, reason=reason,
                    kernel_release=kernel, host_version=loaded and loaded["version"], nvml=facts, steps=self.log, diff=self.diff,
                    kernels=kernels.report, next_boot_kernel=getattr(kernels, "next_boot", None), **self.extra)

    def plan(self, kernel, secure):
        """plan_host's inputs: what runs, what DKMS knows, the module the kernel would load and, under Secure Boot, whether
        the enrolled key signed it."""
        fields = modinfo(self.m, kernel)
        return ni.plan_host(self.version, self.loaded(), self.dkms_entries(), kernel,
                            os.path.exists("/lib/modules/%s/build" % kernel), on_disk=fields.get("version"),
                            sources=os.path.exists(os.path.join(ni.module_sources(self.version), "dkms.conf")),
                            dkms=self.p["dkms"], wrong_key=secure and self.kernels.wrong_key(kernel, fields))

    def act(self, action, kernel):
        """The planned action, then the modules loaded. register_dkms: dkms install --force, past check_version_sanity's
        refusal of the installer's own module of the same version; resign_module and register_dkms build anew (dkms
        remove first), signed with the key framework.conf names now."""
        if action == "none":
            return
        if action in BUILDS:
            self.ensure_headers(kernel)
        if action == "install":
            self.run_installer("host", kernel)
        elif action in BUILDS:
            dkms = self.m.get_bin_path("dkms") or "dkms"
            if action != "rebuild_module" and any(e["module"] == "nvidia" and e["version"] == self.version
                                                  and e["kernel"] == kernel for e in self.dkms_entries()):
                self.run([dkms, "remove", "-m", "nvidia", "-v", self.version, "-k", kernel])
            force = ["--force"] if action != "rebuild_module" else []
            rc, out, err = self.run([dkms, "install"] + force + ["-m", "nvidia", "-v", self.version, "-k", kernel])
            self.changed = True
            if rc != 0:
                self.dkms_failed(kernel, rc, out, err)
        self.modprobe()

    def every_kernel(self, secure, dkms_key):
        """The module built (and signed under Secure Boot) for every kernel that can boot, not only the running one."""
        if self.p["all_kernels"]:
            self.kernels.run(secure, dkms_key)
        return self.kernels

    def userspace(self):
        loaded = self.loaded()
        host_version = loaded and loaded["version"]
        self.version = self.p["version"] if self.p["version"] not in (None, "auto") else host_version
        if self.version:
            try:
                ni.check_version(self.version)
            except ni.InstallerError as e:
                self.fail(e.kind, str(e))
        if host_version and self.version != host_version:
            self.fail("version_mismatch", "Requested userspace %s but the host kernel module is %s: they must match "
                      "exactly (NVRM: API mismatch). Use version=auto or install %s on the host." % (
                          self.version, host_version, self.version), host_version=host_version)
        facts = self.nvml()
        try:
            action, reason = ni.plan_userspace(host_version, facts.get("driver_version"), facts.get("reason"))
        except ni.InstallerError as e:
            self.fail(e.kind, str(e))
        if action == "install":
            self.changed = True
            if not self.m.check_mode:
                self.run_installer("userspace")
                facts = self.nvml()
        if not (self.m.check_mode and action != "none"):
            if facts.get("reason") == "version_mismatch" or (
                    facts.get("available") and facts.get("driver_version") != host_version):
                self.fail("version_mismatch", "NVML in the container: %s; host kernel module: %s." % (
                    facts.get("msg") or facts.get("driver_version"), host_version), nvml=facts,
                    host_version=host_version)
            self.verify(facts)
        return dict(changed=self.changed, action=action, reason=reason, kernel_release=self.kernel_release(),
                    host_version=host_version, nvml=facts, steps=self.log)
