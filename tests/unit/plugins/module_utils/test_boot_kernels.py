# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""boot_kernels: the kernels that can boot (proxmox-boot-tool's real listing), the next one, DKMS's state per kernel."""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import boot_kernels as bk
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host.nvidia_installer import parse_dkms_status

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "kernels")
V = "580.126.09"


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


def test_boot_tool_listing_with_both_pins():
    listing = bk.parse_boot_tool_list(fixture("boot_tool_list_pinned.txt"))
    assert listing == {"manual": [], "auto": ["6.8.12-10-pve", "6.8.12-9-pve"], "pinned": "6.8.12-9-pve",
                       "next_boot_pin": "6.8.12-10-pve"}
    # the next-boot pin wins over the pin, the pin over the newest
    assert bk.next_boot_kernel(listing, ["6.8.12-9-pve", "6.8.12-10-pve"]) == "6.8.12-10-pve"
    listing["next_boot_pin"] = None
    assert bk.next_boot_kernel(listing, ["6.8.12-9-pve", "6.8.12-10-pve"]) == "6.8.12-9-pve"


def test_next_boot_is_the_newest_by_version_not_by_text():
    listing = bk.parse_boot_tool_list(fixture("boot_tool_list_plain.txt"))
    assert listing["manual"] == [] and listing["pinned"] is None
    assert bk.next_boot_kernel(listing, ["6.8.12-10-pve", "6.8.12-9-pve"]) == "6.8.12-10-pve"
    # without proxmox-boot-tool: /boot's images
    assert bk.next_boot_kernel(None, ["6.8.12-9-pve", "6.8.12-10-pve", "6.5.13-6-pve"]) == "6.8.12-10-pve"
    assert bk.next_boot_kernel(None, []) is None


def test_bootable_kernels_need_an_image(tmp_path):
    for k in ("6.8.12-9-pve", "6.8.12-10-pve"):
        (tmp_path / ("vmlinuz-" + k)).write_text("")
    (tmp_path / "config-6.8.12-9-pve").write_text("")
    installed = bk.installed_kernels(str(tmp_path))
    assert installed == ["6.8.12-9-pve", "6.8.12-10-pve"]
    listing = {"manual": [], "auto": ["6.8.12-10-pve", "6.8.12-9-pve", "6.5.13-6-pve"], "pinned": None, "next_boot_pin": None}
    # 6.5.13-6-pve is listed but its image is gone: it cannot boot
    assert bk.bootable_kernels(listing, installed, "6.8.12-9-pve") == ["6.8.12-10-pve", "6.8.12-9-pve"]
    assert bk.bootable_kernels(None, installed, "6.8.12-9-pve") == ["6.8.12-10-pve", "6.8.12-9-pve"]
    assert bk.installed_kernels(str(tmp_path / "none")) == []


def test_report_per_kernel_from_dkms_3_0_status(tmp_path):
    entries = parse_dkms_status(fixture("dkms_status_3.0.10.txt"))
    (tmp_path / "6.8.12-9-pve" / "build" / "include").mkdir(parents=True)
    report = bk.kernel_report(["6.8.12-11-pve", "6.8.12-10-pve", "6.8.12-9-pve"], V, entries, "6.8.12-9-pve",
                              "6.8.12-11-pve", str(tmp_path))
    assert [(r["kernel"], r["dkms"], r["headers"], r["next_boot"], r["running"]) for r in report] == [
        ("6.8.12-11-pve", "added", False, True, False),
        ("6.8.12-10-pve", "built", False, False, False),
        ("6.8.12-9-pve", "installed", True, False, True)]
    assert report[0]["headers_package"] == "proxmox-headers-6.8.12-11-pve"
    assert [r["kernel"] for r in bk.kernels_to_build(report)] == ["6.8.12-11-pve", "6.8.12-10-pve"]
    assert bk.dkms_state([], V, "6.8.12-9-pve") is None


def test_failed_build_prefers_the_failed_builds_log(tmp_path):
    build = tmp_path / "nvidia" / V / "build"
    build.mkdir(parents=True)
    (build / "make.log").write_text("\n".join("line %d" % i for i in range(30)) + "\n")
    why = bk.failed_build(V, "6.8.12-10-pve", "Error! Bad return status", lines=3, dkms_tree=str(tmp_path))
    path, tail = why["make_log"], why["make_log_tail"]
    assert path.endswith("nvidia/%s/build/make.log" % V) and tail == ["line 27", "line 28", "line 29"]
    assert why["cause"] is None and why["summary"] == "Error! Bad return status"   # no compiler words: DKMS's own
    gone = bk.failed_build(V, "6.8.12-10-pve", "x", dkms_tree=str(tmp_path / "x"))
    assert (gone["make_log"], gone["make_log_tail"]) == (None, [])
