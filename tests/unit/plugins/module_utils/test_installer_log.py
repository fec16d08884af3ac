# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why the NVIDIA installer failed, on published installer output and logs (fixtures/nvidia-installer, each with its source)."""

from __future__ import annotations

import glob
import os
import re

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import installer_log as il

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "nvidia-installer")
FIXTURES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIX, "*.log")))
REAL = [f for f in FIXTURES if not f.startswith("synthetic_")]


def read(name):
    with open(os.path.join(FIX, name), encoding="utf-8") as f:
        return f.read()


def header(text, key):
    m = re.search(r"^# %s: (.*)$" % key, text, re.M)
    return m.group(1).strip() if m else None


def body(text):
    return [ln for ln in text.splitlines() if not ln.startswith("# ")]


def test_every_cause_has_a_fixture_and_most_are_real():
    causes = set(header(read(f), "expected_cause") for f in FIXTURES)
    assert causes == set(c[0] for c in il.CAUSES)
    assert len(REAL) >= 10


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_names_its_source_and_gets_its_cause(name):
    text = read(name)
    source = header(text, "source")
    assert re.match(r"(https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+ \(|synthetic: NVIDIA/nvidia-installer )", source)
    d = il.diagnose("\n".join(body(text)))
    assert d["cause"] == header(text, "expected_cause"), d
    assert d["summary"] and "{" not in d["summary"] and d["remedy"]
    lines = set(" ".join(ln.split()) for ln in body(text))
    assert d["evidence"] and all(any(ev in ln for ln in lines) for ev in d["evidence"]), d["evidence"]


@pytest.mark.parametrize("name", REAL)
def test_excerpts_cut_at_either_end_keep_their_cause(name):
    # while the lines a cause was read from are there, a missing head or tail changes nothing
    lines = body(read(name))
    evidence = il.diagnose("\n".join(lines))["evidence"]
    for n in range(1, len(lines)):
        for cut in (lines[n:], lines[:-n]):
            flat = set(" ".join(ln.split()) for ln in cut)
            if all(any(ev in ln for ln in flat) for ev in evidence):
                assert il.diagnose("\n".join(cut))["cause"] == header(read(name), "expected_cause"), (n, cut[:2])


def test_prefixes_of_ci_and_container_logs_are_read_through():
    text = ("2022-11-02T18:33:01.2374547Z ERROR: Unable to find the kernel source tree for the currently running kernel.\n"
            "nvidia-driver-1  | ERROR: Installation has failed.\n")
    assert il.diagnose(text)["cause"] == "kernel_source_missing"
    assert il.diagnose("nvidia-1 | ERROR: Unable to find the development tool `make` in your path")["summary"].endswith("(make)")


def test_secure_boot_wins_over_the_generic_load_failure_and_vfio_over_both_orders():
    sb = read("synthetic_secure_boot.log")
    assert il.diagnose(sb)["cause"] == "secure_boot"
    reversed_log = "\n".join(reversed(body(read("synthetic_vfio_in_installer_log.log"))))
    assert il.diagnose(reversed_log)["cause"] == "gpu_bound_to_vfio"
    assert "0000:01:00.0" in il.diagnose(reversed_log)["summary"] and "vfio-pci" in il.diagnose(reversed_log)["summary"]


def test_unknown_failures_give_the_installers_own_first_error_and_nothing_else_is_made_up():
    d = il.diagnose("-> Detected 4 CPUs\nERROR: Unable to create a temporary file.\nERROR: Installation has failed.  Please see\n")
    assert d == {"cause": None, "summary": "Unable to create a temporary file.", "remedy": "",
                 "evidence": ["Unable to create a temporary file."]}
    assert il.diagnose("ERROR: Installation has failed.")["summary"] == ""
    assert il.diagnose("")["summary"] == ""
    d = il.diagnose("\n".join(body(read("kernel_source_missing_bumblebee_925.log"))))
    assert (d["summary"], d["cause"]) == ("no kernel headers for the kernel the module is built for", "kernel_source_missing")
    assert d["remedy"].startswith("install the headers")


MAKE = os.path.join(FIX, "make-logs")
MAKE_LOGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(MAKE, "*.log")))


def make_log(name):
    with open(os.path.join(MAKE, name), encoding="utf-8") as f:
        return f.read()


def test_every_build_cause_has_a_published_make_log():
    assert set(header(make_log(f), "expected_build_cause") for f in MAKE_LOGS) == set(c[0] for c in il.BUILD_CAUSES)


@pytest.mark.parametrize("name", MAKE_LOGS)
def test_make_logs_get_their_build_cause_also_cut(name):
    text = make_log(name)
    assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+ \(", header(text, "source"))
    lines = body(text)
    b = il.build_failure("\n".join(lines))
    assert b["cause"] == header(text, "expected_build_cause") and b["summary"] and "{" not in b["remedy"], b
    for n in range(1, len(lines)):
        for cut in (lines[n:], lines[:-n]):
            flat = set(" ".join(ln.split()) for ln in cut)
            if all(any(ev in ln for ln in flat) for ev in b["evidence"]):
                assert il.build_failure("\n".join(cut))["cause"] == b["cause"], (n, cut[:2])


def test_a_failed_build_says_why_when_the_log_has_the_compilers_words():
    text = "\n".join(body(read("dkms_build_failed_vgpu_proxmox7_1.log")) + body(make_log("kernel_api_changed_nvidia_all_34.log")))
    d = il.diagnose(text)
    assert d["cause"] == "dkms_build_failed"
    assert d["summary"] == ("DKMS could not build the module: the driver's source does not build against this kernel "
                            "(its API changed: sys_close)")
    assert "newer gpu_host_driver_version" in d["remedy"]
    assert il.build_failure(read("module_in_use_apollo_6308.log")) is None
    headers = il.build_failure("\n".join(body(make_log("headers_missing_it87_4.log"))))
    assert headers["summary"] == "no kernel headers for kernel 6.8.12-2-pve" and "proxmox-headers-6.8.12-2-pve" in headers["remedy"]
    # gcc outside the C locale quotes with U+2018/U+2019, as the published log did
    typographic = "nv-caps.c:598:5: error: implicit declaration of function \u2018sys_close\u2019 [-Werror]"
    assert il.build_failure(typographic)["summary"].endswith("(its API changed: sys_close)")
    clang = il.build_failure("\n".join(body(make_log("compiler_mismatch_pop_os_3117.log"))))
    assert clang["summary"] == ("the compiler (cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0) is not the one the kernel was built "
                                "with (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0)")


def test_the_kernels_compiler_warning_is_a_cause_only_when_the_compilers_really_differ():
    # printed by successful builds too when only the Debian revision differs: then the real error decides
    warning = ("warning: the compiler differs from the one used to build the kernel\n"
               "  The kernel was built by: gcc (Debian 12.2.0-14) 12.2.0\n"
               "  You are using:           gcc (Debian 12.2.0-14+deb12u1) 12.2.0\n")
    api = "nvidia-drm/nvidia-drm-drv.c:1: error: 'struct drm_driver' has no member named 'date'\n"
    assert il.build_failure(warning) is None
    assert il.build_failure(warning + api)["cause"] == "kernel_api_changed"
    assert il.build_failure(warning + api)["summary"].endswith("(its API changed: struct drm_driver)")
    modpost = 'ERROR: modpost: "drm_gem_prime_fd_to_handle" [nvidia-drm.ko] undefined!\n'
    assert il.build_failure(modpost)["summary"].endswith("(its API changed: drm_gem_prime_fd_to_handle)")
    other_major = warning.replace("gcc (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc (Debian 14.2.0-19) 14.2.0")
    assert il.build_failure(other_major)["cause"] == "compiler_mismatch"
