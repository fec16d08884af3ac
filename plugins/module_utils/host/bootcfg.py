# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persistent vfio-pci bindings: find them and take *our* device ids out of them.

Where a passthrough setup binds a device to vfio-pci at boot (pve-docs 9.1.3: system-booting.adoc "Editing the
Kernel Commandline" and GRUB "Configuration"; qm-pci-passthrough.adoc "General Requirements" (/etc/modules) and
"Host Device Passthrough" / "Host Configuration" (modprobe.d); the other places are modprobe.d(5),
modules-load.d(5) and initramfs-tools(7) ones that third-party guides use):

- the kernel command line: ``/etc/kernel/cmdline`` (proxmox-boot-tool / systemd-boot) and
  ``GRUB_CMDLINE_LINUX[_DEFAULT]`` in ``/etc/default/grub`` and ``/etc/default/grub.d/*.cfg``
  (``vfio-pci.ids=`` / ``vfio_pci.ids=``, ``modprobe.blacklist=nvidia``);
- ``/etc/modprobe.d/*.conf``: ``options vfio-pci ids=``, ``softdep <gpu driver> pre: vfio-pci``,
  ``blacklist nvidia``, ``install nvidia /bin/false``;
- ``/etc/modules``, ``/etc/modules-load.d/*.conf``, ``/etc/initramfs-tools/modules``: the vfio modules.

Every editor here is a pure text transform, ``text -> (new_text, changes)``. A line that is not
changed comes back byte for byte (comments, spacing, quoting, order, CRLF line endings, a missing
final newline); inside a changed line only the affected token and one whitespace run next to it
go. ``changes`` is a list of dicts ``{"line": n, "action": "modified"|"removed"|"warning",
"before": ..., "after": ..., "detail": ...}`` (1-based line numbers, line text without its
end of line). Applying an editor to its own output changes nothing.
"""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import read_text

VFIO_ID_PARAMS = ("vfio-pci.ids", "vfio_pci.ids")

# Passthrough guides add these so that the host's framebuffer lets go of the GPU. Harmless for a
# host driver, so they are dropped only when asked (drop_framebuffer_tokens).
FRAMEBUFFER_TOKENS = ("nofb", "nomodeset", "initcall_blacklist=sysfb_init")
_VIDEO_OFF_RE = re.compile(r"^(?:efifb|vesafb|simplefb):off$")

# Modules that a passthrough setup blacklists so that the host does not grab the GPU, and that the
# host driver needs: their blacklist / install-false / alias-off lines go. NOT in this set, and so
# kept on purpose:
# - nouveau: the NVIDIA driver needs nouveau off; the .run installer writes its own
#   /etc/modprobe.d/nvidia-installer-disable-nouveau.conf with the same "blacklist nouveau".
# - nvidiafb, rivafb: legacy framebuffer drivers that conflict with the NVIDIA driver (distributions
#   blacklist them by default in blacklist-framebuffer.conf).
# - snd_hda_intel and anything else: not the GPU driver; other devices may rely on it.
NVIDIA_DRIVER_MODULES = frozenset(["nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem"])

# softdep "<module> pre: vfio-pci" lines whose vfio-pci dependency goes in any case (GPU drivers
# only exist for the GPU), and the ones where it goes only when no device stays on vfio-pci
# (another passed-through device may need vfio-pci loaded before them).
SOFTDEP_GPU_MODULES = NVIDIA_DRIVER_MODULES | frozenset(["nouveau", "nvidiafb"])
SOFTDEP_SHARED_MODULES = frozenset(["snd_hda_intel"])

VFIO_MODULES = frozenset(["vfio", "vfio_iommu_type1", "vfio_pci", "vfio_virqfd"])
_FALSE_COMMANDS = frozenset(["/bin/false", "/usr/bin/false", "/bin/true", "/usr/bin/true", "false", "true"])

_LINE_RE = re.compile(r"[^\n]*\n|[^\n]+")


# --------------------------------------------------------------------------- small helpers


def modname(name):
    """Module names: ``-`` and ``_`` are the same to modprobe."""
    return name.replace("-", "_")


def norm_id(value):
    """``10DE:2230`` / ``0x10de:0x2230`` / ``10de:2230:ffff:ffff`` -> ``10de:2230``; None when not an id."""
    parts = value.strip().strip("\"'").lower().split(":")
    if len(parts) < 2:
        return None
    out = []
    for p in parts[:2]:
        if p.startswith("0x"):
            p = p[2:]
        if not re.match(r"^[0-9a-f]{1,4}$", p):
            return None
        out.append(p.zfill(4))
    return "%s:%s" % (out[0], out[1])


def norm_ids(ids):
    out = set()
    for i in ids or ():
        n = norm_id(i)
        if n is None:
            raise ValueError("not a PCI vendor:device id (for example 10de:2230): %r" % (i,))
        out.add(n)
    return out


def split_lines(text):
    """``[(body, eol), ...]`` where eol is ``\\n``, ``\\r\\n`` or ``""``; ``"".join(b + e)`` == text."""
    out = []
    for chunk in _LINE_RE.findall(text):
        if chunk.endswith("\r\n"):
            out.append((chunk[:-2], "\r\n"))
        elif chunk.endswith("\n"):
            out.append((chunk[:-1], "\n"))
        else:
            out.append((chunk, ""))
    return out


class _Tokens(object):
    """Whitespace-separated tokens of a string with the whitespace kept, for minimal edits.

    ``str(t)`` gives the text back unchanged until a token is replaced or removed. Removing a
    token takes the whitespace before it (or, for the first token, lets the next token inherit
    the leading whitespace), so ``"a X b"`` -> ``"a b"``, ``"X a"`` -> ``"a"``.
    """

    def __init__(self, text):
        parts = re.split(r"(\s+)", text)
        # parts: token, ws, token, ws, ..., token (first/last token may be "")
        self.pairs = []  # [sep_before, token]
        self.trailing = ""
        sep = ""
        for i, p in enumerate(parts):
            if i % 2 == 1:
                sep += p
            elif p:
                self.pairs.append([sep, p])
                sep = ""
        self.trailing = sep

    def tokens(self):
        return [p[1] for p in self.pairs]

    def remove(self, index):
        sep = self.pairs[index][0]
        del self.pairs[index]
        if index == 0 and self.pairs:
            self.pairs[0][0] = sep

    def replace(self, index, token):
        self.pairs[index][1] = token

    def __str__(self):
        return "".join(s + t for s, t in self.pairs) + self.trailing


def _filter_list(value, drop):
    """``"a,b,c"`` without the items for which ``drop(item)``; returns (new value or None when empty, dropped)."""
    items = value.split(",")
    kept = [i for i in items if not drop(i)]
    dropped = [i for i in items if drop(i)]
    if not dropped:
        return value, []
    if not [i for i in kept if i.strip()]:
        return None, dropped
    return ",".join(kept), dropped


def _unquote(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0], value[1:-1]
    return "", value


# --------------------------------------------------------------------------- kernel command line


def _edit_cmdline_tokens(text, ids, drop_framebuffer_tokens=False, remove_nvidia_blacklist=True):
    """Edit one command line string. Returns (new, details) where details name what went."""
    toks = _Tokens(text)
    details = []
    i = 0
    while i < len(toks.pairs):
        tok = toks.pairs[i][1]
        key, eq, value = tok.partition("=")
        new = tok
        if eq and key in VFIO_ID_PARAMS:
            q, inner = _unquote(value)
            kept, dropped = _filter_list(inner, lambda x: norm_id(x) in ids)
            if dropped:
                new = None if kept is None else "%s=%s%s%s" % (key, q, kept, q)
                details.append("removed %s from %s" % (",".join(dropped), key))
        elif eq and key in ("modprobe.blacklist", "module_blacklist") and remove_nvidia_blacklist:
            q, inner = _unquote(value)
            kept, dropped = _filter_list(inner, lambda x: modname(x.strip()) in NVIDIA_DRIVER_MODULES)
            if dropped:
                new = None if kept is None else "%s=%s%s%s" % (key, q, kept, q)
                details.append("removed %s from %s" % (",".join(dropped), key))
        elif drop_framebuffer_tokens and (tok in FRAMEBUFFER_TOKENS or
                                          (key == "video" and eq and value and
                                           all(_VIDEO_OFF_RE.match(v) for v in value.split(",")))):
            new = None
            details.append("removed %s" % tok)
        if new is None:
            toks.remove(i)
            continue
        if new != tok:
            toks.replace(i, new)
        i += 1
    return str(toks), details


def edit_kernel_cmdline(text, ids, drop_framebuffer_tokens=False, remove_nvidia_blacklist=True):
    """``/etc/kernel/cmdline`` (one line; every line is treated as command line text)."""
    ids = norm_ids(ids)
    out = []
    changes = []
    for n, (body, eol) in enumerate(split_lines(text), 1):
        new, details = _edit_cmdline_tokens(body, ids, drop_framebuffer_tokens, remove_nvidia_blacklist)
        if new != body:
            changes.append({"line": n, "action": "modified", "before": body, "after": new, "detail": "; ".join(details)})
        out.append(new + eol)
    return "".join(out), changes


_GRUB_RE = re.compile(r"^(\s*(?:export\s+)?(GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=)(.*)$")
_DQ_RE = re.compile(r'^"((?:[^"\\]|\\.)*)"(.*)$')
_SQ_RE = re.compile(r"^'([^']*)'(.*)$")
_UQ_RE = re.compile(r"^(\S*)(.*)$")


def _parse_grub_value(rest):
    """``"..." # c`` -> (quote, value, tail) or None when the quote does not close on this line."""
    if rest.startswith('"'):
        m = _DQ_RE.match(rest)
        q = '"'
    elif rest.startswith("'"):
        m = _SQ_RE.match(rest)
        q = "'"
    else:
        m = _UQ_RE.match(rest)
        q = ""
    if not m:
        return None
    return q, m.group(1), m.group(2)


def edit_grub_default(text, ids, drop_framebuffer_tokens=False, remove_nvidia_blacklist=True):
    """``/etc/default/grub`` and ``/etc/default/grub.d/*.cfg``: every ``GRUB_CMDLINE_LINUX`` and
    ``GRUB_CMDLINE_LINUX_DEFAULT`` assignment (all of them: later ones may append to earlier ones)."""
    ids = norm_ids(ids)
    out = []
    changes = []
    for n, (body, eol) in enumerate(split_lines(text), 1):
        m = _GRUB_RE.match(body)
        if not m:
            out.append(body + eol)
            continue
        parsed = _parse_grub_value(m.group(3))
        if parsed is None:
            changes.append({"line": n, "action": "warning", "before": body, "after": body,
                            "detail": "%s: the quoted value does not end on this line; not edited, check it by hand" % m.group(2)})
            out.append(body + eol)
            continue
        q, value, tail = parsed
        new_value, details = _edit_cmdline_tokens(value, ids, drop_framebuffer_tokens, remove_nvidia_blacklist)
        if new_value != value:
            new = "%s%s%s%s%s" % (m.group(1), q, new_value, q, tail)
            changes.append({"line": n, "action": "modified", "before": body, "after": new,
                            "detail": "%s: %s" % (m.group(2), "; ".join(details))})
            body = new
        out.append(body + eol)
    return "".join(out), changes


def cmdline_vfio_ids(text):
    """Every id in ``vfio-pci.ids=`` tokens of a command line string (``/proc/cmdline``)."""
    found = set()
    for tok in text.split():
        key, eq, value = tok.partition("=")
        if eq and key in VFIO_ID_PARAMS:
            for i in _unquote(value)[1].split(","):
                n = norm_id(i)
                if n:
                    found.add(n)
    return found


def cmdline_blacklisted_nvidia(text):
    """NVIDIA driver modules named in ``modprobe.blacklist=`` / ``module_blacklist=`` of a command line."""
    found = set()
    for tok in text.split():
        key, eq, value = tok.partition("=")
        if eq and key in ("modprobe.blacklist", "module_blacklist"):
            found.update(m for m in (modname(x.strip()) for x in _unquote(value)[1].split(",")) if m in NVIDIA_DRIVER_MODULES)
    return found


def grub_cmdline_values(text):
    """The values of every GRUB_CMDLINE_LINUX[_DEFAULT] assignment, in order."""
    values = []
    for body, _eol in split_lines(text):
        m = _GRUB_RE.match(body)
        if m:
            parsed = _parse_grub_value(m.group(3))
            if parsed:
                values.append(parsed[1])
    return values


# --------------------------------------------------------------------------- modprobe.d


def _edit_ids_params(toks, start, ids, details, label):
    """Edit ``ids=`` params from token ``start`` on; returns whether any param token is left."""
    i = start
    while i < len(toks.pairs):
        tok = toks.pairs[i][1]
        key, eq, value = tok.partition("=")
        if eq and key == "ids":
            q, inner = _unquote(value)
            kept, dropped = _filter_list(inner, lambda x: norm_id(x) in ids)
            if dropped:
                details.append("removed %s from %s ids=" % (",".join(dropped), label))
                if kept is None:
                    toks.remove(i)
                    continue
                toks.replace(i, "ids=%s%s%s" % (q, kept, q))
        i += 1
    return len(toks.pairs) > start


def edit_modprobe_conf(text, ids, keep_vfio=True, remove_nvidia_blacklist=True):
    """One ``/etc/modprobe.d/*.conf`` file.

    - ``options vfio-pci|vfio_pci ... ids=a,b ...``: our ids go; an empty ``ids=`` goes; a line
      left with no parameters goes. Other parameters (``disable_vga=1``) stay.
    - ``softdep <m> pre: vfio-pci ...``: the vfio-pci dependency goes for GPU drivers (nvidia*,
      nouveau), and for snd_hda_intel only when ``keep_vfio`` is false (no device stays on
      vfio-pci). Other dependencies stay; an empty ``pre:`` goes; a softdep left with nothing goes.
    - with ``remove_nvidia_blacklist``: ``blacklist nvidia|nvidia_drm|nvidia_modeset|nvidia_uvm|
      nvidia_peermem``, ``install <those> /bin/false`` (or true), ``alias <those> off`` go.
      ``blacklist nouveau`` / ``nvidiafb`` stay (see NVIDIA_DRIVER_MODULES).
    """
    ids = norm_ids(ids)
    softdep_mods = SOFTDEP_GPU_MODULES if keep_vfio else (SOFTDEP_GPU_MODULES | SOFTDEP_SHARED_MODULES)
    out = []
    changes = []
    for n, (body, eol) in enumerate(split_lines(text), 1):
        stripped = body.strip()
        if not stripped or stripped.startswith("#") or body.rstrip().endswith("\\"):
            out.append(body + eol)
            continue
        toks = _Tokens(body)
        words = toks.tokens()
        cmd = words[0]
        details = []
        remove_line = False
        if cmd == "options" and len(words) >= 2 and modname(words[1]) == "vfio_pci":
            left = _edit_ids_params(toks, 2, ids, details, "options %s" % words[1])
            remove_line = bool(details) and not left
        elif cmd == "softdep" and len(words) >= 2 and modname(words[1]) in softdep_mods:
            section = None
            i = 2
            while i < len(toks.pairs):
                w = toks.pairs[i][1]
                if w in ("pre:", "post:"):
                    section = w
                elif section == "pre:" and modname(w) == "vfio_pci":
                    toks.remove(i)
                    details.append("removed the %s dependency of %s" % (w, words[1]))
                    continue
                i += 1
            if details:
                # drop a "pre:" / "post:" keyword with no module after it
                i = 2
                while i < len(toks.pairs):
                    w = toks.pairs[i][1]
                    nxt = toks.pairs[i + 1][1] if i + 1 < len(toks.pairs) else None
                    if w in ("pre:", "post:") and (nxt is None or nxt in ("pre:", "post:")):
                        toks.remove(i)
                        continue
                    i += 1
                remove_line = len(toks.pairs) <= 2
        elif remove_nvidia_blacklist and cmd == "blacklist" and len(words) == 2 and modname(words[1]) in NVIDIA_DRIVER_MODULES:
            remove_line = True
            details.append("removed the blacklist of %s (the host driver needs it)" % words[1])
        elif (remove_nvidia_blacklist and cmd == "install" and len(words) == 3 and modname(words[1]) in NVIDIA_DRIVER_MODULES
              and words[2] in _FALSE_COMMANDS):
            remove_line = True
            details.append("removed 'install %s %s' (it stops the host driver from loading)" % (words[1], words[2]))
        elif (remove_nvidia_blacklist and cmd == "alias" and len(words) == 3 and modname(words[1]) in NVIDIA_DRIVER_MODULES
              and words[2] == "off"):
            remove_line = True
            details.append("removed 'alias %s off'" % words[1])
        if not details:
            out.append(body + eol)
            continue
        if remove_line:
            changes.append({"line": n, "action": "removed", "before": body, "after": None, "detail": "; ".join(details)})
            continue
        new = str(toks)
        changes.append({"line": n, "action": "modified", "before": body, "after": new, "detail": "; ".join(details)})
        out.append(new + eol)
    return "".join(out), changes


def modprobe_vfio_ids(text):
    """Ids in ``options vfio-pci ids=`` lines of a modprobe.d file (or of an /etc/modules file)."""
    found = set()
    for body, _eol in split_lines(text):
        words = body.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "options" and len(words) >= 2 and modname(words[1]) == "vfio_pci":
            params = words[2:]
        elif modname(words[0]) == "vfio_pci":  # /etc/modules: "vfio_pci ids=..."
            params = words[1:]
        else:
            continue
        for p in params:
            key, eq, value = p.partition("=")
            if eq and key == "ids":
                found.update(n for n in (norm_id(i) for i in _unquote(value)[1].split(",")) if n)
    return found


# --------------------------------------------------------------------------- /etc/modules


def edit_modules_list(text, ids, keep_vfio):
    """``/etc/modules``, ``/etc/modules-load.d/*.conf``, ``/etc/initramfs-tools/modules``.

    Our ids go from a ``vfio_pci ids=...`` line. The vfio module lines (vfio, vfio_iommu_type1,
    vfio_pci, vfio_virqfd) go only when ``keep_vfio`` is false, that is when no device stays
    bound to vfio-pci anywhere; a vfio line that still carries parameters stays.
    """
    ids = norm_ids(ids)
    out = []
    changes = []
    for n, (body, eol) in enumerate(split_lines(text), 1):
        stripped = body.strip()
        if not stripped or stripped[0] in "#;":
            out.append(body + eol)
            continue
        toks = _Tokens(body)
        words = toks.tokens()
        mod = modname(words[0])
        details = []
        left = len(words) > 1
        if mod == "vfio_pci" and left:
            left = _edit_ids_params(toks, 1, ids, details, words[0])
        if mod in VFIO_MODULES and not keep_vfio and not left:
            changes.append({"line": n, "action": "removed", "before": body, "after": None,
                            "detail": "removed %s (no device stays on vfio-pci)" % words[0]})
            continue
        if details:
            new = str(toks)
            changes.append({"line": n, "action": "modified", "before": body, "after": new, "detail": "; ".join(details)})
            out.append(new + eol)
            continue
        out.append(body + eol)
    return "".join(out), changes


# --------------------------------------------------------------------------- the whole host

KIND_CMDLINE = "kernel_cmdline"
KIND_GRUB = "grub"
KIND_MODPROBE = "modprobe"
KIND_MODULES = "modules"


def candidate_files(etc_root="/etc"):
    """``[(path, kind), ...]`` of the files that may hold a vfio binding, those that exist."""
    files = [(os.path.join(etc_root, "kernel", "cmdline"), KIND_CMDLINE),
             (os.path.join(etc_root, "default", "grub"), KIND_GRUB)]
    files += [(p, KIND_GRUB) for p in sorted(glob.glob(os.path.join(etc_root, "default", "grub.d", "*.cfg")))]
    files += [(p, KIND_MODPROBE) for p in sorted(glob.glob(os.path.join(etc_root, "modprobe.d", "*.conf")))]
    files += [(os.path.join(etc_root, "modules"), KIND_MODULES)]
    files += [(p, KIND_MODULES) for p in sorted(glob.glob(os.path.join(etc_root, "modules-load.d", "*.conf")))]
    files += [(os.path.join(etc_root, "initramfs-tools", "modules"), KIND_MODULES)]
    return [(p, k) for p, k in files if os.path.isfile(p)]


def _read_text(path):
    return read_text(path, must_exist=True)


def remaining_vfio_ids(kind, text):
    if kind == KIND_CMDLINE:
        return cmdline_vfio_ids(text)
    if kind == KIND_GRUB:
        found = set()
        for v in grub_cmdline_values(text):
            found |= cmdline_vfio_ids(v)
        return found
    return modprobe_vfio_ids(text)


# Written when no modprobe.d file keeps nouveau off: the lines nvidia-installer itself writes
# (nvidia-installer-disable-nouveau.conf). "blacklist" stops udev's alias loading at boot, in the
# initramfs too once it is regenerated; "modeset=0" stops a nouveau loaded anyway (a dependency,
# a modprobe by hand) from registering its PCI driver (nouveau_drm.c:1435-1446, v6.12).
NOUVEAU_CONF_NAME = "kpro-gpu-serving-nouveau.conf"
NOUVEAU_CONF = ("# kpro.gpu_serving (vfio_release): the GPUs left vfio-pci and the NVIDIA driver needs nouveau off\n"
                "blacklist nouveau\noptions nouveau modeset=0\n")


def nouveau_disabled(text):
    """Whether a modprobe.d file keeps nouveau from loading (``blacklist nouveau``, ``install nouveau /bin/false``)."""
    for body, _eol in split_lines(text):
        words = body.split()
        if len(words) >= 2 and modname(words[1]) == "nouveau" and (
                words[0] == "blacklist" or (words[0] == "install" and len(words) == 3 and words[2] in _FALSE_COMMANDS)):
            return True
    return False


def _modprobe_d(etc_root, planned):
    """{file name: text} of the modprobe.d files modprobe reads, /etc's (as planned) overriding /lib's and /usr/lib's."""
    root = os.path.dirname(os.path.normpath(etc_root)) or "/"
    texts = {}
    for d in (os.path.join(root, "usr", "lib", "modprobe.d"), os.path.join(root, "lib", "modprobe.d")):
        for p in sorted(glob.glob(os.path.join(d, "*.conf"))):
            texts.setdefault(os.path.basename(p), _read_text(p))
    for f in planned:
        if f["kind"] == KIND_MODPROBE:
            texts[os.path.basename(f["path"])] = f["after"]
    return texts


def plan_nouveau_blacklist(etc_root, planned):
    """The file entry (as in :func:`plan`) that blacklists nouveau, or None when a modprobe.d file already does."""
    if any(nouveau_disabled(t) for t in _modprobe_d(etc_root, planned).values()):
        return None
    path = os.path.join(etc_root, "modprobe.d", NOUVEAU_CONF_NAME)
    before = _read_text(path) if os.path.isfile(path) else ""
    return {"path": path, "kind": KIND_MODPROBE, "before": before, "after": NOUVEAU_CONF, "changed": True,
            "changes": [{"line": n, "action": "added", "before": None, "after": line,
                         "detail": "nouveau off: udev would load it and a probe would give it the GPUs"}
                        for n, line in enumerate(NOUVEAU_CONF.splitlines(), 1) if not line.startswith("#")]}


def plan(ids, etc_root="/etc", drop_framebuffer_tokens=False, remove_nvidia_blacklist=True, vfio_modules="auto",
         extra_vfio_users=False, blacklist_nouveau=False):
    """Compute every edit on the host's files, without writing anything.

    ``vfio_modules``: ``auto`` (remove the vfio module lines only when no id stays in any
    vfio-pci binding and not ``extra_vfio_users``), ``keep`` or ``remove``. ``blacklist_nouveau``:
    add :data:`NOUVEAU_CONF` when no modprobe.d file keeps nouveau off (:func:`plan_nouveau_blacklist`).

    Returns a dict: ``files`` (a list of ``{"path", "kind", "before", "after", "changed",
    "changes"}`` for every candidate file), ``remaining_vfio_ids`` (sorted ids still bound to
    vfio-pci by some file after the edits), ``keep_vfio_modules``, ``boot_cmdline_changed``,
    ``initramfs_changed``, ``nouveau_blacklist`` (the path of the nouveau file to write, or None).
    """
    ids = norm_ids(ids)
    results = []
    remaining = set()
    for path, kind in candidate_files(etc_root):
        before = _read_text(path)
        if kind == KIND_CMDLINE:
            after, changes = edit_kernel_cmdline(before, ids, drop_framebuffer_tokens, remove_nvidia_blacklist)
        elif kind == KIND_GRUB:
            after, changes = edit_grub_default(before, ids, drop_framebuffer_tokens, remove_nvidia_blacklist)
        elif kind == KIND_MODPROBE:
            after, changes = edit_modprobe_conf(before, ids, True, remove_nvidia_blacklist)
        else:
            after, changes = edit_modules_list(before, ids, True)
        remaining |= remaining_vfio_ids(kind, after)
        results.append({"path": path, "kind": kind, "before": before, "after": after, "changes": changes})
    if vfio_modules == "keep":
        keep = True
    elif vfio_modules == "remove":
        keep = False
    else:
        keep = bool(remaining) or bool(extra_vfio_users)
    for r in results:
        if r["kind"] == KIND_MODPROBE and not keep:
            r["after"], r["changes"] = edit_modprobe_conf(r["before"], ids, False, remove_nvidia_blacklist)
        elif r["kind"] == KIND_MODULES:
            r["after"], r["changes"] = edit_modules_list(r["before"], ids, keep)
        r["changed"] = r["after"] != r["before"]
    nouveau = plan_nouveau_blacklist(etc_root, results) if blacklist_nouveau else None
    if nouveau is not None:
        results = [r for r in results if r["path"] != nouveau["path"]] + [nouveau]
    return {
        "files": results,
        "remaining_vfio_ids": sorted(remaining),
        "keep_vfio_modules": keep,
        "boot_cmdline_changed": any(r["changed"] for r in results if r["kind"] in (KIND_CMDLINE, KIND_GRUB)),
        "initramfs_changed": any(r["changed"] for r in results if r["kind"] in (KIND_MODPROBE, KIND_MODULES)),
        "nouveau_blacklist": nouveau["path"] if nouveau else None,
    }
