"""kpro lab: the node's shutdown and the userspace half of its boot (what systemd does around a reboot).

    python3 /usr/lib/kpro-lab/boot.py shutdown   # guests stopped, services stopped (by PID), volatile /run cleared
    python3 /usr/lib/kpro-lab/boot.py units      # enabled units in systemd order (a power-on of a kept disk)
    python3 /usr/lib/kpro-lab/boot.py boot       # units + PVE's start of onboot guests (pve-guests.service)

``labctl.py reboot`` runs ``shutdown``, then the kernel half (labstate.boot(): the next-boot kernel, modules from
the initramfs and /etc/modules, udev coldplug; /dev without the nodes nvidia-modprobe made), then ``boot``.
``labctl.py up`` runs ``units`` (the disk was kept, /dev is a fresh tmpfs: the device-node unit remakes the
NVIDIA nodes) before it resumes the guests that were running.

The units started: every unit enabled for multi-user.target (/etc/systemd/system/multi-user.target.wants/)
whose unit file an administrator or the collection installed under /etc/systemd/system, and dkms.service when
one is installed and enabled (Debian bookworm's dkms 3.0.10-8+deb12u1 ships none: its kernel hooks
/etc/kernel/postinst.d/dkms and header_postinst.d/dkms are its only autoinstall; see `dpkg-deb -c`). The stock
host's own units are the lab's processes (sshd, pveproxy), started by the node's init.

Order: systemd's After=/Before= between those units and pve-guests.service; units with no ordering are
concurrent in systemd, and the lab takes the worst case for the guests: pve-guests.service (ExecStart
``pvesh --nooutput create /nodes/localhost/startall``, pve-manager services/pve-guests.service) runs as soon as
the units ordered before it finished, every other unit after it, and dkms.service (a build takes minutes)
after every unit not ordered after it.

Journal: systemd's lines (src/core/job.c, unit.c, service.c: "Starting %s...", "Finished %s.", "Started %s.",
"%s: Main process exited, code=exited, status=%i/FAILURE", "%s: Failed with result 'exit-code'.", "Failed to
start %s.") and the units' output go to /var/log/kpro-lab/journal.log, one "-- Boot N --" section per boot; the
units' own output also stays in the systemctl stand-in's /run/kpro-lab-systemd/<unit>.log. PVE's start of
the guests is a ``startall`` task with one ``vzstart`` task per guest in the PVE task log (pvesh/API
/nodes/kpro5/tasks), as on a real host.
"""

import glob
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import labstate  # noqa: E402

ROOT = os.environ.get("KPRO_LAB_ROOT", "/")
WANTS = "etc/systemd/system/multi-user.target.wants"
UNIT_DIRS = ["etc/systemd/system", "run/systemd/system", "lib/systemd/system", "usr/lib/systemd/system"]
JOURNAL = "var/log/kpro-lab/journal.log"
GUESTS = "pve-guests.service"
DKMS = "dkms.service"


def P(rel):
    return os.path.join(ROOT, rel.lstrip("/"))


def journal(ident, text):
    os.makedirs(os.path.dirname(P(JOURNAL)), exist_ok=True)
    stamp = time.strftime("%b %d %H:%M:%S")
    with open(P(JOURNAL), "a") as f:
        for line in (text.rstrip("\n").splitlines() or [""]):
            f.write("%s kpro5 %s: %s\n" % (stamp, ident, line))


def unit_file(name):
    for d in UNIT_DIRS:
        p = P(os.path.join(d, name))
        if os.path.lexists(p):
            return p
    return None


def parse(name):
    """{key: [values]} of the unit's [Unit] section and Description (enough for ordering)."""
    out = {"After": [], "Before": [], "Description": name}
    path = unit_file(name)
    if not path:
        return out
    section = None
    for line in open(path).read().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Unit]" and "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            if k in ("After", "Before"):
                out[k] += v.split()
            elif k == "Description":
                out["Description"] = v
    return out


def enabled_units():
    """Units to start: the collection's/administrator's enabled units and an enabled dkms.service."""
    out = []
    for link in sorted(glob.glob(P(os.path.join(WANTS, "*")))):
        name = os.path.basename(link)
        path = unit_file(name)
        if not path:
            continue
        admin = os.path.dirname(path) == P("etc/systemd/system") and not os.path.islink(path)
        if admin or name == DKMS:
            out.append(name)
    return out


def order(units):
    """The worst-case start order (module docstring). Returns names, pve-guests.service included."""
    info = {u: parse(u) for u in units}
    info[GUESTS] = {"After": [], "Before": [], "Description": "PVE guests"}
    after = {u: set() for u in info}  # u starts after these
    for u, d in info.items():
        for a in d["After"]:
            if a in info:
                after[u].add(a)
        for b in d["Before"]:
            if b in info:
                after[b].add(u)

    def ancestors(u, seen=None):
        seen = set() if seen is None else seen
        for a in after[u]:
            if a not in seen:
                seen.add(a)
                ancestors(a, seen)
        return seen

    before_guests = ancestors(GUESTS)
    after_dkms = ancestors(DKMS) if DKMS in info else set()
    done, seq = set(), []
    while len(seq) < len(info):
        ready = [u for u in sorted(info) if u not in done and after[u] <= done]
        if not ready:  # an ordering cycle: systemd breaks it by dropping a job; the lab takes the rest in name order
            ready = [u for u in sorted(info) if u not in done]

        def rank(u):
            if u in before_guests:  # dkms.service, when the guests wait for it, as late as they allow
                return (1 if u == DKMS else 0, u)
            if u == GUESTS:
                return (2, u)
            if u == DKMS:
                return (4, u)
            return (5 if u in after_dkms else 3, u)
        pick = min(ready, key=rank)
        seq.append(pick)
        done.add(pick)
    return seq


def systemctl(*args):
    return subprocess.run(["systemctl"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)


def start_unit(name):
    d = parse(name)
    typ = "oneshot"
    path = unit_file(name)
    if path and "Type=forking" in open(path).read():
        typ = "forking"
    elif path and "Type=oneshot" not in open(path).read():
        typ = "simple"
    journal("systemd[1]", "Starting %s..." % d["Description"])
    r = systemctl("start", name)
    log = P("run/kpro-lab-systemd/%s.log" % name)
    if os.path.exists(log) and open(log).read().strip():
        journal(name.rsplit(".", 1)[0], open(log).read())
    if r.stdout.strip():
        journal("systemctl", r.stdout)
    if r.returncode == 0:
        journal("systemd[1]", ("Finished %s." if typ == "oneshot" else "Started %s.") % d["Description"])
        return True
    st = {}
    try:
        import json
        st = json.load(open(P("run/kpro-lab-systemd/%s.json" % name)))
    except (OSError, ValueError):
        pass
    journal("systemd[1]", "%s: Main process exited, code=exited, status=%s/FAILURE" % (name, st.get("status", 1)))
    journal("systemd[1]", "%s: Failed with result 'exit-code'." % name)
    journal("systemd[1]", "Failed to start %s." % d["Description"])
    return False


def start_guests():
    """pve-guests.service: ExecStart=/usr/bin/pvesh --nooutput create /nodes/localhost/startall."""
    journal("systemd[1]", "Starting PVE guests...")
    r = subprocess.run(["pvesh", "--nooutput", "create", "/nodes/localhost/startall"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    journal("pve-guests[%d]" % os.getpid(), r.stdout)
    journal("systemd[1]", "Finished PVE guests." if r.returncode == 0 else "Failed to start PVE guests.")
    return r.returncode == 0


def cmd_units(guests):
    st = labstate.load(ROOT)
    k = st.get("kernel") or {}
    journal("kernel", "Linux version %s (kpro lab) #1 SMP PREEMPT_DYNAMIC PMX" % k.get("release"))
    journal("kernel", "Command line: %s" % k.get("cmdline", ""))
    if k.get("secure_boot"):
        journal("kernel", "secureboot: Secure boot enabled")
    failed = []
    for name in order(enabled_units()):
        if name == GUESTS:
            if guests:
                start_guests()
            continue
        if not start_unit(name):
            failed.append(name)
    print("units started%s" % ((", failed: " + " ".join(failed)) if failed else ""))
    return 0


def cmd_shutdown():
    journal("systemd[1]", "Stopping PVE guests...")
    st = labstate.load(ROOT)
    for vmid, g in sorted((st.get("guests") or {}).items()):
        if g.get("status") != "running":
            continue
        if g.get("type") == "lxc":
            r = subprocess.run(["pct", "stop", str(vmid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, check=False)
            journal("pve-guests[%d]" % os.getpid(), "Stopping CT %s%s" % (vmid, (": " + r.stdout.strip()) if r.returncode else ""))
        else:
            pidfile = P("run/qemu-server/%s.pid" % vmid)
            try:
                pid = int(open(pidfile).read().split()[0])
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
            journal("pve-guests[%d]" % os.getpid(), "Stopping VM %s" % vmid)
    for path in sorted(glob.glob(P("run/kpro-lab-systemd/*.json"))):
        name = os.path.basename(path)[:-5]
        if systemctl("is-active", name).stdout.strip() in ("active", "activating"):
            systemctl("stop", name)
            journal("systemd[1]", "Stopped %s." % parse(name)["Description"])
    # /run is a tmpfs: what the services left there is gone after the reboot
    for rel in ("run/kpro-lab-systemd", "run/nvidia-persistenced"):
        subprocess.run(["rm", "-rf", P(rel)], check=False)
    for pidfile in glob.glob(P("run/qemu-server/*.pid")):
        os.unlink(pidfile)
    journal("systemd[1]", "Reached target System Reboot.")
    with labstate.modify(ROOT) as st:
        for g in (st.get("guests") or {}).values():
            if g.get("type") == "qemu":
                g["status"], g["pid"] = "stopped", None
    print("shut down")
    return 0


def main(argv):
    cmd = argv[0] if argv else ""
    if cmd == "shutdown":
        return cmd_shutdown()
    if cmd == "units":
        return cmd_units(guests=False)
    if cmd == "boot":
        k = labstate.load(ROOT).get("kernel") or {}
        os.makedirs(os.path.dirname(P(JOURNAL)), exist_ok=True)
        with open(P(JOURNAL), "a") as f:
            f.write("-- Boot %s --\n" % k.get("boots"))
        return cmd_units(guests=True)
    sys.stderr.write("usage: boot.py shutdown|units|boot\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
