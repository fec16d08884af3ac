# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import bootcfg

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "bootcfg")
A6000 = ["10de:2230", "10de:1aef"]


def fixture(name):
    with open(os.path.join(FIX, name), "rb") as f:
        return f.read().decode("utf-8")


def twice(fn, text, *args):
    once, changes = fn(text, *args)
    again, changes2 = fn(once, *args)
    assert again == once and changes2 == [], "not idempotent"
    return once, changes


# --------------------------------------------------------------------------- kernel command line


def test_kernel_cmdline_zfs_exact_bytes():
    out, changes = twice(bootcfg.edit_kernel_cmdline, fixture("kernel_cmdline.zfs"), A6000)
    assert out == fixture("kernel_cmdline.zfs.expected")
    assert len(changes) == 1 and changes[0]["line"] == 1
    assert "10de:2230,10de:1aef" in changes[0]["detail"] and "nvidia" in changes[0]["detail"]


def test_kernel_cmdline_framebuffer_tokens_only_when_asked():
    out, _c = twice(bootcfg.edit_kernel_cmdline, fixture("kernel_cmdline.zfs"), A6000, True)
    assert out == fixture("kernel_cmdline.zfs.expected_nofb")
    # intel_iommu=on iommu=pt stay in both cases
    assert "intel_iommu=on iommu=pt" in out


@pytest.mark.parametrize("text,expected", [
    ("vfio-pci.ids=10de:2230,10de:1aef quiet", "quiet"),
    ("quiet vfio_pci.ids=10de:2230", "quiet"),
    ("quiet vfio-pci.ids=10de:2230 iommu=pt", "quiet iommu=pt"),
    ("quiet vfio-pci.ids=1b21:1242,10DE:2230 iommu=pt", "quiet vfio-pci.ids=1b21:1242 iommu=pt"),
    ("quiet\tvfio-pci.ids=10de:2230\tiommu=pt", "quiet\tiommu=pt"),
    ("vfio-pci.ids=10de:2230", ""),
    ("quiet vfio-pci.ids=10de:2230,", "quiet"),
    ("quiet vfio-pci.ids=1b21:1242", "quiet vfio-pci.ids=1b21:1242"),
    ("nomodeset video=efifb:off", "nomodeset video=efifb:off"),
    ("modprobe.blacklist=nouveau,nvidia_drm", "modprobe.blacklist=nouveau"),
    ("modprobe.blacklist=nvidia", ""),
])
def test_kernel_cmdline_token_cases(text, expected):
    for eol in ("", "\n"):
        out, _c = twice(bootcfg.edit_kernel_cmdline, text + eol, A6000)
        assert out == expected + eol


def test_kernel_cmdline_unchanged_without_our_ids():
    text = "root=/dev/mapper/pve-root ro quiet vfio-pci.ids=1b21:1242\n"
    assert bootcfg.edit_kernel_cmdline(text, A6000) == (text, [])


def test_grub_default_exact_bytes_and_unrelated_lines_kept():
    src = fixture("grub.default")
    out, changes = twice(bootcfg.edit_grub_default, src, A6000)
    assert out == fixture("grub.default.expected")
    assert [c["line"] for c in changes] == [10, 28]
    # the commented-out assignment is not ours to touch
    assert '#GRUB_CMDLINE_LINUX_DEFAULT="quiet vfio-pci.ids=10de:2230"' in out
    assert "1b21:1242" in out and "video=efifb:off" in out and "GRUB_DISTRIBUTOR=`( . /etc/os-release" in out


@pytest.mark.parametrize("line,expected", [
    ("GRUB_CMDLINE_LINUX_DEFAULT='quiet vfio-pci.ids=10de:2230'", "GRUB_CMDLINE_LINUX_DEFAULT='quiet'"),
    ("GRUB_CMDLINE_LINUX_DEFAULT=vfio-pci.ids=10de:2230", "GRUB_CMDLINE_LINUX_DEFAULT="),
    ('  export GRUB_CMDLINE_LINUX="iommu=pt vfio-pci.ids=10de:2230" # passthrough',
     '  export GRUB_CMDLINE_LINUX="iommu=pt" # passthrough'),
    ('GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} vfio-pci.ids=10de:2230,10de:1aef"',
     'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT}"'),
    ('GRUB_CMDLINE_LINUX_DEFAULT="quiet"', 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"'),
])
def test_grub_default_line_cases(line, expected):
    for sep, eol in (("\n", "\n"), ("\r\n", "\r\n"), ("\n", "")):
        out, _c = twice(bootcfg.edit_grub_default, "GRUB_TIMEOUT=5" + sep + line + eol, A6000)
        assert out == "GRUB_TIMEOUT=5" + sep + expected + eol


def test_grub_default_unclosed_quote_is_a_warning_not_an_edit():
    text = 'GRUB_CMDLINE_LINUX_DEFAULT="quiet vfio-pci.ids=10de:2230\n  iommu=pt"\n'
    out, changes = bootcfg.edit_grub_default(text, A6000)
    assert out == text
    assert changes[0]["action"] == "warning"


# --------------------------------------------------------------------------- modprobe.d


def test_modprobe_lae_style_keeps_other_device_and_options():
    out, changes = twice(bootcfg.edit_modprobe_conf, fixture("modprobe_vfio.conf"), A6000, True)
    assert out == fixture("modprobe_vfio.conf.expected")
    assert {c["action"] for c in changes} == {"removed", "modified"}


def test_modprobe_snd_hda_softdep_goes_only_without_other_vfio_devices():
    out, _c = twice(bootcfg.edit_modprobe_conf, fixture("modprobe_vfio.conf"), A6000, False)
    assert "softdep snd_hda_intel" not in out
    assert "softdep xhci_hcd pre: vfio-pci" in out  # not a GPU driver, not ours


def test_modprobe_crlf_no_trailing_newline_uppercase_ids():
    out, changes = twice(bootcfg.edit_modprobe_conf, fixture("modprobe_guide_crlf.conf"), A6000, True)
    assert out.encode() == fixture("modprobe_guide_crlf.conf.expected").encode()
    assert "options kvm ignore_msrs=1 report_ignored_msrs=0\r\n" in out


def test_modprobe_blacklists_nvidia_only_nouveau_stays():
    out, changes = twice(bootcfg.edit_modprobe_conf, fixture("modprobe_blacklist.conf"), A6000, True)
    assert out == fixture("modprobe_blacklist.conf.expected")
    assert "blacklist nouveau\n" in out and "options nouveau modeset=0" in out
    text = fixture("nvidia-installer-disable-nouveau.conf")
    assert bootcfg.edit_modprobe_conf(text, A6000) == (text, [])


def test_modprobe_blacklist_removal_can_be_turned_off():
    text = fixture("modprobe_blacklist.conf")
    assert bootcfg.edit_modprobe_conf(text, A6000, True, False) == (text, [])


@pytest.mark.parametrize("line,expected", [
    ("options vfio_pci ids=10de:2230", None),
    ("options vfio-pci ids=10de:2230:ffffffff:ffffffff disable_idle_d3=1", "options vfio-pci disable_idle_d3=1"),
    ('options vfio-pci ids="10de:2230,1b21:1242"', 'options vfio-pci ids="1b21:1242"'),
    ("options vfio-pci disable_vga=1 ids=10de:2230", "options vfio-pci disable_vga=1"),
    ("softdep nvidia pre: vfio-pci vfio post: nvidia_uvm", "softdep nvidia pre: vfio post: nvidia_uvm"),
    ("softdep nvidia_drm pre: vfio_pci", None),
    ("softdep drm pre: vfio-pci", "softdep drm pre: vfio-pci"),
    ("install nvidia /bin/true", None),
    ("install nvidia /sbin/modprobe --ignore-install nvidia", "install nvidia /sbin/modprobe --ignore-install nvidia"),
    ("alias nvidia off", None),
    ("#blacklist nvidia", "#blacklist nvidia"),
    ("blacklist rivafb", "blacklist rivafb"),
])
def test_modprobe_line_cases(line, expected):
    text = "# head\n" + line + "\n"
    out, _c = twice(bootcfg.edit_modprobe_conf, text, A6000, True)
    assert out == "# head\n" + ("" if expected is None else expected + "\n")


def test_modprobe_vfio_ids_found():
    assert bootcfg.modprobe_vfio_ids(fixture("modprobe_vfio.conf")) == {"10de:2230", "10de:1aef", "1b21:1242"}
    assert bootcfg.modprobe_vfio_ids(fixture("modprobe_vfio.conf.expected")) == {"1b21:1242"}


# --------------------------------------------------------------------------- /etc/modules


def test_modules_kept_while_vfio_is_needed():
    text = fixture("modules")
    assert bootcfg.edit_modules_list(text, A6000, True) == (text, [])


def test_modules_removed_when_no_device_needs_vfio():
    out, changes = twice(bootcfg.edit_modules_list, fixture("modules"), A6000, False)
    assert out == fixture("modules.expected_removed")
    assert len(changes) == 4


def test_modules_vfio_pci_with_ids_param():
    text = "vfio\nvfio-pci ids=10de:2230,1b21:1242\n; comment\n"
    out, _c = twice(bootcfg.edit_modules_list, text, A6000, True)
    assert out == "vfio\nvfio-pci ids=1b21:1242\n; comment\n"
    out, _c = twice(bootcfg.edit_modules_list, "vfio-pci ids=10de:2230\nvfio\n", A6000, False)
    assert out == ""


# --------------------------------------------------------------------------- whole host


def _etc(tmp_path, files):
    for rel, name in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(fixture(name).encode())
    return str(tmp_path)


def test_plan_keeps_vfio_modules_while_another_id_remains(tmp_path):
    etc = _etc(tmp_path, {"default/grub": "grub.default", "modprobe.d/vfio.conf": "modprobe_vfio.conf",
                          "modprobe.d/blacklist.conf": "modprobe_blacklist.conf", "modules": "modules",
                          "modprobe.d/README": "modules"})
    plan = bootcfg.plan(A6000, etc)
    assert plan["remaining_vfio_ids"] == ["1b21:1242"]
    assert plan["keep_vfio_modules"] is True
    by = dict((os.path.relpath(f["path"], etc), f) for f in plan["files"])
    assert "modprobe.d/README" not in by  # only *.conf is read by modprobe
    assert by["modules"]["changed"] is False
    assert by["default/grub"]["changed"] and by["modprobe.d/vfio.conf"]["changed"]
    assert plan["boot_cmdline_changed"] and plan["initramfs_changed"]


def test_plan_removes_vfio_modules_when_nothing_else_uses_vfio(tmp_path):
    etc = _etc(tmp_path, {"kernel/cmdline": "kernel_cmdline.zfs", "modprobe.d/vfio.conf": "modprobe_guide_crlf.conf",
                          "modules": "modules"})
    plan = bootcfg.plan(A6000, etc)
    assert plan["remaining_vfio_ids"] == [] and plan["keep_vfio_modules"] is False
    by = dict((os.path.relpath(f["path"], etc), f) for f in plan["files"])
    assert by["modules"]["after"] == fixture("modules.expected_removed")
    assert bootcfg.plan(A6000, etc, extra_vfio_users=True)["keep_vfio_modules"] is True
    assert bootcfg.plan(A6000, etc, vfio_modules="keep")["keep_vfio_modules"] is True


def test_plan_nothing_to_do(tmp_path):
    etc = _etc(tmp_path, {"default/grub": "grub.default.expected", "modprobe.d/x.conf": "nvidia-installer-disable-nouveau.conf"})
    plan = bootcfg.plan(A6000, etc)
    assert not any(f["changed"] for f in plan["files"])
    assert not plan["boot_cmdline_changed"] and not plan["initramfs_changed"]


def test_norm_ids_rejects_garbage():
    with pytest.raises(ValueError):
        bootcfg.norm_ids(["nvidia"])
    assert bootcfg.norm_ids(["0x10DE:0x2230"]) == {"10de:2230"}


def _root(tmp_path, files):
    """A host root under tmp_path: {"etc/...": text, "lib/modprobe.d/...": text}; returns its etc."""
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path / "etc")


def test_plan_blacklists_nouveau_when_no_modprobe_file_does(tmp_path):
    etc = _root(tmp_path, {"etc/modprobe.d/vfio.conf": fixture("modprobe_vfio.conf"),
                           "etc/modprobe.d/gpu.conf": "blacklist nvidia\nblacklist nvidiafb\n"})
    plan = bootcfg.plan(A6000, etc, blacklist_nouveau=True)
    path = os.path.join(etc, "modprobe.d", bootcfg.NOUVEAU_CONF_NAME)
    assert plan["nouveau_blacklist"] == path and plan["initramfs_changed"]
    f = [f for f in plan["files"] if f["path"] == path][0]
    assert f["before"] == "" and f["after"] == bootcfg.NOUVEAU_CONF and f["changed"] and f["kind"] == bootcfg.KIND_MODPROBE
    assert [c["after"] for c in f["changes"]] == ["blacklist nouveau", "options nouveau modeset=0"]
    assert bootcfg.plan(A6000, etc)["nouveau_blacklist"] is None  # only when asked


@pytest.mark.parametrize("files", [
    {"etc/modprobe.d/blacklist-gpu.conf": "blacklist nouveau\nblacklist nvidia\n"},  # kept while nvidia's goes
    {"etc/modprobe.d/x.conf": "install nouveau /bin/false\n"},
    {"lib/modprobe.d/nvidia-installer-disable-nouveau.conf": "blacklist nouveau\noptions nouveau modeset=0\n"},
    {"usr/lib/modprobe.d/blacklist-nouveau.conf": "blacklist nouveau\n"},
    {"etc/modprobe.d/%s" % bootcfg.NOUVEAU_CONF_NAME: bootcfg.NOUVEAU_CONF},
])
def test_plan_leaves_nouveau_alone_when_a_modprobe_file_blacklists_it(tmp_path, files):
    etc = _root(tmp_path, dict(files, **{"etc/modprobe.d/vfio.conf": fixture("modprobe_vfio.conf")}))
    plan = bootcfg.plan(A6000, etc, blacklist_nouveau=True)
    assert plan["nouveau_blacklist"] is None
    assert not [f for f in plan["files"] if f["path"].endswith(bootcfg.NOUVEAU_CONF_NAME) and f["changed"]]


def test_plan_nouveau_blacklist_masked_in_etc_does_not_count(tmp_path):
    # a file in /etc/modprobe.d replaces the /lib one of the same name (modprobe.d(5))
    etc = _root(tmp_path, {"lib/modprobe.d/blacklist-nouveau.conf": "blacklist nouveau\n",
                           "etc/modprobe.d/blacklist-nouveau.conf": "# masked\n"})
    assert bootcfg.plan(A6000, etc, blacklist_nouveau=True)["nouveau_blacklist"] is not None
