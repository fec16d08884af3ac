"""Run a command holding the lab's lock: ``.venv/bin/python tests/tools/lablock.py CMD [ARGS...]``.

The lab's network namespaces, node names and addresses are global to the machine, so two labs at once tear each
other down (a second ``labctl up`` sees a lab "partly up" and resets it under the first one's tests). Every make target
that uses the lab (lab-test, molecule, demo, drill, bench) runs under this lock.

The lock is flock(2) on /tmp/kpgs-lab.lock, the lock ``flock /tmp/kpgs-lab.lock CMD`` takes, so a command already run
under such a flock (its holder, in /proc/locks, is one of this process's ancestors) goes on at once instead of waiting
for itself. Otherwise it waits, and says for whom. The lock is taken on an inherited descriptor and the command is
exec'd, so it is held exactly as long as the command runs and released when it ends, however it ends.

Written here rather than with flock(1) alone: flock(1) cannot tell an ancestor's lock from a stranger's, and
``flock FILE make test`` then waits for itself forever.
"""

import fcntl
import os
import sys

LOCK = os.environ.get("KPGS_LAB_LOCK", "/tmp/kpgs-lab.lock")


def holders(path):
    """PIDs that hold a lock on ``path`` (from /proc/locks: ``N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...``)."""
    st = os.stat(path)
    ident = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    out = set()
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if "->" in parts:       # a waiter, not a holder
            continue
        if len(parts) >= 6 and parts[5] == ident:
            try:
                out.add(int(parts[4]))
            except ValueError:
                pass
    return out


def ancestors(pid):
    out = set()
    while pid > 1:
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        out.add(pid)
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def main(argv):
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    fd = os.open(LOCK, os.O_RDONLY | os.O_CREAT, 0o644)     # flock needs no write access: any user can wait on it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held = holders(LOCK)
        if held & (ancestors(os.getpid()) | {os.getpid()}):
            os.close(fd)        # run under an ancestor's lock (or this very process's, exec'd from lablock): go on
            os.execvp(argv[0], argv)
        sys.stderr.write("lablock: waiting for the lab lock %s, held by %s\n"
                         % (LOCK, "; ".join("PID %d (%s)" % (p, cmdline(p)[:120]) for p in sorted(held)) or "?"))
        sys.stderr.flush()
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.set_inheritable(fd, True)    # held by the exec'd command, released when it ends
    os.execvp(argv[0], argv)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
