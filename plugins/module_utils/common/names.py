# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names and paths that become files: a systemd unit's name, the model directory.

A unit's name becomes file names (the unit file, its environment and state files, its deployment record), and the
model directory is where the model stage writes: both are refused before anything is read or written when they could
lead outside where they belong (``../`` in a unit name, a model directory that is, or leads through a symlink to, a
system directory or a place outside the models' root)."""

from __future__ import annotations

import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

# systemd 252 src/basic/unit-name.c unit_name_is_valid() with UNIT_NAME_PLAIN: only VALID_CHARS (digits, letters and
# ":-_.\\") before the last ".", which must be followed by a unit type, no "@" (no template or instance), and shorter
# than UNIT_NAME_MAX (256, src/basic/unit-name.h). The unit here is always a service.
UNIT_NAME_MAX = 256
_PLAIN_SERVICE = re.compile(r"[0-9A-Za-z:_.\\-]+\.service\Z")

# Directories of the operating system: a model directory under one of these would mix the model's files (and its
# .cache) with the system's. "lib*" stands for /lib, /lib32, /lib64, /libx32.
SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/boot", "/proc", "/sys", "/dev", "/run", "/var/lib/dpkg",
               "/var/lib/apt", "/var/lib/systemd", "/var/cache/apt", "/var/log")


def service_name(unit):
    """The unit's full name as the modules use it (a name without a type is a service)."""
    return unit if "." in unit else unit + ".service"


def unit_name_problem(unit, option="unit"):
    """None when ``unit`` is a plain systemd service name, else the Failure that refuses it (phase bad_input)."""
    name = service_name(unit or "")
    if len(name) < UNIT_NAME_MAX and _PLAIN_SERVICE.match(name):
        return None
    return Failure("bad_input", "%s %r is not a plain systemd service name: systemd accepts only letters, digits and "
                   "':-_.\\' before '.service' (no '/', no '@', under %d characters; unit_name_is_valid)"
                   % (option, unit, UNIT_NAME_MAX),
                   "name the unit like sglang.service (the role's sglang_server_unit); nothing was read or changed")


def check_unit_name(unit, option="unit"):
    """Raise :func:`unit_name_problem`'s Failure for a unit name that is not a plain service name."""
    bad = unit_name_problem(unit, option)
    if bad:
        raise bad


def under(path, top):
    """Whether the normalized absolute ``path`` is ``top`` or below it."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def system_dir(real):
    """The system directory ``real`` (a resolved path) is or lies under, else None; "/" and /var, /var/lib too."""
    if real in ("/", "/var", "/var/lib", "/var/cache"):
        return real
    first = "/" + real.split("/")[1]
    if first.startswith("/lib"):
        return first
    return next((d for d in SYSTEM_DIRS if under(real, d)), None)


def model_dir_problem(raw, root, realpath=os.path.realpath):
    """None when the model directory ``raw`` stays where it belongs, else the Failure that refuses it (model_input).

    Its real path (symlinks resolved as far as it exists, here on the target) must not be a system directory and must
    lie under the real path of ``root`` (the models' root; "" = no root check). ``..`` is refused as written: the
    directory is then not where it reads. Nothing is written before this check."""
    remedy = ("point model_dir at a directory under the models' root%s (no '..', no symlink that leads elsewhere), or "
              "set model_root to where the models are; nothing was written" % ((" " + root) if root else ""))
    if ".." in raw.split("/"):
        return Failure("model_input", "local_dir %r contains '..': the directory is not where it reads" % raw, remedy)
    real = realpath(raw)
    sysdir = system_dir(real)
    if sysdir:
        return Failure("model_input", "local_dir %r resolves to %s, %s the system directory %s: the model's files and "
                       "its .cache would be written there" % (raw, real, "which is" if real == sysdir else "under", sysdir),
                       remedy)
    real_root = realpath(root) if root else ""
    if real_root and not under(real, real_root):
        return Failure("model_input", "local_dir %r resolves to %s, outside the models' root %s (real path %s)"
                       % (raw, real, root, real_root), remedy)
    return None
