# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's file helpers, once: a reader, a JSON loader, the atomic writer and the backup copy.

The writer's pmxcfs rules (no chmod/chown, the 1 MiB cap) are options; module_utils/host/pmxcfs.py passes them for
files under ``/etc/pve``. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile

# atomic_write ``mode`` values
MODE_INHERIT = "inherit"    # create the new file with the old file's permission bits; no chmod/chown
MODE_DEFAULT = "default"    # create the new file with ``default_mode``; no chmod/chown
MODE_PRESERVE = "preserve"  # create with ``default_mode``, then chmod/chown to the old file's (regular filesystems only)
MODES = (MODE_INHERIT, MODE_DEFAULT, MODE_PRESERVE)


class FileError(Exception):
    """The default error type of atomic_write's size cap (callers usually pass their own)."""


def read_text(path, strip=False, must_exist=False):
    """The text of ``path`` (undecodable bytes kept as surrogates), or None when it cannot be read
    (``must_exist``: raise the OSError instead)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
    except (IOError, OSError):
        if must_exist:
            raise
        return None
    return text.strip() if strip else text


def load_json(path, default=None):
    """The JSON document in ``path``, or ``default`` when it is missing or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_new(path, data, mode=0o600):
    """Write ``data`` (bytes) to the first free name of ``path``, ``path.1``, ``path.2``...; returns that name."""
    dest, n = path, 0
    while os.path.exists(dest):
        n += 1
        dest = "%s.%d" % (path, n)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return dest


def backup(data, dest, dir_mode=0o700):
    """Keep ``data`` (the old bytes of a file) as ``dest`` (or ``dest.N`` when taken), 0600 in a 0700 directory."""
    try:
        os.makedirs(os.path.dirname(dest), dir_mode)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
    return write_new(dest, data)


def tmp_path(path):
    """The temporary name PVE uses while replacing ``path``."""
    return "%s.tmp.%d" % (path, os.getpid())


def atomic_write(path, data, max_size=None, mode=MODE_PRESERVE, default_mode=0o644, error=FileError, unique_tmp=False):
    """Replace ``path`` with ``data`` (bytes) through ``<path>.tmp.<pid>`` (``O_EXCL``) + fsync + rename.

    ``max_size``: refuse (raise ``error``, nothing written) data longer than this many bytes; None for
    no cap (pmxcfs.atomic_write passes its 1 MiB). ``mode``: :data:`MODE_PRESERVE` (the default: chmod/chown
    the new file to the old one's; never under /etc/pve), :data:`MODE_INHERIT` (safe under pmxcfs) or
    :data:`MODE_DEFAULT`.
    ``unique_tmp``: a ``.tmp-XXXX`` name of its own (tempfile.mkstemp) instead of PVE's ``<path>.tmp.<pid>``, for
    threads of one process writing the same file (never under /etc/pve: it chmods the temporary file).
    On any failure the temporary file is removed and ``path`` is left as it was; I/O errors are
    raised as they are (OSError).
    """
    if mode not in MODES:
        raise ValueError("mode must be one of %s, got %r" % (", ".join(MODES), mode))
    if max_size is not None and len(data) > max_size:
        raise error("%s would be %d bytes; pmxcfs refuses files over %s" % (path, len(data), _size_text(max_size)))
    old = None
    if mode != MODE_DEFAULT:
        try:
            old = os.stat(path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
    create_mode = stat.S_IMODE(old.st_mode) if (old is not None and mode == MODE_INHERIT) else default_mode
    fd, tmp = _open_tmp(path, create_mode, unique_tmp)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if mode == MODE_PRESERVE and old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
            try:
                os.chown(tmp, old.st_uid, old.st_gid)
            except OSError:
                pass  # not root: the new file stays ours
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _open_tmp(path, create_mode, unique):
    if unique:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path) or ".")
        os.fchmod(fd, create_mode)
        return fd, tmp
    tmp = tmp_path(path)
    try:
        os.unlink(tmp)  # left over by an earlier process that had our pid
    except OSError:
        pass
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, create_mode), tmp


def _size_text(n):
    if n % (1024 * 1024) == 0:
        return "%d MiB" % (n // (1024 * 1024))
    return "%d bytes" % n


# --------------------------------------------------------------------------- test roots
# Modules read the host under roots (``sysfs_root``, ``etc_root``...) that unit tests point at fake trees. They
# stay documented (validate-modules requires it, and ansible-lint refuses an ignore of that check), marked
# "Internal, for tests only" in each module's DOCUMENTATION.


def root_options(roots):
    """Argument-spec entries for the test roots ``{name: real root}``."""
    return dict((name, dict(type="path", default=default)) for name, default in roots.items())
