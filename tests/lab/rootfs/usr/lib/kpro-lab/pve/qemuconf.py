"""qemu-server VM configs, read-only (PVE::QemuServer::parse_vm_config grammar, enough for the lab)."""

import hashlib
import re

from pve.ctconf import decode_text

BOOLEANS = {"onboot", "template", "acpi", "kvm", "tablet", "numa", "protection", "agent_enabled", "localtime", "reboot",
            "freeze"}
INTEGERS = {"memory", "cores", "sockets", "vcpus", "balloon", "shares", "snaptime", "cpuunits", "migrate_downtime"}


def _value(key, value):
    if key in INTEGERS and re.fullmatch(r"-?\d+", value):
        return int(value)
    if key in BOOLEANS and value in ("0", "1"):
        return int(value)
    return value


def parse(raw, vmid):
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    res = {"digest": hashlib.sha1(raw).hexdigest(), "snapshots": {}, "pending": {}}
    conf = res
    descr = ""
    for line in raw.decode("utf-8", errors="replace").split("\n"):
        if re.fullmatch(r"\s*", line):
            continue
        m = re.fullmatch(r"\[(PENDING|special:cloudinit|[a-z][a-z0-9_\-]+)\]\s*", line, re.I)
        if m:
            if descr:
                conf["description"] = descr
            descr = ""
            name = m.group(1)
            if name.upper() == "PENDING":
                conf = res["pending"] = {}
            else:
                conf = res["snapshots"].setdefault(name, {})
            continue
        if line.startswith("#"):
            descr += decode_text(line[1:]) + "\n"
            continue
        m = re.fullmatch(r"([a-z][a-z_]*\d*):\s*(.+?)\s*", line)
        if m:
            conf[m.group(1)] = _value(m.group(1), m.group(2))
    if descr:
        conf["description"] = descr
    return res
