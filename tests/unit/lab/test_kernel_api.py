"""The lab's module build against a kernel newer than the NVIDIA release knows (kernel_api.py): DKMS fails in the
compiler as the real one does, with make.log, and the collection reads the cause from it."""

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import installer_log

from conftest import VERSION, lablib
# host is a fixture, used by name
from stock_host import HOST, host, install  # noqa: F401  pylint: disable=unused-import

PVE92_KERNEL = "7.0.14-1-pve"  # pve-kernel master, proxmox-kernel-7.0: the default kernel of PVE 9.2


def test_dkms_build_for_a_kernel_the_source_does_not_know_fails_in_the_compiler(host):
    assert install(host, *HOST).returncode == 0
    host.install_headers(PVE92_KERNEL)
    r = host.tool("/usr/sbin/dkms", "install", "-m", "nvidia", "-v", VERSION, "-k", PVE92_KERNEL)
    assert r.returncode == 10, (r.stdout, r.stderr)
    assert "KERNEL_UNAME=%s modules...(bad exit status: 2)" % PVE92_KERNEL in r.stdout
    log = "/var/lib/dkms/nvidia/%s/build/make.log" % VERSION
    assert r.stderr.strip() == ("Error! Bad return status for module build on kernel: %s (x86_64)\nConsult %s for more "
                                "information." % (PVE92_KERNEL, log))
    text = open(host.p(log)).read()
    assert text.startswith("DKMS make.log for nvidia-%s for kernel %s (x86_64)\n" % (VERSION, PVE92_KERNEL))
    # 580.126.09 knows neither 6.19's zone_device_page_init() nor 7.0's __is_vma_write_locked()
    assert "uvm_hmm.c:84:39: error: too few arguments to function 'zone_device_page_init'" in text
    assert "nv-mmap.c:922:9: error: too many arguments to function '__is_vma_write_locked'" in text
    assert PVE92_KERNEL not in (host.state()["nvidia"].get("kernel_modules") or {})  # nothing built
    why = installer_log.build_failure(text)
    assert why["cause"] == "kernel_api_changed" and "zone_device_page_init" in why["summary"], why


def test_the_kernels_the_release_knows_build():
    kernel_api = lablib("kernel_api")
    assert kernel_api.build_errors(VERSION, "6.17.13-2-pve") == [] and kernel_api.build_errors(VERSION, "6.18.9-1-pve") == []
    assert [err for err, _obj in kernel_api.build_errors("580.105.08", "6.18.9-1-pve")] == [
        "nvidia-uvm/uvm_va_range_device_p2p.c:363:13: error: too many arguments to function 'get_dev_pagemap'"]
    assert kernel_api.build_errors("580.142", PVE92_KERNEL) == [] and kernel_api.build_errors("590.48.01", "7.1.0") == []
