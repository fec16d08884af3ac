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

:func:`atomic_write` (module_utils/common/fileio.py's writer with these rules) writes like ``PVE::Tools::file_set_contents``:
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
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import fileio
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import (  # noqa: F401 pylint: disable=unused-import
    MODE_DEFAULT, MODE_INHERIT, MODE_PRESERVE, MODES, tmp_path)  # re-exported: callers name them pmxcfs.MODE_*

MAX_FILE_SIZE = 1024 * 1024  # pmxcfs MEMDB_MAX_FILE_SIZE
DEFAULT_FILE_MODE = 0o640


class PmxcfsError(Exception):
    """The default error type of this module (callers usually pass their own)."""


def atomic_write(path, data, max_size=MAX_FILE_SIZE, mode=MODE_INHERIT, default_mode=DEFAULT_FILE_MODE,
                 error=PmxcfsError):
    """fileio.atomic_write with the pmxcfs rules as defaults: the 1 MiB cap, the old file's mode, no chmod/chown."""
    fileio.atomic_write(path, data, max_size=max_size, mode=mode, default_mode=default_mode, error=error)


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
