#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver
short_description: Install the NVIDIA driver from the official .run installer, on a Proxmox host or in a container
version_added: "0.1.0"
description:
  - In C(host) mode, installs the requested driver version with DKMS (headers for the running kernel first,
    nouveau disabled), loads it, installs and enables C(nvidia-persistenced) and a oneshot unit that creates
    C(/dev/nvidia*), C(/dev/nvidia-uvm*) at boot before C(pve-guests.service), and verifies through NVML that
    exactly the requested version runs on the expected GPUs.
  - After a kernel change (host rebuild or upgrade) with the driver still registered in DKMS, only the kernel
    module is rebuilt for the new kernel; the installer is not run again.
  - In C(userspace) mode (inside an LXC container), installs the same version's userspace only
    (C(--no-kernel-modules)); the version defaults to the host's, read from C(/proc/driver/nvidia/version).
    Done when NVML in the container reports the host's exact version.
  - Does nothing when the requested state is already there.
author:
  - kpro.gpu_serving developers (!UNKNOWN)
options:
  version:
    description:
      - "Driver version, for example C(580.126.09): C(<branch>.<minor>[.<patch>]), branch 3 digits, minor 2 or 3,
        patch 2 (NVIDIA's numbering, for example C(550.54.14), C(550.142)); anything else fails C(bad_version)."
      - In C(userspace) mode, C(auto) (the default there) takes the host kernel module's version.
    type: str
  state:
    description:
      - C(present) installs and verifies the driver. C(fetched) only makes sure the installer is on the target
        (downloaded into O(download_dir) if need be), has O(installer_checksum) and is the installer of O(version)
        (makeself C(--info)); nothing else changes. Run it before any host change (stage 1).
    type: str
    choices: [present, fetched]
    default: present
  mode:
    description: Where the module runs.
    type: str
    choices: [host, userspace]
    default: host
  installer_path:
    description:
      - Path of the C(.run) installer on the target. Used as is when it exists (air-gapped sites); otherwise
        it is where O(installer_url) is downloaded to. Given without O(installer_url), it must exist
        (C(installer_missing)).
      - Defaults to O(download_dir)/C(NVIDIA-Linux-x86_64-<version>.run).
    type: path
  installer_url:
    description: URL of the installer. Defaults to NVIDIA's download server for O(version).
    type: str
  installer_checksum:
    description:
      - Expected checksum of the installer, C(sha256:<hex>) or plain hex. Required when downloading.
    type: str
  download_dir:
    description: Where the installer is kept on the target.
    type: path
    default: /var/cache/kpro-gpu-serving
  kernel_module_type:
    description: Open or proprietary kernel modules (host mode).
    type: str
    choices: [open, proprietary]
    default: open
  dkms:
    description: Register the module with DKMS so that it can be rebuilt for new kernels (host mode).
    type: bool
    default: true
  install_headers:
    description: Install C(proxmox-headers-<running kernel>) with apt when the kernel's headers are missing.
    type: bool
    default: true
  persistenced:
    description: Install and enable C(nvidia-persistenced.service) (host mode).
    type: bool
    default: true
  device_nodes_unit:
    description: Install and enable C(nvidia-device-nodes.service), ordered before C(pve-guests.service) (host mode).
    type: bool
    default: true
  expected_gpu_count:
    description: Fail unless NVML reports this many GPUs.
    type: int
  expected_gpu_name:
    description: Fail unless every GPU NVML reports has this name, for example C(NVIDIA RTX A6000).
    type: str
  module_signing_key:
    description: Private key to sign the kernel module with when Secure Boot is on (path on the target).
    type: path
  module_signing_cert:
    description: Public certificate matching O(module_signing_key) (enrolled as a MOK).
    type: path
  proc_root:
    description: Root of procfs (tests).
    type: path
    default: /proc
  efivars_dir:
    description: EFI variables directory, read for the Secure Boot state.
    type: path
    default: /sys/firmware/efi/efivars
  systemd_dir:
    description: Where unit files are written.
    type: path
    default: /etc/systemd/system
  timeout:
    description: Seconds allowed for the download and for the installer to run.
    type: int
    default: 1800
attributes:
  check_mode:
    support: full
    description: Reports the action it would take (C(install), C(rebuild_module), C(load)) and changes nothing.
  diff_mode:
    support: none
    description: Unit files are replaced whole; no diff is returned.
notes:
  - Named failures (RV(failure)) are C(bad_version), C(bad_checksum), C(installer_missing), C(installer_version),
    C(secure_boot_unsigned_module), C(headers_unavailable), C(installer_failed), C(checksum_mismatch),
    C(driver_not_loaded), C(version_mismatch), C(gpu_mismatch).
"""

EXAMPLES = r"""
- name: Install driver 580.126.09 on the Proxmox host
  kpro.gpu_serving.nvidia_driver:
    version: 580.126.09
    installer_checksum: "sha256:0123..."
    expected_gpu_count: 2
    expected_gpu_name: NVIDIA RTX A6000

- name: Matching userspace inside container 129
  kpro.gpu_serving.nvidia_driver:
    mode: userspace
    installer_path: /root/NVIDIA-Linux-x86_64-580.126.09.run
    expected_gpu_count: 2
"""

RETURN = r"""
action:
  description: What was (or in check mode would be) done.
  returned: always
  type: str
  sample: rebuild_module
reason:
  description: Why that action.
  returned: always
  type: str
  sample: driver 580.126.09 is registered with DKMS but not built for kernel 6.8.12-10-pve
kernel_release:
  description: The running kernel.
  returned: always
  type: str
  sample: 6.8.12-9-pve
host_version:
  description: Version of the loaded kernel module (from /proc/driver/nvidia/version), after the run.
  returned: always
  type: str
  sample: 580.126.09
nvml:
  description: NVML facts after the run (see gpu_facts), or the reason NVML is unavailable.
  returned: always
  type: dict
failure:
  description: Name of the failure, when failed.
  returned: failure
  type: str
  sample: version_mismatch
"""

import hashlib
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url

from ansible_collections.kpro.gpu_serving.plugins.module_utils import nvidia_installer as ni
from ansible_collections.kpro.gpu_serving.plugins.module_utils.nvml import gpu_facts, read_proc_driver_version


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (IOError, OSError):
        return None


class Driver(object):
    def __init__(self, module):
        self.m = module
        self.p = module.params
        self.changed = False
        self.log = []

    def fail(self, kind, msg, **extra):
        self.m.fail_json(msg=msg, failure=kind, steps=self.log, **extra)

    def run(self, argv, environ=None):
        """Run a command and keep it in the returned ``steps`` (the operator sees what ran)."""
        rc, out, err = self.m.run_command(argv, environ_update=environ)
        self.log.append({"cmd": argv, "rc": rc})
        return rc, out, err

    def systemctl(self):
        return self.m.get_bin_path("systemctl", required=True)

    # --- observation -------------------------------------------------------------
    def kernel_release(self):
        rel = _read(os.path.join(self.p["proc_root"], "sys/kernel/osrelease"))
        return rel.strip() if rel else os.uname()[2]

    def loaded(self):
        return read_proc_driver_version(self.p["proc_root"])

    def dkms_entries(self):
        dkms = self.m.get_bin_path("dkms")
        if not dkms:
            return []
        rc, out, err = self.m.run_command([dkms, "status", "-m", "nvidia"])
        return ni.parse_dkms_status(out) if rc == 0 else []

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
        rc, out, err = self.run(["sh", path] + args)
        self.changed = True
        if rc != 0:
            tail = (_read("/var/log/nvidia-installer.log") or "").strip().splitlines()[-15:]
            self.fail("installer_failed", "The NVIDIA installer failed (rc=%d): %s" % (rc, (err or out).strip()),
                      installer_log_tail=tail)

    def modprobe(self):
        modprobe = self.m.get_bin_path("modprobe", required=True)
        for mod in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
            rc, out, err = self.run([modprobe, mod])
            if rc != 0:
                self.fail("driver_not_loaded", "modprobe %s failed: %s" % (mod, (err or out).strip()))
        self.changed = True

    def ensure_unit(self, name, content):
        """Unit file written, enabled and active; the queries are read-only, so check mode is truthful."""
        path = os.path.join(self.p["systemd_dir"], name)
        write = _read(path) != content
        enabled = not write and self.m.run_command([self.systemctl(), "is-enabled", name])[1].strip() == "enabled"
        active = not write and self.m.run_command([self.systemctl(), "is-active", name])[1].strip() == "active"
        if write or not enabled or not active:
            self.changed = True
        if self.m.check_mode:
            return
        if write:
            tmp = path + ".tmp.%d" % os.getpid()
            with open(tmp, "w") as f:
                f.write(content)
            os.rename(tmp, path)
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
        self.m.exit_json(changed=self.changed, action="fetched", reason="installer %s verified" % path,
                         installer_path=path, steps=self.log)

    def host(self):
        self.version = self.checked_version()
        kernel = self.kernel_release()
        headers = os.path.exists("/lib/modules/%s/build" % kernel)
        action, reason = ni.plan_host(self.version, self.loaded(), self.dkms_entries(), kernel, headers)
        if action in ("install", "rebuild_module") and ni.secure_boot_enabled(self.p["efivars_dir"]) \
                and not self.p["module_signing_key"]:
            self.fail("secure_boot_unsigned_module", "Secure Boot is enabled: an unsigned NVIDIA module will not load. "
                      "Give module_signing_key/module_signing_cert (a key enrolled as MOK) or disable Secure Boot.")
        if not self.m.check_mode:
            if action in ("install", "rebuild_module"):
                self.ensure_headers(kernel)
            if action == "install":
                self.run_installer("host", kernel)
                self.modprobe()
            elif action == "rebuild_module":
                rc, out, err = self.run(["dkms", "install", "-m", "nvidia", "-v", self.version, "-k", kernel])
                if rc != 0:
                    self.fail("installer_failed", "dkms could not build nvidia %s for %s: %s" % (
                        self.version, kernel, (err or out).strip()))
                self.modprobe()
            elif action == "load":
                self.modprobe()
        elif action != "none":
            self.changed = True
        if self.p["device_nodes_unit"]:
            self.ensure_unit(ni.DEVICE_NODES_UNIT, ni.device_nodes_unit(self.p["expected_gpu_count"] or 1))
        if self.p["persistenced"]:
            self.ensure_unit(ni.PERSISTENCED_UNIT, ni.persistenced_unit())
        facts = self.nvml()
        if not (self.m.check_mode and action != "none"):
            self.verify(facts)
        loaded = self.loaded()
        self.m.exit_json(changed=self.changed, action=action, reason=reason, kernel_release=kernel,
                         host_version=loaded and loaded["version"], nvml=facts, steps=self.log)

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
        self.m.exit_json(changed=self.changed, action=action, reason=reason, kernel_release=self.kernel_release(),
                         host_version=host_version, nvml=facts, steps=self.log)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str"),
            mode=dict(type="str", choices=["host", "userspace"], default="host"),
            state=dict(type="str", choices=["present", "fetched"], default="present"),
            installer_path=dict(type="path"),
            installer_url=dict(type="str"),
            installer_checksum=dict(type="str"),
            download_dir=dict(type="path", default="/var/cache/kpro-gpu-serving"),
            kernel_module_type=dict(type="str", choices=["open", "proprietary"], default="open"),
            dkms=dict(type="bool", default=True),
            install_headers=dict(type="bool", default=True),
            persistenced=dict(type="bool", default=True),
            device_nodes_unit=dict(type="bool", default=True),
            expected_gpu_count=dict(type="int"),
            expected_gpu_name=dict(type="str"),
            module_signing_key=dict(type="path", no_log=False),
            module_signing_cert=dict(type="path"),
            proc_root=dict(type="path", default="/proc"),
            efivars_dir=dict(type="path", default="/sys/firmware/efi/efivars"),
            systemd_dir=dict(type="path", default="/etc/systemd/system"),
            timeout=dict(type="int", default=1800),
        ),
        supports_check_mode=True,
    )
    driver = Driver(module)
    if module.params["state"] == "fetched":
        driver.fetched()
    elif module.params["mode"] == "host":
        driver.host()
    else:
        driver.userspace()


if __name__ == "__main__":
    main()
