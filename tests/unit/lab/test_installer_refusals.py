"""The installer stand-in refuses what NVIDIA's nvidia-installer 580.x refuses, first things first,
with its words (tests/lab/nvidia/README.md has the table of checks and their source lines).

The expected messages are written out here from the real source, not taken from the stand-in.
With --silent the real installer prints warnings and errors to stderr as "\\nLEVEL: text\\n\\n"
(stream-ui.c) and logs them as "LEVEL: text"; answers to its questions go to the log only.
"""

import os

import pytest

from conftest import NEW_RELEASE, RELEASE, VERSION
# host is a fixture, used by name
from stock_host import HOST, USERSPACE, drop, host, install, log, stock  # noqa: F401  pylint: disable=unused-import

pytest.importorskip("pynvml")

FAILED = ("ERROR: Installation has failed.  Please see the file '/var/log/nvidia-installer.log' for details.  You may "
          "find suggestions on fixing installation problems in the README available on the Linux driver download page "
          "at www.nvidia.com.")
NO_CC = ("ERROR: Unable to find the development tool `cc` in your path; please make sure that you have the package "
         "'gcc' installed.  If gcc is installed on your system, then please check that `cc` is in your PATH.")
NO_DEPMOD = ("ERROR: Unable to find the module utility `depmod`; please make sure you have the package "
             "'module-init-tools' or 'kmod' installed.  If you do have 'module-init-tools' or 'kmod' installed, then "
             "please check that `depmod` is in your PATH.")
NO_LIBC = ("ERROR: You do not appear to have libc header files installed on your system.  Please install your "
           "distribution's libc development package.")
NOUVEAU = ("WARNING: The Nouveau kernel driver is currently in use by your system.  This driver is incompatible with "
           "the NVIDIA driver, and must be disabled before proceeding.")
INSTALL_SOURCES = (
    "Please make sure you have installed the kernel source files for your kernel and that they are properly "
    "configured; on Red Hat Linux systems, for example, be sure you have the 'kernel-source' or 'kernel-devel' RPM "
    "installed.  If you know the correct kernel source files are installed, you may specify the kernel source path "
    "with the '--kernel-source-path' command line option.")
NO_SOURCES = "ERROR: Unable to find the kernel source tree for the currently running kernel.  " + INSTALL_SOURCES
IN_USE = ("WARNING: An NVIDIA kernel module 'nvidia-uvm' appears to be already loaded in your kernel.  This may be "
          "because it is in use (for example, by an X server, a CUDA program, or the NVIDIA Persistence Daemon), but "
          "this may also happen if your kernel was configured without support for module unloading.  Some of the "
          "sanity checks that nvidia-installer performs to detect potential installation problems are not possible "
          "while an NVIDIA kernel module is running.")
DKMS_QUESTION = ("-> Would you like to register the kernel module sources with DKMS? This will allow DKMS to "
                 "automatically build a new module, if your kernel changes later. (Answer: %s)")
NOUVEAU_CONF = "/nvidia-installer-disable-nouveau.conf"


def printed(*lines):
    """stderr of a --silent run that printed these warnings/errors."""
    return "".join("\n%s\n\n" % line for line in lines)


def untouched(root):
    """Nothing installed, built or loaded."""
    st = root.state()
    assert st["nvidia"]["installed"] is None and not st["nvidia"].get("kernel_modules")
    assert "nvidia" not in st["modules"]["loaded"]
    assert not os.path.exists(root.p("/usr/bin/nvidia-smi")) and not os.path.exists(root.p("/var/lib/nvidia/log"))


def bind_nouveau(root):
    """nouveau loaded and driving the GPUs (what the real check sees in /sys/bus/pci/devices/*/driver)."""
    with root.modify() as st:
        st["modules"]["loaded"].append("nouveau")
        for bdf in ("0000:01:00.0", "0000:02:00.0"):
            st["pci"]["devices"][bdf]["driver"] = "nouveau"


# --- development tools (misc.c check_development_tools) ------------------------------------------

def test_no_compiler_refused(host):
    """The headline: no cc, no install; as the real installer, without "Installation has failed"."""
    drop(host, "/usr/bin/cc")
    r = install(host, *HOST)
    assert r.returncode == 1
    assert r.stderr == printed(NO_CC) and r.stdout == ""
    assert log(host).endswith("\n" + NO_CC + "\n")
    untouched(host)


@pytest.mark.parametrize("rel, expected", [
    ("/usr/bin/make", "Unable to find the development tool `make` in your path; please make sure that you have the "
                      "package 'make' installed.  If make is installed on your system, then please check that `make` "
                      "is in your PATH."),
    ("/usr/bin/ld", "Unable to find the development tool `ld` in your path; please make sure that you have the package "
                    "'binutils' installed.  If binutils is installed on your system, then please check that `ld` is "
                    "in your PATH."),
    ("/usr/bin/tr", "Unable to find the development tool `tr` in your path; please make sure that you have the package "
                    "'coreutils' installed.  If coreutils is installed on your system, then please check that `tr` "
                    "is in your PATH."),
    ("/usr/include/stdio.h", NO_LIBC[len("ERROR: "):]),
])
def test_development_tools_refused(host, rel, expected):
    drop(host, rel)
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed("ERROR: " + expected)
    untouched(host)


def test_dangling_compiler_link_is_no_compiler(host):
    """cc -> /etc/alternatives/cc -> /usr/bin/gcc: gcc removed, the link stays (stat follows links)."""
    drop(host, "/usr/bin/x86_64-linux-gnu-gcc-12")
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed(NO_CC)


def test_cc_from_the_environment(host):
    """$CC replaces the `cc` lookup; the CC sanity check then needs $CC to compile."""
    drop(host, "/usr/bin/cc")
    r = install(host, *HOST, CC="gcc-12")
    assert r.returncode == 0, r.stderr
    assert '-> Performing CC sanity check with CC="gcc-12".\n-> Performing CC check.\n' in log(host)
    r = install(host, *HOST, CC="clang")
    assert r.returncode == 1
    assert r.stderr == printed(
        "ERROR: The CC sanity check failed:\n\nThe C compiler 'clang' does not appear to be able to\ncreate object "
        "files.  Please make sure you have \nyour Linux distribution's libc development package\ninstalled and that "
        "'clang' is a valid C compiler\nname.")


def test_cc_found_only_off_path_fails_the_sanity_check(host):
    """The installer also searches /usr/bin after $PATH; conftest.sh's `cc -c` sees $PATH only."""
    r = install(host, *HOST, PATH="/nowhere:/bin")
    assert r.returncode == 1
    assert r.stderr == printed(
        "ERROR: The CC sanity check failed:\n\nThe C compiler 'cc' does not appear to be able to\ncreate executables.  "
        "Please make sure you have \nyour Linux distribution's gcc and libc development\npackages installed.")


def test_userspace_needs_no_compiler(host):
    drop(host, "/usr/bin/cc", "/usr/bin/make", "/usr/include/stdio.h")
    r = install(host, *USERSPACE)
    assert r.returncode == 0, r.stderr
    assert ('-> Not installing any kernel modules; skipping the "is an NVIDIA kernel module loaded?" test.\n'
            in log(host))


# --- system and module utilities (misc.c find_system_utils, find_module_utils) -----------------

@pytest.mark.parametrize("args", [HOST, USERSPACE, ["--uninstall", "--silent"]], ids=["host", "userspace", "uninstall"])
def test_kmod_tools_needed_in_every_mode(host, args):
    """find_module_utils runs in main(), before any mode: a container needs kmod too."""
    drop(host, "/usr/sbin/depmod")
    r = install(host, *args)
    assert r.returncode == 1 and r.stderr == printed(NO_DEPMOD)


def test_container_without_kmod_refused(tmp_path, nvbuild):
    from conftest import Root
    ct = stock(Root(tmp_path / "ct", nvbuild))
    drop(ct, "/usr/sbin/modprobe", "/usr/sbin/rmmod", "/usr/sbin/lsmod", "/usr/sbin/depmod")
    r = install(ct, *USERSPACE)
    assert r.returncode == 1
    assert r.stderr == printed(
        "ERROR: Unable to find the module utility `modprobe`; please make sure you have the package "
        "'module-init-tools' or 'kmod' installed.  If you do have 'module-init-tools' or 'kmod' installed, then please "
        "check that `modprobe` is in your PATH.")
    assert not os.path.exists(ct.p("/usr/bin/nvidia-smi"))


def test_system_utility_refused(host):
    drop(host, "/usr/bin/dmesg")
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed(
        "ERROR: Unable to find the system utility `dmesg`; please make sure you have the package 'util-linux' "
        "installed.  If you do have util-linux installed, then please check that `dmesg` is in your PATH.")


def test_tool_must_be_an_executable_file(host):
    """misc.c find_system_util: a regular file with an x bit; this machine's own tools do not count."""
    os.chmod(host.p("/usr/bin/make"), 0o644)
    os.makedirs(host.p("/usr/local/bin/make"))
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr.startswith("\nERROR: Unable to find the development tool `make`")


def test_systemd_option_needs_systemctl(host):
    drop(host, "/usr/bin/systemctl")
    r = install(host, *HOST + ["--systemd"])
    assert r.returncode == 1
    assert r.stderr == printed("ERROR: Option '--systemd' was specified but systemctl was not found on this system")
    assert install(host, *HOST).returncode == 0  # without the option: no units, no refusal
    assert not os.path.exists(host.p("/usr/lib/systemd/system/nvidia-suspend.service"))


# --- a loaded NVIDIA module (kernel.c check_for_unloaded_kernel_module) ---------------------------

def test_module_in_use_refused(host):
    assert install(host, *HOST).returncode == 0
    with host.modify() as st:
        st["gpus"][0]["processes"] = [{"pid": 4242, "name": "python3", "used_mib": 1000}]
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed(IN_USE, FAILED)
    assert ("-> Would you like to continue installation and skip the sanity checks? If not, please abort the "
            "installation, then close any programs which may be using the NVIDIA GPU(s), and attempt installation "
            "again. (Answer: Abort installation)\n") in log(host)
    r = install(host, *HOST + ["--allow-installation-with-running-driver"])
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(printed(IN_USE))
    assert "-> Kernel module load tests will be skipped.\n" in log(host)


def test_unused_module_is_unloaded_and_replaced(host):
    assert install(host, *HOST).returncode == 0
    r = install(host, *HOST)
    assert r.returncode == 0 and r.stderr == ""
    assert "nvidia" in host.state()["modules"]["loaded"]


# --- nouveau (misc.c check_for_nouveau) ------------------------------------------------------------

def test_nouveau_bound_refused_after_writing_the_modprobe_files(host):
    bind_nouveau(host)
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed(NOUVEAU, FAILED)
    # only into the modprobe directories that exist; /usr/lib/modprobe.d does not here
    with open(host.p("/etc/modprobe.d" + NOUVEAU_CONF)) as f:
        assert f.read() == "# generated by nvidia-installer\nblacklist nouveau\noptions nouveau modeset=0\n"
    assert not os.path.exists(host.p("/usr/lib/modprobe.d" + NOUVEAU_CONF))
    text = log(host)
    assert ("Would you like nvidia-installer to attempt to create these modprobe configuration files for you? "
            "(Answer: Yes)\n") in text
    assert ("-> One or more modprobe configuration files to disable Nouveau have been written.  You will need to "
            "reboot your system and possibly rebuild the initramfs before these changes can take effect.  Note if you "
            "later wish to reenable Nouveau, you will need to delete these files: "
            "/etc/modprobe.d/nvidia-installer-disable-nouveau.conf\n") in text
    assert "(Answer: Abort installation)\n-> Skipping initramfs rebuild.\n" + FAILED + "\n" in text
    untouched(host)


def test_nouveau_files_already_there(host):
    os.makedirs(host.p("/usr/lib/modprobe.d"))
    bind_nouveau(host)
    assert install(host, *HOST).returncode == 1
    r = install(host, *HOST)  # not rebooted since: the files are there, nouveau still is
    assert r.returncode == 1
    assert r.stderr == printed(NOUVEAU, (
        "WARNING: One or more modprobe configuration files to disable Nouveau are already present at: "
        "/usr/lib/modprobe.d/nvidia-installer-disable-nouveau.conf, /etc/modprobe.d/nvidia-installer-disable-nouveau"
        ".conf.  Please be sure you have rebooted your system since these files were written.  If you have rebooted, "
        "then Nouveau may be enabled for other reasons, such as being included in the system initial ramdisk or in "
        "your X configuration file.  Please consult the NVIDIA driver README and your Linux distribution's "
        "documentation for details on how to correctly disable the Nouveau kernel driver."), FAILED)
    assert "Would you like nvidia-installer" not in log(host)


def test_nouveau_no_disable(host):
    bind_nouveau(host)
    r = install(host, *[a for a in HOST if a != "--disable-nouveau"] + ["--no-disable-nouveau"])
    assert r.returncode == 1 and r.stderr == printed(NOUVEAU, FAILED)
    assert "(Answer: No)\n-> Please disable Nouveau manually and attempt to install the NVIDIA driver again later.\n" \
        in log(host)
    assert not os.path.exists(host.p("/etc/modprobe.d" + NOUVEAU_CONF))


def test_nouveau_nowhere_to_write(host):
    os.rmdir(host.p("/etc/modprobe.d"))
    bind_nouveau(host)
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed(NOUVEAU, (
        "WARNING: Unable to alter the nouveau modprobe configuration.  Please consult the NVIDIA driver README and "
        "your Linux distribution's documentation for details on how to correctly disable the Nouveau kernel driver."),
        FAILED)


def test_nouveau_check_skipped_or_not_bound(host):
    """--no-nouveau-check skips it (the load then fails: nouveau holds the GPUs); a loaded nouveau that
    drives no device is not "in use" (the real check reads /sys/bus/pci/devices/*/driver)."""
    bind_nouveau(host)
    r = install(host, *HOST + ["--no-nouveau-check"])
    assert r.returncode == 1 and "WARNING: The Nouveau" not in r.stderr
    assert "ERROR: Unable to load the kernel module 'nvidia.ko'." in r.stderr
    with host.modify() as st:
        for bdf in ("0000:01:00.0", "0000:02:00.0"):
            st["pci"]["devices"][bdf]["driver"] = None
    r = install(host, *HOST)
    assert r.returncode == 0, r.stderr


def test_nouveau_continue_with_running_driver_allowed(host):
    bind_nouveau(host)
    r = install(host, *HOST + ["--allow-installation-with-running-driver"])
    assert r.returncode == 0 and r.stderr == printed(NOUVEAU)
    assert ("-> Proceeding with installation despite the presence of Nouveau. Kernel module load tests will be "
            "skipped.\n") in log(host)
    st = host.state()
    assert st["nvidia"]["installed"]["version"] == VERSION and "nvidia" not in st["modules"]["loaded"]


# --- the kernel source tree (kernel.c determine_kernel_source_path) -------------------------------

def test_no_kernel_sources_refused(host):
    drop(host, "/lib/modules/%s/build" % RELEASE)
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed(NO_SOURCES, FAILED)
    assert log(host).endswith(NO_SOURCES + "\n" + FAILED + "\n")
    untouched(host)


def test_no_kernel_sources_for_another_kernel(host):
    """--kernel-name: the real message still says "the currently running kernel"."""
    r = install(host, *HOST[:-1] + ["--kernel-name=%s" % NEW_RELEASE])
    assert r.returncode == 1 and r.stderr == printed(NO_SOURCES, FAILED)


@pytest.mark.parametrize("rel, expected", [
    ("/usr/src/linux-headers-%s/include/linux/kernel.h" % RELEASE,
     "ERROR: The kernel header file '/lib/modules/%s/build/include/linux/kernel.h' does not exist.  The most likely "
     "reason for this is that the kernel source path '/lib/modules/%s/build' is incorrect.  %s"
     % (RELEASE, RELEASE, INSTALL_SOURCES)),
    ("/usr/src/linux-headers-%s/include/generated/uapi/linux/version.h" % RELEASE,
     "ERROR: Neither the '/lib/modules/{0}/build/include/linux/version.h' nor the '/lib/modules/{0}/build/include/"
     "generated/uapi/linux/version.h' kernel header file exists. The most likely reason for this is that the kernel "
     "source files in '/lib/modules/{0}/build' have not been configured.".format(RELEASE)),
])
def test_incomplete_kernel_sources_refused(host, rel, expected):
    drop(host, rel)
    r = install(host, *HOST)
    assert r.returncode == 1 and r.stderr == printed(expected, FAILED)


def test_kernel_source_path_option(host):
    r = install(host, *HOST + ["--kernel-source-path=/usr"])
    assert r.returncode == 1 and r.stderr == printed(
        "ERROR: The kernel source path '/usr' is invalid.  " + INSTALL_SOURCES, FAILED)
    r = install(host, *HOST + ["--kernel-source-path=/usr/src/linux-headers-6.2.16-3-pve"])
    assert r.returncode == 1 and r.stderr == printed(
        "ERROR: The kernel source path '/usr/src/linux-headers-6.2.16-3-pve' does not exist.  " + INSTALL_SOURCES,
        FAILED)
    drop(host, "/lib/modules/%s/build" % RELEASE)
    r = install(host, *HOST + ["--kernel-source-path=/usr/src/linux-headers-%s" % RELEASE])
    assert r.returncode == 0, r.stderr
    assert ("-> Using the kernel source path '/usr/src/linux-headers-%s' as specified by the '--kernel-source-path' "
            "commandline option.\n" % RELEASE) in log(host)


# --- the order ----------------------------------------------------------------------------------

def _no_ldconfig(root):
    drop(root, "/usr/sbin/ldconfig")


def _no_depmod(root):
    drop(root, "/usr/sbin/depmod")


def _gpu_busy(root):
    with root.modify() as st:
        st["gpus"][0]["processes"] = [{"pid": 4242, "name": "python3", "used_mib": 1000}]


def _no_cc(root):
    drop(root, "/usr/bin/cc")


def _no_libc_headers(root):
    drop(root, "/usr/include/stdio.h")


def _nouveau_on_second_gpu(root):
    with root.modify() as st:
        st["modules"]["loaded"].append("nouveau")
        st["pci"]["devices"]["0000:02:00.0"]["driver"] = "nouveau"


def _no_kernel_sources(root):
    drop(root, "/lib/modules/%s/build" % RELEASE)


# In the real installer's order: main() (nvidia-installer.c:705-706), then install_from_cwd
# (install-from-cwd.c:145, 210, 216, 226).
FAULTS = [
    (_no_ldconfig, "ERROR: Unable to find the system utility `ldconfig`"),
    (_no_depmod, NO_DEPMOD),
    (_gpu_busy, IN_USE),
    (_no_cc, NO_CC),
    (_no_libc_headers, NO_LIBC),
    (_nouveau_on_second_gpu, NOUVEAU),
    (_no_kernel_sources, "ERROR: Unable to find the kernel source tree"),
]


@pytest.mark.parametrize("first", range(len(FAULTS)), ids=[f.__name__.strip("_") for f, _msg in FAULTS])
def test_first_real_check_wins(host, first):
    """Every fault from ``first`` on at once: only the first one's message, none of the later ones'."""
    assert install(host, *HOST).returncode == 0  # a driver in use is one of the faults
    for fault, _msg in FAULTS[first:]:
        fault(host)
    r = install(host, *HOST)
    assert r.returncode == 1
    assert r.stderr.startswith("\n" + FAULTS[first][1])
    for _fault, later in FAULTS[first + 1:]:
        assert later not in r.stderr


# --- DKMS (misc.c dkms_register_module) ----------------------------------------------------------

@pytest.mark.parametrize("missing", ["/usr/sbin/dkms", "/usr/bin/tar"])
def test_dkms_requested_but_missing_is_skipped_silently(host, missing):
    """580 registers with DKMS only where dkms(8) and tar(1) are: otherwise not a word, and the
    module is not rebuilt when the kernel changes. Its sources and dkms.conf are installed all the same
    (/usr/src/nvidia-<version>, files.c:551-561), the installer's own files."""
    drop(host, missing)
    r = install(host, *HOST)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""
    assert "DKMS" not in log(host)
    st = host.state()
    assert st["nvidia"]["installed"]["dkms"] is False and st["nvidia"]["kernel_modules"][RELEASE]["dkms"] is False
    assert not os.path.exists(host.p("/var/lib/dkms/nvidia"))
    assert os.path.exists(host.p("/lib/modules/%s/kernel/drivers/video/nvidia.ko" % RELEASE))
    manifest = open(host.p("/var/lib/nvidia/log")).read()
    assert "OPT dkms=0\n" in manifest and "FILE /usr/src/nvidia-%s/dkms.conf\n" % VERSION in manifest


@pytest.mark.parametrize("flag, answer", [("--dkms", "Yes"), (None, "Yes"), ("--no-dkms", "No")])
def test_dkms_question_answered_by_the_flag(host, flag, answer):
    """--dkms is the default answer; with neither flag it is yes (nvidia-installer.c:141)."""
    r = install(host, *[a for a in HOST if a != "--dkms"] + ([flag] if flag else []))
    assert r.returncode == 0, r.stderr
    assert DKMS_QUESTION % answer + "\n" in log(host)
    assert host.state()["nvidia"]["installed"]["dkms"] is (answer == "Yes")
    assert os.path.lexists(host.p("/var/lib/dkms/nvidia/%s/source" % VERSION)) is (answer == "Yes")
