# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_host.Driver's named failures, each raised as a Failure with its phase (failure.py)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_host as nh
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

PARAMS = dict(version="580.126.09", mode="host", state="present", installer_path=None, installer_url=None,
              installer_checksum=None, download_dir="/nonexistent", kernel_module_type="open", dkms=True,
              install_headers=False, persistenced=True, device_nodes_unit=True, expected_gpu_count=None,
              expected_gpu_name=None, module_signing_key=None, module_signing_cert=None, proc_root="/nonexistent/proc",
              efivars_dir="/nonexistent/efivars", systemd_dir="/nonexistent/systemd", timeout=10,
              dkms_framework_conf="/nonexistent/dkms/framework.conf")


class FakeModule(object):
    check_mode = False

    def __init__(self, rc=0, **params):
        self.params = dict(PARAMS, **params)
        self.rc = rc
        self.ran = []

    def run_command(self, argv, environ_update=None):
        self.ran.append(argv)
        return self.rc, "", "boom"

    def get_bin_path(self, name, required=False):
        return None


def raised(fn, *args):
    with pytest.raises(Failure) as e:
        fn(*args)
    return e.value


GPU = {"name": "NVIDIA RTX A6000"}


@pytest.mark.parametrize("facts,phase,failure", [
    ({"available": False, "reason": "driver_not_loaded", "msg": "not loaded"}, "driver_not_loaded", "driver_not_loaded"),
    ({"available": False, "reason": "no_permission", "msg": "EPERM"}, "nvml_unavailable", "no_permission"),
    ({"available": True, "driver_version": "575.57.08", "gpus": [GPU]}, "version_mismatch", "version_mismatch"),
])
def test_verify_names_why_nvml_is_not_right(facts, phase, failure):
    d = nh.Driver(FakeModule())
    d.version = "580.126.09"
    e = raised(d.verify, facts)
    assert e.phase == phase and e.details["failure"] == failure and e.details["nvml"] == facts


def test_phase_gpu_mismatch():
    d = nh.Driver(FakeModule(expected_gpu_count=2))
    d.version = "580.126.09"
    e = raised(d.verify, {"available": True, "driver_version": "580.126.09", "gpus": [GPU]})
    assert e.phase == "gpu_mismatch" and "expected 2" in e.msg


def test_phase_headers_unavailable_without_install_headers():
    e = raised(nh.Driver(FakeModule()).ensure_headers, "0.0.0-no-such-kernel")
    assert e.phase == "headers_unavailable" and "proxmox-headers-0.0.0-no-such-kernel" in e.msg


def test_phase_installer_failed(monkeypatch):
    monkeypatch.setattr(nh.Driver, "installer", lambda self: "/nonexistent/NVIDIA.run")
    d = nh.Driver(FakeModule(rc=1))
    e = raised(d.run_installer, "host")
    assert e.phase == "installer_failed" and "rc=1" in e.msg and d.log[-1]["rc"] == 1


def test_installer_failure_says_why_from_its_output_and_its_log(monkeypatch, tmp_path):
    log = tmp_path / "nvidia-installer.log"
    log.write_text("-> Kernel module load error: No such device\n-> Kernel messages:\n"
                   "[ 12.3] NVRM: GPU 0000:41:00.0 is already bound to vfio-pci.\nERROR: Installation has failed.\n")
    monkeypatch.setattr(nh, "INSTALLER_LOG", str(log))
    d = nh.Driver(FakeModule())
    e = raised(d.installer_failed, 1, "", "\nERROR: Unable to load the kernel module 'nvidia.ko'.  This happens most\n")
    assert e.phase == "installer_failed" and e.details["installer_cause"] == "gpu_bound_to_vfio"
    assert "GPU 0000:41:00.0 is bound to vfio-pci" in e.msg and "release the GPUs from vfio-pci" in e.remedy
    assert e.evidence == ["NVRM: GPU 0000:41:00.0 is already bound to vfio-pci."]
    assert e.details["installer_log_tail"][-1] == "ERROR: Installation has failed."
    # an earlier run's log (older than this run's start) is not read: the wrapper's own words
    os.utime(str(log), (1000, 1000))
    e = raised(d.installer_failed, 126, "", "sh: ./NVIDIA.run: Permission denied", 2000)
    assert e.details["installer_cause"] is None and e.msg.endswith("(rc=126): sh: ./NVIDIA.run: Permission denied")
    assert e.details["installer_log_tail"] == []
    # nothing known: the installer's own words, as before
    log.write_text("")
    e = raised(d.installer_failed, 2, "", "ERROR: something new\n")
    assert e.details["installer_cause"] is None and e.msg.endswith("(rc=2): ERROR: something new") and e.remedy == ""


def test_phase_secure_boot_unsigned_module(monkeypatch):
    monkeypatch.setattr(nh.ni, "plan_host", lambda *a, **kw: ("install", "no driver"))
    monkeypatch.setattr(nh.ni, "secure_boot_enabled", lambda efivars: True)
    e = raised(nh.Driver(FakeModule()).host)
    assert e.phase == "secure_boot_unsigned_module" and "Secure Boot" in e.msg


def test_units_written_are_returned_as_a_diff_in_check_mode_too(tmp_path):
    m = FakeModule(systemd_dir=str(tmp_path))
    m.check_mode = True
    d = nh.Driver(m)
    d.systemctl = lambda: "/bin/systemctl"
    d.ensure_unit("nvidia-device-nodes.service", "[Unit]\nDescription=new\n")
    assert d.changed and d.diff == [{"before_header": str(tmp_path / "nvidia-device-nodes.service"),
                                     "after_header": str(tmp_path / "nvidia-device-nodes.service"),
                                     "before": "", "after": "[Unit]\nDescription=new\n"}]
    assert not (tmp_path / "nvidia-device-nodes.service").exists()  # check mode writes nothing
    (tmp_path / "nvidia-device-nodes.service").write_text("[Unit]\nDescription=new\n")
    again = nh.Driver(m)
    again.systemctl = lambda: "/bin/systemctl"
    again.ensure_unit("nvidia-device-nodes.service", "[Unit]\nDescription=new\n")
    assert again.diff == []


@pytest.mark.parametrize("check_mode,unit_changes,would_change", [
    (True, True, True),     # check mode: would_change is changed (the role's probe reads it: its own changed is false)
    (True, False, False),   # converged: nothing to do, the role skips the install
    (False, True, False),   # after a real run there is nothing left to change
])
def test_host_returns_would_change(monkeypatch, check_mode, unit_changes, would_change):
    m = FakeModule()
    m.check_mode = check_mode
    d = nh.Driver(m)
    monkeypatch.setattr(nh.ni, "plan_host", lambda *a, **kw: ("none", "installed"))
    monkeypatch.setattr(nh.ni, "secure_boot_enabled", lambda efivars: False)
    kernels = type("K", (), {"report": [], "next_boot": None})()
    for name, fn in dict(checked_version=lambda: "580.126.09", kernel_release=lambda: "6.8.12-9-pve",
                         loaded=lambda: {"version": "580.126.09"}, dkms_entries=lambda: [], nvml=lambda: {},
                         verify=lambda facts: None,
                         every_kernel=lambda secure, key: kernels).items():
        monkeypatch.setattr(d, name, fn)

    def ensure_unit(name, content):
        d.changed = d.changed or unit_changes
    monkeypatch.setattr(d, "ensure_unit", ensure_unit)
    out = d.host()   # the result, for the module's main to end with
    assert out["would_change"] is would_change and out["changed"] is unit_changes and out["action"] == "none"


def test_dkms_rebuild_failure_says_why_from_make_log(tmp_path):
    build = tmp_path / "nvidia" / "580.126.09" / "build"
    build.mkdir(parents=True)
    (build / "make.log").write_text("  CC [M]  nvidia/nv.o\nnvidia/nv-caps.c:598:5: error: implicit declaration of function "
                                    "'sys_close' [-Werror=implicit-function-declaration]\nmake[2]: *** Error 1\n")
    d = nh.Driver(FakeModule(dkms_tree=str(tmp_path)))
    d.version = "580.126.09"
    e = raised(d.dkms_failed, "6.8.12-10-pve", 10, "", "Error! Bad return status for module build on kernel: 6.8.12-10-pve")
    assert e.phase == "installer_failed" and "for 6.8.12-10-pve (rc=10): the driver's source does not build" in e.msg
    assert "sys_close" in e.msg and "newer gpu_host_driver_version" in e.remedy and e.details["make_log_tail"][-1] == "make[2]: *** Error 1"
    # no make.log: DKMS's own words
    d = nh.Driver(FakeModule(dkms_tree=str(tmp_path / "none")))
    d.version = "580.126.09"
    e = raised(d.dkms_failed, "6.8.12-10-pve", 10, "", "Error! Bad return status")
    assert e.msg.endswith("(rc=10): Error! Bad return status") and e.remedy == ""


def test_dkms_status_is_read_once_until_a_command_changes_the_host():
    class Dkms(FakeModule):
        def get_bin_path(self, name, required=False):
            return "/usr/sbin/dkms" if name == "dkms" else None

        def run_command(self, argv, environ_update=None):
            self.ran.append(argv)
            return 0, "nvidia/580.126.09, 6.8.12-9-pve, x86_64: installed\n", ""
    m = Dkms()
    d = nh.Driver(m)
    first, second = d.dkms_entries(), d.dkms_entries()
    assert first == second and first and m.ran == [["/usr/sbin/dkms", "status", "-m", "nvidia"]]
    d.run(["dkms", "install", "-m", "nvidia", "-v", "580.126.09", "-k", "6.8.12-10-pve"])
    d.dkms_entries()
    assert [a[:2] for a in m.ran].count(["/usr/sbin/dkms", "status"]) == 2     # read again after the change


class Host(FakeModule):
    """modinfo shows ``signer`` (None: unsigned), dkms status ``dkms``; framework.conf as each dkms install found it."""

    def __init__(self, tmp, signer=None, dkms="", **params):
        super(Host, self).__init__(dkms_framework_conf=str(tmp / "framework.conf"), all_kernels=False, persistenced=False,
                                   device_nodes_unit=False, **params)
        self.signer, self.dkms, self.conf_at_install, self.out = signer, dkms, [], {}

    def get_bin_path(self, name, required=False):
        return "/usr/sbin/" + name

    def run_command(self, argv, environ_update=None):
        self.ran.append(argv)
        tool = os.path.basename(argv[0])
        if tool == "modinfo":
            sig = "signer: %s\nsig_key: %s\n" % self.signer if self.signer else ""
            return 0, "filename: /lib/modules/%s/updates/dkms/nvidia.ko\nversion: 580.126.09\n%s" % (argv[2], sig), ""
        if tool == "dkms" and argv[1] == "status":
            return 0, self.dkms, ""
        if tool == "dkms" and argv[1] == "install":
            self.conf_at_install.append(open(self.params["dkms_framework_conf"]).read())
        return 0, "", ""


def run_host(monkeypatch, m, loaded, secure=True):
    d = nh.Driver(m)
    monkeypatch.setattr(nh.ni, "secure_boot_enabled", lambda efivars: secure)
    for name, fn in dict(kernel_release=lambda: "6.8.12-11-pve", loaded=lambda: loaded, nvml=lambda: {},
                         verify=lambda facts: None, ensure_headers=lambda kernel: None).items():
        monkeypatch.setattr(d, name, fn)
    m.out.update(d.host())   # host() returns the result; the module's main ends the module with it
    return [a[1:] for a in m.ran if os.path.basename(a[0]) in ("dkms", "modprobe") and a[1] != "status"]


def test_secure_boot_dkms_names_the_enrolled_key_before_the_refused_module_is_built_again(monkeypatch, tmp_path):
    """Secure Boot came after the driver: DKMS's hook built the new kernel's module with its own key, the kernel refused
    it at boot. framework.conf names the enrolled key before anything is built, and the module is built again (remove,
    then install) rather than only loaded (modprobe: Key was rejected by service)."""
    from test_module_signing import SERIAL, make_cert
    (tmp_path / "MOK.der").write_bytes(make_cert("kpro MOK", SERIAL)[0])
    m = Host(tmp_path, signer=("DKMS module signing key", "3F:01"), dkms="nvidia/580.126.09, 6.8.12-11-pve, x86_64: installed\n",
             module_signing_key="/root/MOK.priv", module_signing_cert=str(tmp_path / "MOK.der"))
    ran = run_host(monkeypatch, m, None)
    assert m.out["action"] == "resign_module" and m.out["changed"]
    assert ran[:2] == [["remove", "-m", "nvidia", "-v", "580.126.09", "-k", "6.8.12-11-pve"],
                       ["install", "--force", "-m", "nvidia", "-v", "580.126.09", "-k", "6.8.12-11-pve"]]
    assert ["nvidia"] in ran
    assert "mok_signing_key=/root/MOK.priv\nmok_certificate=%s" % (tmp_path / "MOK.der") in m.conf_at_install[0]


def test_driver_loaded_but_unknown_to_dkms_is_registered_from_its_sources(monkeypatch, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "dkms.conf").write_text('PACKAGE_NAME="nvidia"\n')
    monkeypatch.setattr(nh.ni, "module_sources", lambda version: str(tmp_path / "src"))
    (tmp_path / "framework.conf").write_text("")
    m = Host(tmp_path)
    ran = run_host(monkeypatch, m, {"version": "580.126.09"}, secure=False)
    assert m.out["action"] == "register_dkms" and m.out["changed"]
    # no DKMS entry for the kernel: nothing to remove; --force past check_version_sanity's refusal of the same version
    assert ran[0] == ["install", "--force", "-m", "nvidia", "-v", "580.126.09", "-k", "6.8.12-11-pve"]
    m = Host(tmp_path, dkms="nvidia/580.126.09, 6.8.12-11-pve, x86_64: installed\n")
    assert run_host(monkeypatch, m, {"version": "580.126.09"}, secure=False) == [] and m.out["action"] == "none"
