from __future__ import annotations

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_installer as ni


def test_parse_dkms_status_new_and_old_format():
    text = ("nvidia/580.126.09, 6.8.12-9-pve, x86_64: installed\n"
            "nvidia/580.126.09: added\n"
            "zfs, 2.2.6, 6.8.12-9-pve, x86_64: installed (original_module exists)\n")
    entries = ni.parse_dkms_status(text)
    assert entries[0] == {"module": "nvidia", "version": "580.126.09", "kernel": "6.8.12-9-pve", "arch": "x86_64",
                          "state": "installed"}
    assert entries[1]["kernel"] is None and entries[1]["state"] == "added"
    assert entries[2]["module"] == "zfs" and entries[2]["version"] == "2.2.6" and entries[2]["state"] == "installed"


@pytest.mark.parametrize("loaded,dkms,expected", [
    ({"version": "580.126.09", "type": "open"}, [], "none"),
    ({"version": "570.148.08", "type": "open"}, [], "install"),
    (None, [], "install"),
    (None, [{"module": "nvidia", "version": "580.126.09", "kernel": "6.8.12-9-pve", "state": "installed"}], "load"),
    # host rebuilt onto a new kernel: the source is registered, the module is built for the old kernel only
    (None, [{"module": "nvidia", "version": "580.126.09", "kernel": "6.8.12-8-pve", "state": "installed"}],
     "rebuild_module"),
    (None, [{"module": "nvidia", "version": "575.1.1", "kernel": "6.8.12-9-pve", "state": "installed"}], "install"),
])
def test_plan_host(loaded, dkms, expected):
    action, reason = ni.plan_host("580.126.09", loaded, dkms, "6.8.12-9-pve", True)
    assert action == expected
    assert reason


V, K = "580.126.09", "6.8.12-9-pve"
LOADED = {"version": V, "type": "open"}


def entry(state, kernel=K):
    return {"module": "nvidia", "version": V, "kernel": kernel, "state": state}


@pytest.mark.parametrize("loaded,dkms,inputs,expected", [
    # installed by hand without --dkms: loaded (or, after a reboot, on disk), DKMS knows nothing
    (LOADED, [], dict(on_disk=V), "register_dkms"),
    (None, [], dict(on_disk=V), "register_dkms"),
    # DKMS added and built it, then refused to install it over the installer's copy (check_version_sanity)
    (LOADED, [entry("built")], dict(on_disk=V), "register_dkms"),
    (LOADED, [entry("installed")], dict(on_disk=V), "none"),
    # the installer's sources are gone (--no-kernel-module-source): the installer again, with --dkms
    (LOADED, [], dict(on_disk=V, sources=False), "install"),
    (LOADED, [], dict(on_disk=V, dkms=False), "none"),                 # DKMS not wanted
    ({"version": "570.148.08"}, [], dict(on_disk="570.148.08"), "install"),
    # Secure Boot: the module is there for the kernel, signed by a key the kernel refuses
    (None, [entry("installed")], dict(on_disk=V, wrong_key=True), "resign_module"),
    (LOADED, [entry("installed")], dict(on_disk=V, wrong_key=True), "none"),   # loaded: every_kernel re-signs on disk
    (None, [entry("built")], dict(), "rebuild_module"),   # built, not installed: modprobe would not find it
])
def test_plan_host_states(loaded, dkms, inputs, expected):
    action, reason = ni.plan_host(V, loaded, dkms, K, True, **inputs)
    assert action == expected, reason
    if action == "register_dkms":
        assert "/usr/src/nvidia-%s" % V in reason and K in reason


def test_plan_userspace():
    assert ni.plan_userspace("580.126.09", "580.126.09", None)[0] == "none"
    assert ni.plan_userspace("580.126.09", None, "library_not_found")[0] == "install"
    action, reason = ni.plan_userspace("580.126.09", None, "version_mismatch")
    assert action == "install" and "580.126.09" in reason
    with pytest.raises(ni.InstallerError) as e:
        ni.plan_userspace(None, None, "library_not_found")
    assert e.value.kind == "driver_not_loaded"


def test_installer_args():
    host = ni.installer_args("host", "open", True, "6.8.12-9-pve")
    assert "--dkms" in host and "--kernel-module-type=open" in host and "--kernel-name=6.8.12-9-pve" in host
    assert "--no-kernel-modules" not in host and "--silent" in host
    user = ni.installer_args("userspace")
    assert "--no-kernel-modules" in user and "--no-dkms" in user and not any(a.startswith("--kernel-module-type") for a in user)
    signed = ni.installer_args("host", signing_key="/k.key", signing_cert="/k.der")
    assert "--module-signing-secret-key=/k.key" in signed and "--module-signing-public-key=/k.der" in signed


def test_secure_boot(tmp_path):
    assert ni.secure_boot_enabled(str(tmp_path)) is None
    (tmp_path / ni.SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00\x01")
    assert ni.secure_boot_enabled(str(tmp_path)) is True
    (tmp_path / ni.SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00\x00")
    assert ni.secure_boot_enabled(str(tmp_path)) is False


def test_device_nodes_unit_is_ordered_before_guests():
    unit = ni.device_nodes_unit(2)
    assert "Before=pve-guests.service" in unit
    assert "ExecStart=/usr/bin/nvidia-modprobe -c 0 -c 1 -c 255" in unit
    assert "ExecStart=/usr/bin/nvidia-modprobe -u -c 0" in unit


@pytest.mark.parametrize("version", ["580.126.09", "550.54.14", "535.104.05", "470.256.02", "550.142", "390.157",
                                     "535.98", "580.126"])
def test_check_version_accepts_nvidia_numbering(version):
    assert ni.check_version(version) == version


@pytest.mark.parametrize("version", ["../x", "580", "580.126.9", "580.1.01", "v580.126.09", "580.126.09.1", "",
                                     None, "580.126.09/../../x", "0580.12.01"])
def test_check_version_refuses(version):
    with pytest.raises(ni.InstallerError) as e:
        ni.check_version(version)
    assert e.value.kind == "bad_version"


def test_default_url_refuses_a_path():
    with pytest.raises(ni.InstallerError):
        ni.default_url("../x")


def test_makeself_version_and_mismatch():
    info = ("Identification: NVIDIA Accelerated Graphics Driver for Linux-x86_64 580.126.09\n"
            "Target directory: NVIDIA-Linux-x86_64-580.126.09\n")
    assert ni.makeself_version(info) == "580.126.09"
    assert ni.check_installer_version("580.126.09", info, "/x.run") == "580.126.09"
    with pytest.raises(ni.InstallerError) as e:
        ni.check_installer_version("580.126", info, "/x.run")
    assert e.value.kind == "installer_version"
    with pytest.raises(ni.InstallerError):
        ni.check_installer_version("580.126.09", "not a makeself file", "/x.run")


def test_parse_checksum():
    h = "ab" * 32
    assert ni.parse_checksum("sha256:" + h.upper()) == h and ni.parse_checksum(h) == h and ni.parse_checksum("") is None
    for bad in ("md5:" + h, "sha256:" + h[:-1], "sha256:zz"):
        with pytest.raises(ni.InstallerError):
            ni.parse_checksum(bad)
