# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing guest configs under ``/etc/pve`` (pmxcfs) the way PVE does, and taking PVE's config locks.

``/etc/pve`` is pmxcfs, Proxmox's FUSE cluster filesystem. It is not a normal filesystem:

* it refuses ``chmod``/``chown`` (it decides owner and mode itself: root:www-data, 0640 or 0600
  under ``priv/``), so Ansible's ``copy``/``template`` fail there when they fix up the
  permissions of their temporary file (ansible/ansible#70535, #83411);
* it refuses files over 1 MiB (``MEMDB_MAX_FILE_SIZE``), and a write that grows past it fails
  half way through;
* every file is replicated to the whole cluster, so a backup or a stray temporary file must not
  be left there (PVE could also read ``<vmid>.conf.<x>`` lying next to a config).

:func:`atomic_write` therefore writes like ``PVE::Tools::file_set_contents``:
``<file>.tmp.<pid>`` created with ``O_EXCL``, written, fsynced, then renamed over the file (pmxcfs
renames atomically), with no chmod/chown unless the caller asks for one on a regular filesystem,
and refuses a file over the cap before touching anything.

:class:`FlockLock` is the ``flock`` PVE's tools take around a config read-modify-write
(``/run/lock/lxc/pve-config-<vmid>.lock`` for containers, ``/run/lock/qemu-server/lock-<vmid>.conf``
for VMs), polled until a deadline. The lock path and the exception to raise come from the caller.
Standard library only; Python 3.9+.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

MAX_FILE_SIZE = 1024 * 1024  # pmxcfs MEMDB_MAX_FILE_SIZE
DEFAULT_FILE_MODE = 0o640

# atomic_write ``mode`` values
MODE_INHERIT = "inherit"    # create the new file with the old file's permission bits; no chmod/chown
MODE_DEFAULT = "default"    # create the new file with ``default_mode``; no chmod/chown
MODE_PRESERVE = "preserve"  # create with ``default_mode``, then chmod/chown to the old file's (regular filesystems only)
MODES = (MODE_INHERIT, MODE_DEFAULT, MODE_PRESERVE)


class PmxcfsError(Exception):
    """The default error type of this module (callers usually pass their own)."""


def tmp_path(path):
    """The temporary name PVE uses while replacing ``path``."""
    return "%s.tmp.%d" % (path, os.getpid())


def atomic_write(path, data, max_size=MAX_FILE_SIZE, mode=MODE_INHERIT, default_mode=DEFAULT_FILE_MODE,
                 error=PmxcfsError):
    """Replace ``path`` with ``data`` (bytes) through ``<path>.tmp.<pid>`` (``O_EXCL``) + fsync + rename.

    ``max_size``: refuse (raise ``error``, nothing written) data longer than this many bytes; None for
    no cap. ``mode``: :data:`MODE_INHERIT` (the default, safe under pmxcfs), :data:`MODE_DEFAULT` or
    :data:`MODE_PRESERVE` (chmod/chown the new file to the old one's; never under /etc/pve).
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
    tmp = tmp_path(path)
    try:
        os.unlink(tmp)  # left over by an earlier process that had our pid
    except OSError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, create_mode)
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


def _size_text(n):
    if n % (1024 * 1024) == 0:
        return "%d MiB" % (n // (1024 * 1024))
    return "%d bytes" % n


class FlockLock(object):
    """An exclusive ``flock`` on ``path``, polled until ``timeout`` seconds have passed.

    Creates the lock file's directory if needed. Raises ``error`` (the caller's exception type) when
    the directory or the file cannot be made, or when the lock is still held at the deadline; the
    timeout message is ``can't lock file '<path>' - got timeout after <timeout>s`` (PVE's own words)
    followed by ``: <hint>`` when a hint is given. Usable as a context manager, or with
    :meth:`acquire` / :meth:`release`.
    """

    poll_interval = 0.1

    def __init__(self, path, timeout=10, error=PmxcfsError, hint=None):
        self.path = path
        self.lock_dir = os.path.dirname(path)
        self.timeout = timeout
        self.error = error
        self.hint = hint
        self.fd = None

    def acquire(self):
        if self.lock_dir:
            try:
                os.makedirs(self.lock_dir)
            except OSError as e:
                if e.errno != errno.EEXIST:
                    raise self.error("cannot create the lock directory %s: %s" % (self.lock_dir, e))
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise self.error("cannot open the lock file %s: %s" % (self.path, e))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    self._close()
                    raise self.error("can't lock file '%s': %s" % (self.path, e))
                left = deadline - time.monotonic()
                if left <= 0:
                    self._close()
                    msg = "can't lock file '%s' - got timeout after %ss" % (self.path, self.timeout)
                    raise self.error("%s: %s" % (msg, self.hint) if self.hint else msg)
                time.sleep(min(self.poll_interval, left))

    def release(self):
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                self._close()

    def _close(self):
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False
