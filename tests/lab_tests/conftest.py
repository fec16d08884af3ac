"""Lab tests: need root and bring the lab up (tests/lab/labctl.py) for the session."""

import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LABCTL = os.path.join(REPO, "tests", "lab", "labctl.py")
RUN = os.path.join(REPO, "tests", "lab", ".run")
SSH_DIR = os.path.join(RUN, "ssh")
NODE_IP = "10.213.5.2"
sys.path.insert(0, os.path.join(REPO, "tests", "lab"))
sys.path.insert(0, os.path.join(REPO, "tests", "lab", "rootfs", "usr", "lib", "kpro-lab"))


def labctl(*args, check=True, **kw):
    return subprocess.run([sys.executable, LABCTL] + list(args), check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, **kw)


def lab_is_up():
    return labctl("status", check=False).returncode == 0


class Lab:
    ip = NODE_IP

    @property
    def release(self):
        """The node's Proxmox VE release (labctl.py up --release; the session's $KPGS_LAB_RELEASE, default pve8)."""
        return labctl("release").stdout.strip()

    @property
    def root(self):
        return labctl("root").stdout.strip()

    @property
    def ssh_args(self):
        return ["ssh", "-i", os.path.join(SSH_DIR, "id_ed25519"), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "UserKnownHostsFile=" + os.path.join(SSH_DIR, "known_hosts"), "-o", "StrictHostKeyChecking=yes",
                "root@" + NODE_IP]

    def ssh(self, command, check=True):
        return subprocess.run(self.ssh_args + [command], check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=60)

    def exec(self, *argv, check=True):
        return labctl("exec", "--", *argv, check=check)

    def sh(self, script, check=True):
        return self.exec("/bin/sh", "-c", script, check=check)

    def state(self):
        import labstate
        return labstate.load(self.root)

    def labctl(self, *args, check=True):
        return labctl(*args, check=check)


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("lab tests need root")
    # The tests start from a fresh node (a reset keeps nothing of an earlier run or demo),
    # and leave the lab as they found it: down if it was down. The node's release is $KPGS_LAB_RELEASE's (labctl
    # reads it; unset: pve8): `make lab-test-pve9` runs the PVE 9 set with it.
    started = not lab_is_up()
    found = None if started else labctl("release").stdout.strip()
    r = labctl("reset", check=False)
    assert r.returncode == 0, r.stderr + r.stdout
    yield Lab()
    if started:
        labctl("down")
    elif found != Lab().release:  # a lab found up stays up, on the release it had (a fresh node of it)
        labctl("reset", "--release", found)


# Secrets must appear in no process's argv and no file: shared by the secrecy tests.
def cmdlines():
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                out.append((int(pid), f.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            continue
    return out


def files_holding(secret, *tops):
    hits, needle = [], secret.encode()
    for top in tops:
        for d, _dirs, files in os.walk(top):
            for name in files:
                p = os.path.join(d, name)
                try:
                    if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < 64 * 2 ** 20:
                        with open(p, "rb") as f:
                            if needle in f.read():
                                hits.append(p)
                except OSError:
                    continue
    return hits


# The tests that need a serving lab (test_serve_safety's `serving` fixture, which converges only when the lab does not
# serve) run as one block, in this order, where the first of them sorts: they reuse one converge instead of one each (a
# converge is 1-2 min), as each leaves the lab serving the inventory's deployment. The kernel upgrade changes the node
# most (a new kernel, Secure Boot), so it comes last; the test after the block (test_caps_nodes) starts from a reset node.
SERVING = ("test_bad_inputs_serve.py", "test_broken_venv.py", "test_gpu_p2p.py", "test_paths_and_lock.py",
           "test_reasoning_parser.py", "test_runtime_toolchain.py", "test_serve_safety.py", "test_server_options.py",
           "test_verify.py", "test_sglang_upgrade.py", "test_rollback.py", "test_reboot.py", "test_kernel_upgrade.py")


def pytest_collection_modifyitems(session, config, items):
    def key(item):
        name = os.path.basename(str(item.fspath))
        if name in SERVING:
            return (SERVING[0], SERVING.index(name))
        return (name, 0)
    items.sort(key=key)  # stable: the order of the tests within a file is kept
