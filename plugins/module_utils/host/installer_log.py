# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why the NVIDIA installer failed, read from its output or ``/var/log/nvidia-installer.log`` (or any excerpt).

Own code: no library reads nvidia-installer's messages. The texts are nvidia-installer's own (NVIDIA/nvidia-installer
tag 590.48.01, file:line at each cause; 580 has the same lines) and the kernel's ``NVRM:`` lines that the installer
copies into its log under "Kernel messages". The installer wraps its messages over several lines (a continuation
indented), and published logs add timestamps or container prefixes and are cut at either end, so the text is matched
flattened (one space between lines), and a cause needs only its own lines, not the log's head or tail.
The causes are tried most specific first: a module that did not load because Secure Boot refused it, or because the
GPUs are bound to vfio-pci, says so rather than the generic "Unable to load the kernel module".
"""

from __future__ import annotations

import bisect
import re

_PREFIX_RE = re.compile(r"^(?:\d{4}-\d\d-\d\dT[\d:.]+Z?\s|\[\s*\d+\.\d+\]\s|[\w.-]+-\d+\s+\|\s?)")

_SIGN = ("set gpu_host_module_signing_key / gpu_host_module_signing_cert to a key enrolled with `mokutil --import` "
         "(so the installer signs the module), or disable Secure Boot in the firmware, then run the play again")
# (cause, pattern on the flattened text, what it means, what to do); {0} is the pattern's first group when it has one
CAUSES = [
    ("secure_boot", r"not signed by a key that is trusted by the kernel|signed kernel module failed to load|"
                    r"Secure boot is enabled on this system|Key was rejected by service|"
                    r"Required key not available",  # kernel.c:1235-1297; the last two: insmod's EKEYREJECTED, ENOKEY
     "the kernel refused the module's signature (Secure Boot or module signature enforcement)", _SIGN),
    ("gpu_bound_to_vfio", r"NVRM: GPU ([0-9a-fA-F:.]+?) is already bound to ([\w-]+)",
     "the GPU {0} is bound to {1} (passed through to a VM), so the NVIDIA module found no GPU",
     "release the GPUs from vfio-pci (stage 1, the vfio_release module: remove their ids from the vfio-pci options and "
     "stop the VMs that have them as hostpci), reboot if the initramfs binds them, then run the play again"),
    ("gpu_not_supported", r"NVRM: .{0,120}?(?:is not supported by|not supported by open nvidia\.ko|"
                          r"does not include the required GPU System Processor)",
     "this driver release (or its open kernel modules) does not support the GPU",
     "choose a driver branch that supports the GPU (gpu_host_driver_version), or gpu_host_kernel_module_type: "
     "proprietary for a GPU older than Turing, then run the play again"),
    ("module_in_use", r"An NVIDIA kernel module '([\w-]+)' appears to (?:already be|be already) loaded",  # kernel.c:1712
     "an NVIDIA kernel module ('{0}') is loaded and in use, so the installer cannot replace it",
     "stop what holds the GPUs (the containers they are passed to: `pct stop <vmid>`; nvidia-persistenced; "
     "`lsof /dev/nvidia*` lists the processes) or reboot, then run the play again"),
    ("nouveau_loaded", r"The Nouveau kernel driver is currently in use",  # misc.c:2509
     "nouveau drives the GPUs, and the NVIDIA module cannot take them",
     "blacklist nouveau (`blacklist nouveau` and `options nouveau modeset=0` in /etc/modprobe.d/), run "
     "`update-initramfs -u -k all`, reboot, then run the play again"),
    ("kernel_source_missing", r"Unable to find the kernel source tree",  # kernel.c:250
     "no kernel headers for the kernel the module is built for",
     "install the headers of the running kernel (`apt-get install proxmox-headers-$(uname -r)` on PVE 8, "
     "pve-headers-<kernel> before PVE 8), then run the play again"),
    ("build_tools_missing", r"(?:Unable to find the development tool [`'](\w+)[`']|The CC sanity check failed|"
                            r"do not appear to have libc header files|does not appear to be able to create)",  # misc.c:763
     "a tool the module build needs is missing ({0})",
     "install the build tools (`apt-get install build-essential`: gcc, make, binutils, libc6-dev), then run the play again"),
    ("dkms_build_failed", r"Failed to run `\S*dkms (?:build|install)[^`]*`|Bad return status for module build",  # misc.c:2653
     "DKMS could not build the module",
     "read DKMS's make.log (/var/lib/dkms/nvidia/<version>/build/make.log); a kernel newer than this driver release "
     "supports needs a newer driver (gpu_host_driver_version), headers that do not match the kernel need reinstalling"),
    ("module_build_failed", r"An error occurred while performing the step: \"(?:Building kernel modules|Checking to see "
                            r"whether the [\w-]+ kernel module was successfully built)\"",  # kernel.c:2464
     "the kernel module did not compile",
     "the compiler's errors follow `The command ... failed with the following output` in /var/log/nvidia-installer.log; "
     "usually a kernel newer than this driver release supports (choose a newer gpu_host_driver_version)"),
    ("module_load_failed", r"Unable to load the kernel module '([\w.-]+)'",  # kernel.c:1303
     "the module {0} was built but the kernel did not load it",
     "the log's 'Kernel module load error' and 'Kernel messages' say why (`dmesg | grep NVRM`): GPUs bound to another "
     "driver (vfio-pci, nouveau), a GPU this release does not support, or a signature"),
]
_COMPILED = [(c, re.compile(p, re.I if c == "secure_boot" else 0), s, r) for c, p, s, r in CAUSES]

# Why a module build failed, from the compiler's and make's words (DKMS's make.log, or the installer's log, which
# copies make's output after "The command `...` failed with the following output"): the kernel's own Makefile and gcc.
BUILD_CAUSES = [
    ("compiler_killed", r"internal compiler error: Killed|Killed \(program cc1\)",
     "the compiler was killed (out of memory)",
     "free memory on the host (stop a guest) or add swap, then run the play again"),
    ("compiler_mismatch", r"unrecognized command[- ]line option [`'\u2018]?(-[\w=-]+)",  # flags of the kernel's compiler
     "the compiler is not the one the kernel was built with: it does not know the kernel's flag {0}",
     "install the compiler the kernel was built with and make it `cc` (`cat /proc/version` names it; Proxmox VE 8's "
     "kernels: gcc 12 of bookworm, the build-essential package), then run the play again"),
    ("kernel_api_changed", r"error: implicit declaration of function [`'\u2018]?(\w+)|"
                           r"error: too (?:few|many) arguments to function [`'\u2018]?(\w+)|"
                           r"error: [`'\u2018]?([\w ]+?)[`'\u2019]? has no member named|"
                           r"modpost: [`'\"\u2018]?(\w+)[`'\"\u2019]? \[[^\]]+\] undefined!",
     "the driver's source does not build against this kernel (its API changed: {0}{1}{2}{3})",
     "this driver release is older than the kernel: choose a newer gpu_host_driver_version (a branch that supports "
     "the kernel), or pin a kernel it supports (`proxmox-boot-tool kernel pin <kernel>`) and reboot"),
    ("headers_missing", r"/lib/modules/([^/\s]+)/build: No such file or directory",
     "no kernel headers for kernel {0}",
     "install proxmox-headers-{0} (pve-headers-{0} before PVE 8), then run the play again"),
    # the kernel Makefile's warning: printed by successful builds too whenever the version strings differ at all
    # (12.2.0-14 and 12.2.0-14+deb12u1), so a cause only when the compiler's family or major version differs
    ("compiler_mismatch", r"the compiler differs from the one used to build the kernel\s+The kernel was built by: (.+?)"
                          r"\s+You are using: +(.+?)(?=\s+make\b|\s+\S+: |$)",
     "the compiler ({1}) is not the one the kernel was built with ({0})",
     "install the compiler the kernel was built with and make it `cc` (Proxmox VE 8's kernels: gcc 12 of bookworm, the "
     "build-essential package), then run the play again"),
]
_BUILD = [(c, re.compile(p), s, r) for c, p, s, r in BUILD_CAUSES]


def _compiler_kind(text):
    """("clang" or "gcc", major version) of a compiler's version string."""
    m = re.search(r"(\d+)\.\d+", text)
    return ("clang" if "clang" in text else "gcc", m.group(1) if m else None)


def _accepted(cause, m):
    """Whether a match names a cause: the compiler warning only when the two compilers really differ."""
    if cause == "compiler_mismatch" and m.re.groups == 2:
        return _compiler_kind(m.group(1)) != _compiler_kind(m.group(2))
    return True


_ERROR_RE = re.compile(r"^ERROR: (?!Installation has failed)(.+)")


def _lines(text):
    out = []
    for raw in (text or "").splitlines():
        line = _PREFIX_RE.sub("", raw.rstrip(), count=1)
        out.append(" ".join(line.split()))
    return out


def _flatten(lines):
    """The lines joined by single spaces, and each line's start offset in that text."""
    starts, pos = [], 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    return " ".join(lines), starts


def _fill(template, match):
    """The template with the match's groups; an alternative's unmatched groups are empty."""
    groups = match.groups()
    filled = template.format(*[g or "" for g in groups] + [""] * (3 - len(groups))) if groups else template
    return filled.replace(" ()", "")


def _first_match(table, lines, flat, starts, max_evidence):
    for cause, rx, summary, remedy in table:
        m = rx.search(flat)
        if m and _accepted(cause, m):
            first = bisect.bisect_right(starts, m.start()) - 1
            last = bisect.bisect_right(starts, max(m.end() - 1, m.start())) - 1
            evidence = [ln for ln in lines[first:last + 1] if ln][:max_evidence]
            return {"cause": cause, "summary": _fill(summary, m), "remedy": _fill(remedy, m), "evidence": evidence}
    return None


def build_failure(text, max_evidence=6):
    """Why a kernel module build failed (``{"cause", "summary", "remedy", "evidence"}``), or None when make's and the
    compiler's words in ``text`` name no known cause."""
    lines = _lines(text)
    flat, starts = _flatten(lines)
    return _first_match(_BUILD, lines, flat, starts, max_evidence)


def diagnose(text, max_evidence=6):
    """``{"cause", "summary", "remedy", "evidence"}`` for the installer's failure; cause None when no known one matched
    (the summary is then the installer's first ERROR line, if any). A failed build says why it failed when the text
    has the compiler's words (``build_failure``)."""
    lines = _lines(text)
    flat, starts = _flatten(lines)
    found = _first_match(_COMPILED, lines, flat, starts, max_evidence)
    if found and found["cause"] in ("dkms_build_failed", "module_build_failed"):
        build = _first_match(_BUILD, lines, flat, starts, max_evidence)
        if build:
            found.update(summary="%s: %s" % (found["summary"], build["summary"]), remedy=build["remedy"],
                         evidence=(found["evidence"] + build["evidence"])[:max_evidence])
    if found:
        return found
    errors = [m.group(1) for m in (_ERROR_RE.match(ln) for ln in lines) if m]
    return {"cause": None, "summary": errors[0] if errors else "", "remedy": "", "evidence": errors[:max_evidence]}
