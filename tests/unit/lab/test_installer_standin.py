"""The .run installer stand-in, dkms, nvidia-modprobe, apt-get wrapper and systemctl on a temp root.

The installer runs on ``host``: a root with what the real installer needs (stock_host.py);
its refusals are in test_installer_refusals.py."""

import os
import stat
import sys
import time

import pytest

from conftest import NEW_RELEASE, RELEASE, VERSION
# host is a fixture, used by name
from stock_host import HOST, USERSPACE, host, install, stock  # noqa: F401  pylint: disable=unused-import

pytest.importorskip("pynvml")

NVML_SUMMARY = ("pynvml.nvmlInit()\nout['version'] = pynvml.nvmlSystemGetDriverVersion()\n"
                "out['names'] = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) "
                "for i in range(pynvml.nvmlDeviceGetCount())]\n")


def chr_node(path):
    st = os.lstat(path)
    if stat.S_ISCHR(st.st_mode):
        return os.major(st.st_rdev), os.minor(st.st_rdev)
    with open(path) as f:  # unprivileged fallback marker "c M:m"
        major, minor = f.read().split()[1].split(":")
        return int(major), int(minor)


def test_unknown_flag_refused(root):
    r = root.installer("--silent", "--frobnicate")
    assert r.returncode == 1
    assert 'nvidia-installer: unrecognized option: "--frobnicate"' in r.stderr
    assert "ERROR: Invalid commandline, please run `./nvidia-installer --help` for usage information." in r.stderr
    assert root.state()["nvidia"]["installed"] is None


def test_bad_kernel_module_type_refused(root):
    r = root.installer("--silent", "--kernel-module-type=closed")
    assert r.returncode == 1 and 'Invalid kernel module type "closed"' in r.stderr


def test_version_and_info(host):
    r = install(host, "--version")
    assert r.returncode == 0 and "nvidia-installer:  version %s" % VERSION in r.stdout
    r = install(host, "--silent", "--driver-info")
    assert "There is no NVIDIA driver currently installed." in r.stdout


def test_gpus_held_by_vfio_module_does_not_load(host):
    with host.modify() as st:
        for bdf in ("0000:01:00.0", "0000:02:00.0"):
            st["pci"]["devices"][bdf]["driver"] = "vfio-pci"
    r = install(host, *HOST)
    assert r.returncode == 1 and "Unable to load the kernel module 'nvidia.ko'" in r.stderr
    st = host.state()
    assert st["nvidia"]["installed"] is None and not st["nvidia"].get("kernel_modules")


def test_secure_boot_unsigned_refused_signed_ok(host, tmp_path):
    with host.modify() as st:
        st["kernel"]["secure_boot"] = True
    r = install(host, *HOST)
    assert r.returncode == 1 and "Secure boot is enabled on this system" in r.stderr
    os.makedirs(host.p("/root"), exist_ok=True)
    for name in ("mok.key", "mok.der"):
        with open(host.p("/root/" + name), "w") as f:
            f.write("x")
    r = install(host, *HOST + ["--module-signing-secret-key=/root/mok.key", "--module-signing-public-key=/root/mok.der"])
    assert r.returncode == 0, r.stderr
    assert host.state()["nvidia"]["kernel_modules"][RELEASE]["signed"] is True


def test_host_install_loads_driver_and_nvml_answers(host):
    if not os.path.exists("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"):  # no real driver on this machine
        assert host.nvml("pynvml.nvmlInit()")["error"] == "NVMLError_LibraryNotFound"  # like a host without driver
    r = install(host, *HOST)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # --silent
    st = host.state()
    assert st["nvidia"]["installed"] == {"version": VERSION, "kernel_module_type": "open", "dkms": True,
                                         "userspace_only": False}
    assert st["nvidia"]["kernel_modules"][RELEASE]["version"] == VERSION
    assert {"nvidia", "nvidia_uvm", "nvidia_modeset"} <= set(st["modules"]["loaded"])
    assert "nvidia" in st["modules"]["available"][RELEASE]
    devs = st["pci"]["devices"]
    assert devs["0000:01:00.0"]["driver"] == devs["0000:02:00.0"]["driver"] == "nvidia"
    assert devs["0000:01:00.1"]["driver"] == "snd_hda_intel"  # the HDMI audio stays
    # userspace as the real installer lays it out
    lib = host.p("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    assert os.readlink(lib) == "libnvidia-ml.so." + VERSION
    for rel in ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-persistenced", "/usr/bin/nvidia-modprobe",
                "/usr/src/nvidia-%s/dkms.conf" % VERSION, "/lib/modules/%s/updates/dkms/nvidia.ko" % RELEASE,
                "/usr/lib/firmware/nvidia/%s/gsp_ga10x.bin" % VERSION, "/var/lib/nvidia/log",
                "/usr/share/doc/NVIDIA_GLX-1.0/samples/nvidia-persistenced-init.tar.bz2"):
        assert os.path.exists(host.p(rel)), rel
    # device nodes: GPUs, ctl, modeset (installer) and uvm (nvidia-modprobe -u -c=0)
    assert chr_node(host.p("/dev/nvidia0")) == (195, 0) and chr_node(host.p("/dev/nvidia1")) == (195, 1)
    assert chr_node(host.p("/dev/nvidiactl")) == (195, 255) and chr_node(host.p("/dev/nvidia-modeset")) == (195, 254)
    # nvidia-uvm's major is dynamic: whatever the "kernel" registered in /proc/devices
    uvm = host.state()["majors"]["nvidia-uvm"]
    assert chr_node(host.p("/dev/nvidia-uvm")) == (uvm, 0) and chr_node(host.p("/dev/nvidia-uvm-tools")) == (uvm, 1)
    # NVML (real pynvml) and nvidia-smi answer
    assert host.nvml(NVML_SUMMARY) == {"version": VERSION, "names": ["NVIDIA RTX A6000"] * 2}
    r = host.run([sys.executable, host.p("/usr/bin/nvidia-smi"), "--query-gpu=driver_version", "--format=csv,noheader"])
    assert r.stdout.split() == [VERSION, VERSION]
    # dkms status as the collection parses it
    r = host.tool("/usr/sbin/dkms", "status", "-m", "nvidia")
    assert r.stdout.strip() == "nvidia/%s, %s, x86_64: installed" % (VERSION, RELEASE)
    log = open(host.p("/var/log/nvidia-installer.log")).read()
    assert "installer version: %s" % VERSION in log and "--dkms" in log


def test_reinstall_same_version_reinstalls(host):
    assert install(host, *HOST).returncode == 0
    r = install(host, *HOST)
    assert r.returncode == 0, r.stderr
    assert "Uninstalling the previous NVIDIA driver installation" in open(host.p("/var/log/nvidia-installer.log")).read()
    assert host.nvml(NVML_SUMMARY)["version"] == VERSION


def test_no_kernel_modules_installs_userspace_only(host):
    r = install(host, *USERSPACE)
    assert r.returncode == 0, r.stderr
    st = host.state()
    assert st["nvidia"]["installed"]["userspace_only"] is True
    assert "nvidia" not in st["modules"]["loaded"] and not st["nvidia"].get("kernel_modules")
    assert os.path.exists(host.p("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.%s" % VERSION))
    assert not os.path.exists(host.p("/usr/src/nvidia-%s" % VERSION)) and not os.path.exists(host.p("/dev/nvidia0"))
    assert host.nvml("pynvml.nvmlInit()")["error"] == "NVMLError_DriverNotLoaded"


def test_no_kernel_modules_without_lab_state(tmp_path, nvbuild):
    """A container: no labstate, no state.json; only what the .run ships."""
    from conftest import Root
    ct = Root(tmp_path / "ct", nvbuild)
    for name in os.listdir(ct.p("/usr/lib/kpro-lab")):
        os.unlink(os.path.join(ct.p("/usr/lib/kpro-lab"), name))
    r = install(stock(ct), *USERSPACE)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(ct.p("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.%s" % VERSION))
    assert os.path.exists(ct.p("/usr/bin/nvidia-smi"))
    r = install(ct, *HOST)
    assert r.returncode == 1 and "host mode needs the lab kernel" in r.stderr


def test_container_userspace_mismatch(host, nvbuild):
    assert install(host, *HOST).returncode == 0
    r = install(host, *USERSPACE, run=nvbuild["run_other"])  # 580.159 userspace over a 580.126.09 module
    assert r.returncode == 0, r.stderr
    assert host.nvml("pynvml.nvmlInit()")["error"] == "NVMLError_LibRmVersionMismatch"
    r = host.run([sys.executable, host.p("/usr/bin/nvidia-smi")])
    assert r.returncode == 18 and "NVML library version: 580.159" in r.stdout


def test_uninstall_reverses(host):
    assert install(host, *HOST).returncode == 0
    r = install(host, "--uninstall", "--silent")
    assert r.returncode == 0, r.stderr
    st = host.state()
    assert st["nvidia"]["installed"] is None and "nvidia" not in st["modules"]["loaded"]
    assert not st["nvidia"]["kernel_modules"]
    assert st["pci"]["devices"]["0000:01:00.0"]["driver"] is None
    for rel in ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/bin/nvidia-smi", "/var/lib/nvidia/log",
                "/usr/src/nvidia-%s" % VERSION, "/var/lib/dkms/nvidia", "/dev/nvidia0"):
        assert not os.path.lexists(host.p(rel)), rel
    assert install(host, "--uninstall", "--silent").returncode == 1


def test_dkms_autoinstall_after_kernel_change(host):
    assert install(host, *HOST).returncode == 0
    with host.modify() as st:  # host rebuilt / upgraded: boots the new kernel, module not built for it
        st["kernel"]["release"] = NEW_RELEASE
        st["modules"]["loaded"] = ["snd_hda_intel"]
        for bdf in ("0000:01:00.0", "0000:02:00.0"):
            st["pci"]["devices"][bdf]["driver"] = None
    r = host.tool("/usr/sbin/dkms", "autoinstall")
    assert r.returncode == 1 and "Your kernel headers for kernel %s cannot be found" % NEW_RELEASE in r.stderr
    # the lab mirror has the headers for the new kernel
    host.install_headers(NEW_RELEASE)
    assert os.readlink(host.p("/lib/modules/%s/build" % NEW_RELEASE)) == "/usr/src/linux-headers-" + NEW_RELEASE
    r = host.tool("/usr/sbin/dkms", "autoinstall")
    assert r.returncode == 0, r.stderr
    r = host.tool("/usr/sbin/dkms", "status", "-m", "nvidia")
    assert sorted(r.stdout.strip().splitlines()) == sorted([
        "nvidia/%s, %s, x86_64: installed" % (VERSION, RELEASE),
        "nvidia/%s, %s, x86_64: installed" % (VERSION, NEW_RELEASE)])
    st = host.state()
    assert st["nvidia"]["kernel_modules"][NEW_RELEASE]["version"] == VERSION
    assert "nvidia" in st["modules"]["available"][NEW_RELEASE]
    r = host.tool("/usr/sbin/dkms", "install", "-m", "nvidia", "-v", VERSION, "-k", NEW_RELEASE)
    assert r.returncode == 0 and "already installed" in r.stdout
    r = host.run([host.p("/usr/sbin/dkms"), "--version"])  # executable through its sh/python3 header
    assert r.returncode == 0 and r.stdout.strip() == "dkms-3.0.10"
    # the uninstaller's `dkms remove --all` takes the module of every kernel DKMS built it for, not only the tree
    assert install(host, "--uninstall", "--silent").returncode == 0
    assert not os.path.exists(host.p("/lib/modules/%s/updates/dkms/nvidia.ko" % NEW_RELEASE))
    assert NEW_RELEASE not in host.state()["nvidia"]["kernel_modules"]


def test_installed_without_dkms_dkms_refuses_the_same_version_unless_forced(host):
    """--no-dkms: the sources and dkms.conf still go to /usr/src/nvidia-<version>, the modules to kernel/drivers/video,
    DKMS knows nothing. dkms 3.0.10 install adds the sources by itself (prepare_build), builds, and check_version_sanity
    refuses every module (the same version is already in the kernel's tree): "Installation aborted." (rc 6), the module
    left built. --force installs it into updates/dkms (which depmod's default search order puts first)."""
    dkms = "/usr/sbin/dkms"
    assert install(host, *[a if a != "--dkms" else "--no-dkms" for a in HOST]).returncode == 0
    assert os.path.exists(host.p("/usr/src/nvidia-%s/dkms.conf" % VERSION))
    assert host.tool(dkms, "status", "-m", "nvidia").stdout == ""
    r = host.tool(dkms, "install", "-m", "nvidia", "-v", VERSION, "-k", RELEASE)
    assert r.returncode == 6 and "Creating symlink /var/lib/dkms/nvidia/%s/source" % VERSION in r.stdout
    assert ("Module version %s for nvidia.ko\nexactly matches what is already found in kernel %s.\nDKMS will not replace "
            "this module.\nYou may override by specifying --force.\n" % (VERSION, RELEASE)) in r.stderr
    assert r.stderr.endswith("Error! Installation aborted.\n") and r.stderr.count("DKMS will not replace") == 5
    assert host.tool(dkms, "status", "-m", "nvidia").stdout == "nvidia/%s, %s, x86_64: built\n" % (VERSION, RELEASE)
    assert not os.path.exists(host.p("/lib/modules/%s/updates/dkms/nvidia.ko" % RELEASE))
    r = host.tool(dkms, "install", "--force", "-m", "nvidia", "-v", VERSION, "-k", RELEASE)
    assert r.returncode == 0 and "DKMS will not replace" not in r.stderr, r.stderr
    assert host.tool(dkms, "status", "-m", "nvidia").stdout == "nvidia/%s, %s, x86_64: installed\n" % (VERSION, RELEASE)
    assert os.path.exists(host.p("/lib/modules/%s/updates/dkms/nvidia.ko" % RELEASE))
    # remove takes DKMS's copy (and, the last kernel, the module from the tree); the installer's alone again, a plain
    # install is refused again: why the collection's rebuild of such a kernel passes --force
    assert host.tool(dkms, "remove", "-m", "nvidia", "-v", VERSION, "-k", RELEASE).returncode == 0
    assert host.tool(dkms, "status", "-m", "nvidia").stdout == ""
    assert host.tool(dkms, "install", "-m", "nvidia", "-v", VERSION, "-k", RELEASE).returncode == 6


def test_nvidia_modprobe_caps_and_no_driver(host):
    install(host, *USERSPACE)
    r = host.tool("/usr/bin/nvidia-modprobe", "-u", "-c=0")
    # userspace only: no nvidia module is built for the kernel, so nothing can be loaded or created
    assert r.returncode == 1 and not os.path.exists(host.p("/dev/nvidia-uvm"))
    assert install(host, *HOST).returncode == 0
    r = host.tool("/usr/bin/nvidia-modprobe", "-f", "/proc/driver/nvidia/capabilities/mig/config",
                  "-f", "/proc/driver/nvidia/capabilities/mig/monitor")
    assert r.returncode == 0, r.stderr
    caps = host.state()["majors"]["nvidia-caps"]
    assert chr_node(host.p("/dev/nvidia-caps/nvidia-cap1")) == (caps, 1)
    assert chr_node(host.p("/dev/nvidia-caps/nvidia-cap2")) == (caps, 2)
    # nvidia_cap_mknod takes only a path under /proc/driver/nvidia without "./"; the long option is the real one
    for bad in ("/tmp/mig/config", "/proc/driver/nvidia/./capabilities/mig/config"):
        assert host.tool("/usr/bin/nvidia-modprobe", "-f", bad).returncode == 1
    assert host.tool("/usr/bin/nvidia-modprobe", "--capability", "/proc/driver/nvidia/capabilities/mig/config").returncode == 1
    os.unlink(host.p("/dev/nvidia-caps/nvidia-cap1"))
    r = host.tool("/usr/bin/nvidia-modprobe", "--nvidia-capability-device-file=/proc/driver/nvidia/capabilities/mig/config")
    assert r.returncode == 0 and chr_node(host.p("/dev/nvidia-caps/nvidia-cap1")) == (caps, 1)


# --- systemctl ---------------------------------------------------------------------------

def unit(root, name, body):
    with open(root.p("/etc/systemd/system/" + name), "w") as f:
        f.write(body)


def test_systemctl_oneshot_enable_and_state(root, tmp_path):
    marker = tmp_path / "ran"
    unit(root, "kp-nodes.service", "[Unit]\nDescription=x\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
         "ExecStart=%s -c \"open('%s', 'a').write('1')\"\nExecStart=%s -c \"open('%s', 'a').write('2')\"\n"
         "[Install]\nWantedBy=multi-user.target\n" % (sys.executable, marker, sys.executable, marker))
    sc = "/usr/bin/systemctl"
    assert root.tool(sc, "is-enabled", "kp-nodes.service").stdout.strip() == "disabled"
    r = root.tool(sc, "enable", "kp-nodes.service")
    assert r.returncode == 0 and "Created symlink /etc/systemd/system/multi-user.target.wants/kp-nodes.service" in r.stderr
    assert os.path.islink(root.p("/etc/systemd/system/multi-user.target.wants/kp-nodes.service"))
    assert root.tool(sc, "is-enabled", "kp-nodes.service").stdout.strip() == "enabled"
    assert root.tool(sc, "is-active", "kp-nodes.service").stdout.strip() == "inactive"
    assert root.tool(sc, "start", "kp-nodes.service").returncode == 0
    assert marker.read_text() == "12"
    r = root.tool(sc, "is-active", "kp-nodes.service")
    assert r.stdout.strip() == "active" and r.returncode == 0
    assert root.tool(sc, "show", "-p", "ActiveState", "kp-nodes.service").stdout.strip() == "ActiveState=active"
    assert root.tool(sc, "start", "nope.service").returncode == 5
    assert root.tool(sc, "disable", "kp-nodes.service").returncode == 0
    assert root.tool(sc, "is-enabled", "kp-nodes.service").returncode == 1


def test_systemctl_simple_service_stop_ends_the_group(root):
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    unit(root, "kp-srv.service", "[Service]\nExecStart=%s -c \"%s\"\nKillMode=control-group\nTimeoutStopSec=5\n"
         "[Install]\nWantedBy=multi-user.target\n" % (sys.executable, child))
    sc = "/usr/bin/systemctl"
    try:
        assert root.tool(sc, "start", "kp-srv.service").returncode == 0
        deadline = time.time() + 5
        pids = []
        while time.time() < deadline:
            r = root.tool(sc, "status", "kp-srv.service")
            pids = [int(ln.split("\u2500", 1)[1].split()[0]) for ln in r.stdout.splitlines() if "\u2500" in ln]
            if len(pids) >= 2:
                break
            time.sleep(0.1)
        assert len(pids) >= 2, r.stdout
        assert root.tool(sc, "is-active", "kp-srv.service").stdout.strip() == "active"
        main = root.tool(sc, "show", "-p", "MainPID", "--value", "kp-srv.service").stdout.strip()
        assert int(main) in pids
    finally:
        assert root.tool(sc, "stop", "kp-srv.service").returncode == 0
    time.sleep(0.2)
    for pid in pids:
        assert not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split(") ")[1][0] == "Z"
    assert root.tool(sc, "is-active", "kp-srv.service").stdout.strip() == "inactive"


def test_systemctl_failing_oneshot(root):
    unit(root, "kp-bad.service", "[Service]\nType=oneshot\nExecStart=/bin/false\n")
    r = root.tool("/usr/bin/systemctl", "start", "kp-bad.service")
    assert r.returncode == 1 and "Job for kp-bad.service failed" in r.stderr
    assert root.tool("/usr/bin/systemctl", "is-active", "kp-bad.service").stdout.strip() == "failed"
    assert root.tool("/usr/bin/systemctl", "is-enabled", "kp-bad.service").stdout.strip() == "static"


def test_persistenced_under_systemctl(host):
    assert install(host, *HOST).returncode == 0
    unit(host, "nvidia-persistenced.service", "[Unit]\nDescription=NVIDIA Persistence Daemon\n[Service]\nType=forking\n"
         "ExecStart=%s %s --user host --persistence-mode\nExecStopPost=/bin/rm -rf %s\n[Install]\n"
         "WantedBy=multi-user.target\n" % (sys.executable, host.p("/usr/bin/nvidia-persistenced"),
                                           host.p("/var/run/nvidia-persistenced")))
    sc = "/usr/bin/systemctl"
    pm = "pynvml.nvmlInit()\nout['pm'] = pynvml.nvmlDeviceGetPersistenceMode(pynvml.nvmlDeviceGetHandleByIndex(0))\n"
    assert host.nvml(pm) == {"pm": 0}
    try:
        r = host.tool(sc, "start", "nvidia-persistenced.service")
        assert r.returncode == 0, r.stderr
        assert host.tool(sc, "is-active", "nvidia-persistenced.service").stdout.strip() == "active"
        pid = host.state()["nvidia"]["persistenced"]["pid"]
        assert int(host.tool(sc, "show", "-p", "MainPID", "--value", "nvidia-persistenced.service").stdout) == pid
        assert host.nvml(pm) == {"pm": 1}
        r = install(host, *HOST)  # the daemon holds the GPUs: the module cannot be replaced
        assert r.returncode == 1 and "NVIDIA Persistence Daemon" in r.stderr
    finally:
        assert host.tool(sc, "stop", "nvidia-persistenced.service").returncode == 0
    assert host.state()["nvidia"]["persistenced"] is None
    assert host.nvml(pm) == {"pm": 0}
    assert host.tool(sc, "is-active", "nvidia-persistenced.service").stdout.strip() == "inactive"
