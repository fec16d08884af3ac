# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One lossless parser for PVE guest configs, containers (``/etc/pve/lxc/<vmid>.conf``) and VMs
(``/etc/pve/qemu-server/<vmid>.conf``): ``ConfigFile.parse(raw).render() == raw`` byte for byte, so an edit
changes only the lines it means to.

The two files differ only in details, held by a ``Dialect``: the pending section is ``[pve:pending]`` in a CT
config (pve-container, PVE/LXC/Config.pm) and ``[PENDING]`` in a VM config (qemu-server,
PVE/QemuServer.pm parse_vm_config), where ``[special:cloudinit]`` also exists; a CT config has raw
``lxc.*`` lines, ``description:`` and ``delete:`` lines. lxc_config.py (CT passthrough) and pve_guests.py
(VM references, detaching) both use it. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import re

_LXC_RE = re.compile(r"^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$")
_DESCR_RE = re.compile(r"^(description):\s*(.*\S)\s*$")
_DELETE_RE = re.compile(r"^delete:\s*(.*\S)\s*$")


class Dialect(object):
    """What differs between a CT and a VM config."""

    def __init__(self, name, pending_re, pending_name, section_re, key_re):
        self.name, self.pending_re, self.pending_name = name, pending_re, pending_name
        self.section_re, self.key_re = section_re, key_re


CT = Dialect("ct", re.compile(r"^\[pve:pending\]\s*$", re.I), "pve:pending", re.compile(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.I),
             re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$"))
VM = Dialect("vm", re.compile(r"^\[PENDING\]\s*$"), "PENDING", re.compile(r"^\[([^\]]+)\]\s*$"),
             re.compile(r"^([A-Za-z][A-Za-z0-9_\-]*):\s?(.*?)\s*$"))


class Line(object):
    """One line of the file. ``raw`` holds its exact text, newline included."""

    __slots__ = ("raw", "kind", "key", "value")

    def __init__(self, raw, kind, key=None, value=None):
        self.raw = raw
        self.kind = kind  # blank, comment, header, lxc, description, delete, key, unknown
        self.key = key
        self.value = value

    def __repr__(self):
        return "Line(%r)" % self.raw


def classify(raw, dialect=None):
    dialect = dialect or CT
    text = raw[:-1] if raw.endswith("\n") else raw
    if re.match(r"^\s*$", text):
        return Line(raw, "blank")
    if dialect.pending_re.match(text) or dialect.section_re.match(text):
        return Line(raw, "header")
    if text.startswith("#"):
        return Line(raw, "comment", value=text[1:])
    if dialect is VM:
        m = dialect.key_re.match(text)
        return Line(raw, "key", m.group(1), m.group(2)) if m else Line(raw, "unknown")
    m = _LXC_RE.match(text)
    if m:
        return Line(raw, "lxc", m.group(1), m.group(3))
    m = _DESCR_RE.match(text)
    if m:
        return Line(raw, "description", "description", m.group(2))
    m = _DELETE_RE.match(text)
    if m:
        return Line(raw, "delete", "delete", m.group(1))
    m = dialect.key_re.match(text)
    if m:
        return Line(raw, "key", m.group(1), m.group(2))
    return Line(raw, "unknown")


def split_lines(raw):
    """Split keeping line ends; PVE splits on ``\\n`` only."""
    if not raw:
        return []
    parts = raw.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


class Section(object):
    def __init__(self, name, kind, lines):
        self.name = name  # '' for main, 'pve:pending' (CT) / 'PENDING' (VM), or the snapshot name
        self.kind = kind  # main, pending, snapshot, special (a VM's [special:cloudinit])
        self.lines = lines  # the header line, if any, is lines[0]

    def keys(self):
        return [ln for ln in self.lines if ln.kind == "key"]

    def get(self, key):
        """The value PVE would read (the last occurrence wins), or None."""
        value = None
        for ln in self.lines:
            if ln.kind in ("key", "delete", "description") and ln.key == key:
                value = ln.value
        return value

    def lxc(self, key=None):
        return [ln for ln in self.lines if ln.kind == "lxc" and (key is None or ln.key == key)]


class ConfigFile(object):
    """A parsed guest config (CT by default, ``dialect=VM`` for a VM) that renders back to the exact input bytes."""

    def __init__(self, sections, dialect=None):
        self.sections = sections
        self.dialect = dialect or CT

    @classmethod
    def parse(cls, raw, dialect=None):
        dialect = dialect or CT
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "surrogateescape")
        sections = [Section("", "main", [])]
        for piece in split_lines(raw):
            ln = classify(piece, dialect)
            if ln.kind == "header":
                text = piece.strip()
                if dialect.pending_re.match(text):
                    sections.append(Section(dialect.pending_name, "pending", [ln]))
                else:
                    name = dialect.section_re.match(text).group(1)
                    sections.append(Section(name, "special" if name.startswith("special:") else "snapshot", [ln]))
                continue
            sections[-1].lines.append(ln)
        return cls(sections, dialect)

    def render(self):
        return "".join(ln.raw for s in self.sections for ln in s.lines)

    def to_bytes(self):
        return self.render().encode("utf-8", "surrogateescape")

    @property
    def main(self):
        return self.sections[0]

    @property
    def pending(self):
        for s in self.sections:
            if s.kind == "pending":
                return s
        return None

    @property
    def snapshots(self):
        return [s for s in self.sections if s.kind == "snapshot"]

    def unknown_lines(self):
        return [ln.raw.rstrip("\n") for s in self.sections for ln in s.lines if ln.kind == "unknown"]

    # ----------------------------------------------------------------- editing

    def _ensure_newline_before(self, section, index):
        """Make sure the line before ``index`` ends with a newline (a file without a final newline)."""
        if index > 0:
            prev = section.lines[index - 1]
            if not prev.raw.endswith("\n"):
                prev.raw += "\n"

    def _insert(self, section, index, line):
        self._ensure_newline_before(section, index)
        if index < len(section.lines) and not line.raw.endswith("\n"):
            line.raw += "\n"
        section.lines.insert(index, line)

    def set_key(self, key, value, section=None):
        """Set a normal key (``key: value``) in a section (main by default). Returns True if bytes changed."""
        section = section or self.main
        if key.startswith("lxc."):
            raise ValueError("use add_lxc/replace_line for lxc.* keys")
        existing = [i for i, ln in enumerate(section.lines) if ln.kind == "key" and ln.key == key]
        new_raw = "%s: %s\n" % (key, value)
        if existing:
            changed = False
            last = existing[-1]
            ln = section.lines[last]
            if ln.value != value:
                keep_nl = ln.raw.endswith("\n")
                ln.raw = new_raw if keep_nl else new_raw[:-1]
                ln.value = value
                changed = True
            for i in reversed(existing[:-1]):
                del section.lines[i]
                changed = True
            return changed
        self._insert(section, self._key_insert_index(section, key), Line(new_raw, "key", key, value))
        return True

    def delete_key(self, key, section=None):
        section = section or self.main
        before = len(section.lines)
        section.lines = [ln for ln in section.lines if not (ln.kind == "key" and ln.key == key)]
        return len(section.lines) != before

    @staticmethod
    def _key_insert_index(section, key):
        """Where PVE's sorted writer would put ``key``: before the first greater key, else after the last key."""
        last_content = 1 if section.kind != "main" else 0
        for i, ln in enumerate(section.lines):
            if ln.kind in ("key", "delete", "description"):
                if ln.key > key:
                    return i
                last_content = i + 1
            elif ln.kind == "comment" and last_content <= i:
                last_content = i + 1
            elif ln.kind == "lxc":
                return i if last_content <= i else last_content
        return last_content

    @staticmethod
    def _lxc_insert_index(section, key):
        """After the last line with the same lxc key, else after the last lxc line, else after the last key."""
        same = [i for i, ln in enumerate(section.lines) if ln.kind == "lxc" and ln.key == key]
        if same:
            return same[-1] + 1
        anylxc = [i for i, ln in enumerate(section.lines) if ln.kind == "lxc"]
        if anylxc:
            return anylxc[-1] + 1
        content = [i for i, ln in enumerate(section.lines) if ln.kind not in ("blank", "header")]
        if content:
            return content[-1] + 1
        return 1 if section.kind != "main" else 0

    def add_lxc(self, key, value, section=None):
        section = section or self.main
        raw = "%s: %s\n" % (key, value)
        self._insert(section, self._lxc_insert_index(section, key), Line(raw, "lxc", key, value))

    @staticmethod
    def replace_line(line, key, value):
        keep_nl = line.raw.endswith("\n")
        line.raw = "%s: %s%s" % (key, value, "\n" if keep_nl else "")
        line.key = key
        line.value = value

    def remove_lines(self, lines, section=None):
        section = section or self.main
        ids = set(id(ln) for ln in lines)
        section.lines = [ln for ln in section.lines if id(ln) not in ids]
