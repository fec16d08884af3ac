"""The lab's container runtime (tests/lab/rootfs/usr/lib/kpro-lab/ct) and the container's init /
systemd stand-in (tests/lab/rootfs-ct), without the lab.

Needs root (namespaces, overlayfs, mknod); skipped otherwise. One scenario runs in a private
mount namespace (``unshare --mount --propagation private``): a temp node root holds
etc/pve/lxc/<vmid>.conf, var/lib/kpro-lab/state.json and device nodes under dev/; the CT base
rootfs is the host's own / (bound non-recursively), or $KPGS_LAB_CACHE/rootfs-bookworm when
it exists; the CT disk is a tmpfs (overlayfs cannot take an upper on the host's /). The
scenario prints one JSON document of observations that the tests assert on. Everything it
starts is ended by PID (the CT's init, which takes its pid namespace with it).
"""

import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
LAB = os.path.join(REPO, "tests", "lab")
LABLIB = os.path.join(LAB, "rootfs", "usr", "lib", "kpro-lab")
SEED = os.path.join(LAB, "rootfs-ct")

CONF = """\
#lab test container
arch: amd64
hostname: ct-test
memory: 4096
ostype: debian
rootfs: local-zfs:subvol-129-disk-0,size=8G
dev0: /dev/nvidia0,mode=0666
dev1: /dev/nvidiactl,gid=44,mode=0660,uid=0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file
lxc.mount.entry: /dev/nvidia0 dev/nvidia0-bound none bind,optional,create=file
[pve:pending]
hostname: not-yet
"""

CONF_MISSING_DEV = """\
hostname: ct-missing
dev0: /dev/nvidia0,mode=0666
dev1: /dev/nvidia-uvm,mode=0666
"""

FORKER = r"""
import os, sys, time
tag = sys.argv[1]
with open("/run/%s.inv" % tag, "a") as f:
    f.write(os.environ.get("INVOCATION_ID", "") + "\n")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:            # grandchild: re-parented to PID 1 when its parent exits
        with open("/run/%s.child" % tag, "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(1)
    os._exit(0)
os.wait()
with open("/run/%s.main" % tag, "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(1)
"""

SRV = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; print('child up', flush=True); time.sleep(300)"])
print("server_args=ServerArgs(port=30000, api_key='sk-lab-secret', admin_api_key=None)", flush=True)
open("/run/srv.ready", "w").write(str(os.getpid()))
time.sleep(300)
"""

UNIT = """\
[Unit]
Description=lab test %(tag)s

[Service]
Type=simple
Environment=TAG=%(tag)s
ExecStart=/usr/bin/python3 /root/forker.py ${TAG}
KillMode=%(mode)s
LimitNOFILE=4096:8192
TimeoutStopSec=5

[Install]
WantedBy=multi-user.target
"""

# --- the scenario (runs as ``python3 test_ct_runtime.py --scenario ROOT`` in the private mount ns) ---


def scenario(T):  # noqa: C901  one long, linear story
    import ctypes
    sys.path.insert(0, LABLIB)
    from ct import runtime

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the CT's init is re-parented to us
    obs = {}

    def ct(*argv, stdin=None):
        r = runtime.exec_in(129, list(argv), stdin=stdin, root=T)
        return {"rc": r.returncode, "out": r.stdout.decode(), "err": r.stderr.decode()}

    def py(code):
        return ct("/usr/bin/python3", "-c", code)

    def wait_file(path, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = ct("cat", path)
            if r["rc"] == 0 and r["out"].strip():
                return r["out"].strip()
            time.sleep(0.05)
        return None

    def alive_in_ct(pid):
        return py("import sys\ntry:\n    s=open('/proc/%d/stat').read().rsplit(')',1)[1].split()[0]\n"
                  "except OSError:\n    s='gone'\nprint(s)" % pid)["out"].strip()

    def show(unit, props):
        r = ct("systemctl", "show", "-p", ",".join(props), unit)
        return r, dict(line.split("=", 1) for line in r["out"].splitlines() if "=" in line)

    # missing devN device: PVE's message, nothing started
    try:
        runtime.start(130, root=T)
        obs["missing_dev"] = None
    except runtime.CTError as e:
        obs["missing_dev"] = str(e)
    obs["status130"] = runtime.status(130, root=T)

    pid = runtime.start(129, root=T)
    obs["init_pid"] = pid
    obs["status"] = runtime.status(129, root=T)
    with open(os.path.join(T, "var/lib/kpro-lab/state.json")) as f:
        obs["guest"] = json.load(f)["guests"]["129"]
    obs["hostname"] = ct("hostname")["out"].strip()
    obs["etc_hostname"] = ct("cat", "/etc/hostname")["out"].strip()
    obs["pid1_comm"] = ct("cat", "/proc/1/comm")["out"].strip()
    obs["env"] = ct("env")["out"]
    obs["devs"] = json.loads(py(
        "import os, json, stat\nout = {}\n"
        "for n in ('nvidia0', 'nvidiactl', 'nvidia-uvm', 'nvidia-modeset', 'nvidia0-bound', 'null'):\n"
        "    try:\n        s = os.stat('/dev/' + n)\n"
        "        out[n] = [os.major(s.st_rdev), os.minor(s.st_rdev), oct(stat.S_IMODE(s.st_mode)), s.st_uid, s.st_gid,"
        " stat.S_ISCHR(s.st_mode)]\n"
        "    except OSError:\n        out[n] = None\nprint(json.dumps(out))")["out"])
    obs["proc_driver"] = ct("cat", "/proc/driver/nvidia/version")["out"]
    obs["labstate_visible"] = ct("test", "-f", "/var/lib/kpro-lab/state.json")["rc"] == 0
    obs["ct_dir_masked"] = ct("ls", "-A", "/var/lib/kpro-lab/ct")["out"].strip()
    # (with the host's / as the base, the node root under /tmp is part of the CT's rootfs itself)
    obs["node_root_hidden"] = ct("test", "-e", T + "/etc/pve/lxc/129.conf")["rc"] != 0 or base_rootfs() == "/"
    obs["ps_pid1"] = ct("cat", "/proc/1/cmdline")["out"]

    # units
    with open(os.path.join(T, "forker.py"), "w") as f:
        f.write(FORKER)
    runtime.push(129, os.path.join(T, "forker.py"), "/root/forker.py", perms="0644", root=T)
    for tag, mode in (("cg", "control-group"), ("proc", "process")):
        path = os.path.join(T, "u.service")
        with open(path, "w") as f:
            f.write(UNIT % {"tag": tag, "mode": mode})
        runtime.push(129, path, "/etc/systemd/system/test-%s.service" % tag, root=T)
    obs["daemon_reload"] = ct("systemctl", "daemon-reload")
    obs["unknown_start"] = ct("systemctl", "start", "nosuch.service")
    obs["unknown_is_active"] = ct("systemctl", "is-active", "nosuch")
    obs["inactive_is_active"] = ct("systemctl", "is-active", "test-cg.service")
    obs["enable"] = ct("systemctl", "enable", "test-cg.service")
    obs["is_enabled"] = ct("systemctl", "is-enabled", "test-cg.service")

    # KillMode=control-group
    obs["cg_start"] = ct("systemctl", "start", "test-cg.service")
    child = int(wait_file("/run/cg.child") or 0)
    main = int(wait_file("/run/cg.main") or 0)
    r, p = show("test-cg.service", ["ActiveState", "SubState", "MainPID", "InvocationID", "ControlGroup", "NRestarts",
                                    "Result", "ExecMainStatus", "ExecMainCode"])
    obs["cg_show_raw"], obs["cg_show"] = r, p
    obs["cg_value"] = ct("systemctl", "show", "-p", "ActiveState", "--value", "test-cg.service")["out"]
    obs["cg_pids"] = [main, child]
    obs["cg_is_active"] = ct("systemctl", "is-active", "test-cg.service")
    obs["cg_limits"] = [ln for ln in ct("cat", "/proc/%d/limits" % main)["out"].splitlines() if "open files" in ln]
    obs["cg_procs"] = ct("cat", "/sys/fs/cgroup/system.slice/test-cg.service/cgroup.procs")["out"].split()
    obs["cg_inv_env"] = ct("cat", "/run/cg.inv")["out"].split()
    obs["cg_status"] = ct("systemctl", "status", "test-cg.service")
    obs["cg_restart"] = ct("systemctl", "restart", "test-cg.service")
    time.sleep(0.3)
    obs["cg_after_restart_old"] = [alive_in_ct(main), alive_in_ct(child)]
    _, p2 = show("test-cg.service", ["InvocationID", "MainPID"])
    obs["cg_inv2"] = p2.get("InvocationID")
    deadline = time.time() + 5
    while time.time() < deadline and len(ct("cat", "/run/cg.inv")["out"].split()) < 2:
        time.sleep(0.05)
    obs["cg_inv_env2"] = ct("cat", "/run/cg.inv")["out"].split()
    ct("rm", "-f", "/run/cg.child", "/run/cg.main")
    child2 = int(wait_file("/run/cg.child") or 0)
    main2 = int(p2.get("MainPID") or 0)
    obs["cg_stop"] = ct("systemctl", "stop", "test-cg.service")
    obs["cg_after_stop"] = [alive_in_ct(main2), alive_in_ct(child2)]
    _, obs["cg_show_stopped"] = show("test-cg.service", ["ActiveState", "SubState", "MainPID", "ControlGroup", "Result"])
    obs["cg_is_active_stopped"] = ct("systemctl", "is-active", "test-cg.service")

    # KillMode=process: the re-parented child survives and stays in the cgroup
    obs["proc_start"] = ct("systemctl", "start", "test-proc")
    pchild = int(wait_file("/run/proc.child") or 0)
    pmain = int(wait_file("/run/proc.main") or 0)
    obs["proc_stop"] = ct("systemctl", "stop", "test-proc")
    obs["proc_after_stop"] = [alive_in_ct(pmain), alive_in_ct(pchild)]
    obs["proc_child"] = pchild
    ct("systemctl", "status", "test-proc")  # any request refreshes the cgroup files
    obs["proc_procs"] = ct("cat", "/sys/fs/cgroup/system.slice/test-proc.service/cgroup.procs")["out"].split()
    _, obs["proc_show"] = show("test-proc.service", ["ActiveState", "ControlGroup"])
    obs["proc_is_active"] = ct("systemctl", "is-active", "test-proc")

    # failures, restarts, EnvironmentFile, oneshot, NeedDaemonReload
    units = {
        "flaky": "[Service]\nExecStart=/bin/sh -c 'exit 3'\nRestart=on-failure\nRestartSec=0.1\n",
        "envf": "[Service]\nType=oneshot\nEnvironmentFile=/etc/envf.env\nExecStart=/bin/sh -c 'echo \"$0 $1\" > /run/envf.out' "
                "${SECRET} $WORDS\n",
        "badshot": "[Service]\nType=oneshot\nExecStart=/bin/false\n",
        "limited": "[Unit]\nStartLimitBurst=2\nStartLimitIntervalSec=60\n[Service]\nExecStart=/bin/sleep 300\n",
    }
    for name, text in units.items():
        path = os.path.join(T, "u.service")
        with open(path, "w") as f:
            f.write(text)
        runtime.push(129, path, "/etc/systemd/system/%s.service" % name, root=T)
    with open(os.path.join(T, "envf.env"), "w") as f:
        f.write('SECRET="s3 cret"\nWORDS=a b\n')
    runtime.push(129, os.path.join(T, "envf.env"), "/etc/envf.env", perms="0600", root=T)
    obs["flaky_start"] = ct("systemctl", "start", "flaky")
    deadline = time.time() + 10
    while time.time() < deadline:
        _, fp = show("flaky.service", ["ActiveState", "Result", "NRestarts", "ExecMainStatus", "ExecMainCode"])
        if fp.get("ActiveState") == "failed":
            break
        time.sleep(0.1)
    obs["flaky_show"] = fp
    # systemd 252 unit_reset_failed(): reset-failed resets the start rate limit whatever the state (sglang_service relies on it)
    ct("systemctl", "start", "limited")
    ct("systemctl", "restart", "limited")       # 2 starts: the burst
    ct("systemctl", "reset-failed", "limited")  # while active
    obs["limited_restart"] = ct("systemctl", "restart", "limited")
    ct("systemctl", "stop", "limited")
    # the serve unit's launcher under this init: per-launch log through the redacting FIFO, Restart=on-failure after a
    # SIGKILL of the main process (issue 12)
    sys.path.insert(0, os.path.join(REPO, ".collections"))
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_unit as su
    for name, text, perms in (("launch", su.LAUNCHER_SCRIPT, "0755"), ("srv.py", SRV, "0644")):
        with open(os.path.join(T, name), "w") as f:
            f.write(text)
        runtime.push(129, os.path.join(T, name), "/root/%s" % name, perms=perms, root=T)
    with open(os.path.join(T, "u.service"), "w") as f:
        f.write("[Unit]\nStartLimitBurst=3\nStartLimitIntervalSec=60\n[Service]\n"
                "ExecStart=/root/launch /var/log/srv srv /usr/bin/python3 /root/srv.py\nRestart=on-failure\nRestartSec=0.2\n"
                "KillMode=control-group\nTimeoutStopSec=5\n")
    runtime.push(129, os.path.join(T, "u.service"), "/etc/systemd/system/srv.service", root=T)
    ct("systemctl", "start", "srv")
    wait_file("/run/srv.ready")
    _, before = show("srv.service", ["MainPID", "InvocationID", "NRestarts"])
    ct("rm", "-f", "/run/srv.ready")
    ct("kill", "-9", before["MainPID"])
    wait_file("/run/srv.ready")
    _, after = show("srv.service", ["MainPID", "InvocationID", "NRestarts", "ActiveState"])
    obs["srv"] = {"before": before, "after": after,
                  "logs": ct("sh", "-c", "cat /var/log/srv/srv-*.log")["out"], "ls": ct("ls", "-a", "/var/log/srv")["out"]}
    ct("systemctl", "stop", "srv")
    obs["envf_start"] = ct("systemctl", "start", "envf")
    obs["envf_out"] = ct("cat", "/run/envf.out")["out"]
    obs["badshot_start"] = ct("systemctl", "start", "badshot")
    _, obs["badshot_show"] = show("badshot.service", ["ActiveState", "Result", "ExecMainStatus"])
    ct("sh", "-c", "sleep 0.01; echo '# edited' >> /etc/systemd/system/test-cg.service")
    obs["reload_warn"] = ct("systemctl", "start", "test-cg")
    _, obs["reload_need"] = show("test-cg.service", ["NeedDaemonReload"])
    ct("systemctl", "daemon-reload")
    _, obs["reload_need2"] = show("test-cg.service", ["NeedDaemonReload"])
    obs["journal"] = ct("journalctl", "-u", "flaky", "--no-pager")["out"]

    # enabled unit comes back at the CT's next start; all CT processes end at stop
    ct_pids = []
    ns = os.readlink("/proc/%d/ns/pid" % pid)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink("/proc/%s/ns/pid" % d) == ns:
                    ct_pids.append(int(d))
            except OSError:
                pass
    obs["ct_pids_before"] = len(ct_pids)
    t0 = time.time()
    obs["stop"] = runtime.stop(129, timeout=15, root=T)
    obs["stop_s"] = time.time() - t0
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass

    def live(p):
        try:
            with open("/proc/%d/stat" % p) as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    obs["ct_pids_after"] = [p for p in ct_pids if live(p)]
    obs["status_after"] = runtime.status(129, root=T)
    with open(os.path.join(T, "var/lib/kpro-lab/state.json")) as f:
        obs["guest_after"] = json.load(f)["guests"]["129"]
    obs["overlay_mounted"] = any(os.path.join(T, "var/lib/kpro-lab/ct/129/root") in line for line in open("/proc/self/mounts"))

    # second boot: the disk persisted, the enabled unit is started by the init
    pid2 = runtime.start(129, root=T)
    deadline = time.time() + 10
    while time.time() < deadline:
        r = ct("systemctl", "is-active", "test-cg.service")
        if r["rc"] == 0:
            break
        time.sleep(0.1)
    obs["boot_is_active"] = ct("systemctl", "is-active", "test-cg.service")
    obs["boot_forker_kept"] = ct("test", "-f", "/root/forker.py")["rc"] == 0
    obs["hard_stop"] = runtime.stop(129, timeout=0, root=T)
    try:
        os.waitpid(pid2, 0)
    except ChildProcessError:
        pass
    obs["status_after2"] = runtime.status(129, root=T)
    print("OBS " + json.dumps(obs))


def prepare(T):
    """The temp node root."""
    for rel in ("etc/pve/lxc", "var/lib/kpro-lab/ct", "var/lib/kpro-lab/ct-base", "dev", "proc/driver/nvidia"):
        os.makedirs(os.path.join(T, rel), exist_ok=True)
    with open(os.path.join(T, "etc/pve/lxc/129.conf"), "w") as f:
        f.write(CONF)
    with open(os.path.join(T, "etc/pve/lxc/130.conf"), "w") as f:
        f.write(CONF_MISSING_DEV)
    with open(os.path.join(T, "var/lib/kpro-lab/state.json"), "w") as f:
        json.dump({"guests": {"129": {"type": "lxc", "status": "stopped", "pid": None}}}, f)
    with open(os.path.join(T, "proc/driver/nvidia/version"), "w") as f:
        f.write("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.126.09\n")
    import stat
    os.mknod(os.path.join(T, "dev/nvidia0"), stat.S_IFCHR | 0o666, os.makedev(195, 0))
    os.mknod(os.path.join(T, "dev/nvidiactl"), stat.S_IFCHR | 0o666, os.makedev(195, 255))


def base_rootfs():
    cache = os.path.join(os.environ.get("KPGS_LAB_CACHE", "/var/cache/kpgs-lab"), "rootfs-bookworm")
    return cache if os.path.isfile(os.path.join(cache, "usr/bin/python3")) else "/"


SETUP = ('set -e; mount -t tmpfs -o mode=755 ct "$1/var/lib/kpro-lab/ct"; '
         'mount --bind "$2" "$1/var/lib/kpro-lab/ct-base"; exec "$3" "$4" --scenario "$1"')


@pytest.fixture(scope="module")
def obs(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the CT runtime needs root (namespaces, overlayfs, mknod)")
    if not os.path.exists("/usr/bin/unshare") or not os.path.exists("/usr/bin/nsenter"):
        pytest.skip("util-linux unshare/nsenter needed")
    T = str(tmp_path_factory.mktemp("ctnode"))
    prepare(T)
    env = dict(os.environ, KPRO_LAB_CT_SEED=SEED, PYTHONDONTWRITEBYTECODE="1")
    env.pop("KPRO_LAB_ROOT", None)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", SETUP, "sh", T, base_rootfs(),
                        sys.executable, os.path.abspath(__file__)],
                       env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("OBS ")]
    assert r.returncode == 0 and lines, "scenario failed rc=%s\nstdout:\n%s\nstderr:\n%s\nconsole:\n%s" % (
        r.returncode, r.stdout[-3000:], r.stderr[-6000:], _console(T))
    return json.loads(lines[-1][4:])


def _console(T):
    try:
        with open(os.path.join(T, "var/lib/kpro-lab/ct/129/console.log")) as f:  # on the tmpfs: gone, usually
            return f.read()[-3000:]
    except OSError:
        return "(gone with the private mount namespace)"


# --- runtime ------------------------------------------------------------------------------

def test_missing_devn_device_fails_start_with_pve_message(obs):
    assert obs["missing_dev"] == "Device /dev/nvidia-uvm does not exist"
    assert obs["status130"] == "stopped"


def test_start_runs_init_and_records_guest(obs):
    assert obs["status"] == "running"
    assert obs["guest"] == {"type": "lxc", "status": "running", "pid": obs["init_pid"]}
    assert obs["pid1_comm"] == "systemd"
    assert "ctinit.py" in obs["ps_pid1"]


def test_hostname_from_live_config_not_pending(obs):
    assert obs["hostname"] == "ct-test"
    assert obs["etc_hostname"] == "ct-test"


def test_devn_nodes_and_mount_entries(obs):
    devs = obs["devs"]
    assert devs["nvidia0"] == [195, 0, "0o666", 0, 0, True]
    assert devs["nvidiactl"] == [195, 255, "0o660", 0, 44, True]
    assert devs["nvidia-uvm"] is None            # not passed through
    assert devs["nvidia-modeset"] is None        # optional mount entry, missing source: skipped
    assert devs["nvidia0-bound"][:2] == [195, 0]  # bind mount entry with create=file
    assert devs["null"][:2] == [1, 3]


def test_lab_plumbing_and_isolation(obs):
    assert "580.126.09" in obs["proc_driver"]
    assert obs["labstate_visible"]
    assert obs["ct_dir_masked"] == ""
    assert obs["node_root_hidden"]


def test_pct_exec_environment_is_clear(obs):
    env = dict(line.split("=", 1) for line in obs["env"].splitlines() if "=" in line)
    assert env.get("container") == "lxc"
    assert "KPRO_LAB_CGROUP" not in env and "KPRO_LAB_UNIT" not in env and "KPRO_LAB_CT_SEED" not in env


# --- systemctl ------------------------------------------------------------------------------

def test_systemctl_exit_codes(obs):
    assert obs["daemon_reload"]["rc"] == 0
    assert obs["unknown_start"]["rc"] == 5
    assert "Unit nosuch.service not found." in obs["unknown_start"]["err"]
    assert obs["unknown_is_active"]["rc"] == 3 and obs["unknown_is_active"]["out"] == "inactive\n"
    assert obs["inactive_is_active"]["rc"] == 3
    assert obs["enable"]["rc"] == 0 and "Created symlink" in obs["enable"]["err"]
    assert obs["is_enabled"]["out"] == "enabled\n"


def test_show_format_and_running_state(obs):
    assert obs["cg_start"]["rc"] == 0, obs["cg_start"]
    lines = obs["cg_show_raw"]["out"].splitlines()
    # systemd prints in its D-Bus reply's order (Service properties, then Unit ones), not in the order of -p
    assert [ln.split("=", 1)[0] for ln in lines] == ["MainPID", "Result", "NRestarts", "ExecMainCode", "ExecMainStatus",
                                                     "ControlGroup", "ActiveState", "SubState", "InvocationID"]
    p = obs["cg_show"]
    assert p["ActiveState"] == "active" and p["SubState"] == "running"
    assert int(p["MainPID"]) == obs["cg_pids"][0]
    assert p["ControlGroup"] == "/system.slice/test-cg.service"
    assert p["NRestarts"] == "0" and p["Result"] == "success"
    assert len(p["InvocationID"]) == 32 and int(p["InvocationID"], 16) >= 0
    assert obs["cg_value"] == "active\n"
    assert obs["cg_is_active"]["rc"] == 0 and obs["cg_is_active"]["out"] == "active\n"
    assert "Active: active (running)" in obs["cg_status"]["out"] and obs["cg_status"]["rc"] == 0


def test_limit_nofile_applied(obs):
    assert obs["cg_limits"][0].split()[3:5] == ["4096", "8192"]


def test_cgroup_procs_lists_reparented_child(obs):
    main, child = obs["cg_pids"]
    assert main and child
    assert str(main) in obs["cg_procs"] and str(child) in obs["cg_procs"]


def test_invocation_id_new_per_start_and_in_env(obs):
    first = obs["cg_show"]["InvocationID"]
    assert obs["cg_inv_env"] == [first]
    assert obs["cg_inv2"] and obs["cg_inv2"] != first
    assert obs["cg_inv_env2"] == [first, obs["cg_inv2"]]


def test_killmode_control_group_ends_all(obs):
    assert obs["cg_after_restart_old"] == ["gone", "gone"]
    assert obs["cg_stop"]["rc"] == 0
    assert obs["cg_after_stop"] == ["gone", "gone"]
    p = obs["cg_show_stopped"]
    assert p == {"ActiveState": "inactive", "SubState": "dead", "MainPID": "0", "ControlGroup": "", "Result": "success"}
    assert obs["cg_is_active_stopped"]["rc"] == 3


def test_killmode_process_leaves_child_in_cgroup(obs):
    assert obs["proc_start"]["rc"] == 0
    assert obs["proc_after_stop"][0] == "gone"
    assert obs["proc_after_stop"][1] in ("S", "R")
    assert str(obs["proc_child"]) in obs["proc_procs"]
    assert obs["proc_show"]["ControlGroup"] == "/system.slice/test-proc.service"
    assert obs["proc_is_active"]["out"] == "inactive\n"


def test_restart_on_failure_then_start_limit(obs):
    assert obs["flaky_start"]["rc"] == 0  # Type=simple: the start job succeeds, the process fails later
    p = obs["flaky_show"]
    assert p["ActiveState"] == "failed"
    assert p["Result"] == "start-limit-hit"
    assert int(p["NRestarts"]) == 5  # "restart counter is at 5", then "Start request repeated too quickly."
    assert (p["ExecMainCode"], p["ExecMainStatus"]) == ("1", "3")
    assert "Scheduled restart job" in obs["journal"]


def test_reset_failed_resets_the_start_limit_while_active(obs):
    assert obs["limited_restart"]["rc"] == 0, obs["limited_restart"]


def test_serve_launcher_redacts_and_a_killed_main_process_is_restarted(obs):
    s = obs["srv"]
    assert s["after"]["ActiveState"] == "active" and s["after"]["MainPID"] != s["before"]["MainPID"]
    assert s["after"]["InvocationID"] != s["before"]["InvocationID"]
    assert int(s["after"]["NRestarts"]) == int(s["before"]["NRestarts"]) + 1
    assert s["logs"].count("api_key='<redacted>'") == 2 and "sk-lab-secret" not in s["logs"]
    assert s["logs"].count("child up") == 2 and ".fifo" not in s["ls"]


def test_environment_file_expansion_and_oneshot(obs):
    assert obs["envf_start"]["rc"] == 0, obs["envf_start"]
    assert obs["envf_out"] == "s3 cret a\n"  # ${SECRET} stays one word, $WORDS splits
    assert obs["badshot_start"]["rc"] == 1
    assert obs["badshot_start"]["err"].startswith("Job for badshot.service failed because the control process exited")
    assert obs["badshot_show"] == {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "1"}


def test_edited_unit_needs_daemon_reload(obs):
    assert "changed on disk. Run 'systemctl daemon-reload' to reload units." in obs["reload_warn"]["err"]
    assert obs["reload_need"] == {"NeedDaemonReload": "yes"}
    assert obs["reload_need2"] == {"NeedDaemonReload": "no"}


# --- stop / restart of the CT ---------------------------------------------------------------

def test_stop_ends_every_container_process(obs):
    assert obs["ct_pids_before"] >= 2  # the init + the KillMode=process leftover
    assert obs["stop"] == "clean"
    assert obs["ct_pids_after"] == []
    assert obs["status_after"] == "stopped"
    assert obs["guest_after"] == {"type": "lxc", "status": "stopped", "pid": None}
    assert not obs["overlay_mounted"]


def test_enabled_unit_starts_at_boot_and_disk_persists(obs):
    assert obs["boot_is_active"]["out"] == "active\n"
    assert obs["boot_forker_kept"]
    assert obs["hard_stop"] == "killed"
    assert obs["status_after2"] == "stopped"


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--scenario":
    scenario(sys.argv[2])
