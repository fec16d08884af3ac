# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import lxc_config as lc
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pmxcfs
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pve_guests as pg


class CallerError(Exception):
    """Stands for a caller's own error type (LxcConfigError, GuestError, ...)."""


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def no_chmod(monkeypatch):
    """pmxcfs refuses chmod/chown: make every form of them fail the test."""
    calls = []

    def refuse(*a, **k):
        calls.append(a)
        raise PermissionError(1, "Operation not permitted (pmxcfs)")
    for name in ("chmod", "fchmod", "lchmod", "chown", "fchown", "lchown"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    return calls


def mode_of(path):
    return stat.S_IMODE(os.stat(str(path)).st_mode)


# ------------------------------------------------------------------ atomic_write


def test_write_goes_through_tmp_then_rename(tmp_path, monkeypatch):
    target = tmp_path / "129.conf"
    target.write_bytes(b"old\n")
    seen = []
    real_rename = os.rename

    def rename(src, dst):
        seen.append((src, dst, open(src, "rb").read(), open(dst, "rb").read()))
        return real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    pmxcfs.atomic_write(str(target), b"new\n")
    # one rename, from <file>.tmp.<pid> (already complete) over the untouched old file
    assert seen == [("%s.tmp.%d" % (target, os.getpid()), str(target), b"new\n", b"old\n")]
    assert pmxcfs.tmp_path(str(target)) == seen[0][0]
    assert target.read_bytes() == b"new\n"
    assert os.listdir(str(tmp_path)) == ["129.conf"]  # no tmp file left


def test_target_replaced_atomically_not_rewritten_in_place(tmp_path):
    target = tmp_path / "129.conf"
    target.write_bytes(b"a: 1\n" * 100)
    with open(str(target), "rb") as reader:  # a reader (PVE) that opened the file before the write
        ino = os.fstat(reader.fileno()).st_ino
        pmxcfs.atomic_write(str(target), b"a: 2\n")
        assert reader.read() == b"a: 1\n" * 100  # still sees the whole old file, never a mix
    assert os.stat(str(target)).st_ino != ino  # a new file took the name
    assert target.read_bytes() == b"a: 2\n"


def test_no_chmod_or_chown_and_the_write_still_succeeds(tmp_path, no_chmod, umask022):
    target = tmp_path / "1.conf"
    target.write_bytes(b"a\n")
    pmxcfs.atomic_write(str(target), b"b\n")  # the default (MODE_INHERIT), as under /etc/pve
    pmxcfs.atomic_write(str(target), b"c\n", mode=pmxcfs.MODE_DEFAULT)
    assert target.read_bytes() == b"c\n"
    assert no_chmod == []
    assert os.listdir(str(tmp_path)) == ["1.conf"]


def test_inherit_creates_the_new_file_with_the_old_mode_without_chmod(tmp_path, no_chmod, umask022):
    target = tmp_path / "1.conf"
    os.close(os.open(str(target), os.O_WRONLY | os.O_CREAT, 0o600))  # not 0o640, the default
    assert mode_of(target) == 0o600
    pmxcfs.atomic_write(str(target), b"b\n")
    assert mode_of(target) == 0o600 and target.read_bytes() == b"b\n"


def test_default_mode_for_a_new_file_and_mode_default(tmp_path, no_chmod, umask022):
    new = tmp_path / "new.conf"
    pmxcfs.atomic_write(str(new), b"x\n")
    assert mode_of(new) == pmxcfs.DEFAULT_FILE_MODE == 0o640
    other = tmp_path / "other.conf"
    os.close(os.open(str(other), os.O_WRONLY | os.O_CREAT, 0o600))
    pmxcfs.atomic_write(str(other), b"y\n", mode=pmxcfs.MODE_DEFAULT, default_mode=0o644)
    assert mode_of(other) == 0o644  # the old mode is ignored
    assert no_chmod == []


def test_preserve_mode_chmods_on_a_regular_filesystem(tmp_path, umask022):
    target = tmp_path / "grub"
    target.write_bytes(b"a\n")
    os.chmod(str(target), 0o606)  # a mode the umask would strip from a plain create
    pmxcfs.atomic_write(str(target), b"b\n", mode=pmxcfs.MODE_PRESERVE)
    assert mode_of(target) == 0o606 and target.read_bytes() == b"b\n"
    missing = tmp_path / "missing"
    pmxcfs.atomic_write(str(missing), b"c\n", mode=pmxcfs.MODE_PRESERVE)
    assert mode_of(missing) == 0o640


def test_preserve_mode_fails_where_chmod_is_refused_and_leaves_the_file(tmp_path, no_chmod):
    target = tmp_path / "1.conf"
    target.write_bytes(b"a\n")
    with pytest.raises(PermissionError):
        pmxcfs.atomic_write(str(target), b"b\n", mode=pmxcfs.MODE_PRESERVE)
    assert target.read_bytes() == b"a\n"
    assert os.listdir(str(tmp_path)) == ["1.conf"]


def test_size_cap_refused_with_the_callers_error_and_nothing_written(tmp_path, monkeypatch):
    target = tmp_path / "129.conf"
    target.write_bytes(b"a: 1\n")
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    with pytest.raises(CallerError, match=r"would be 1048577 bytes; pmxcfs refuses files over 1 MiB"):
        pmxcfs.atomic_write(str(target), b"x" * (pmxcfs.MAX_FILE_SIZE + 1), error=CallerError)
    assert opened == []  # refused before any file was opened
    assert target.read_bytes() == b"a: 1\n"
    assert os.listdir(str(tmp_path)) == ["129.conf"]
    with pytest.raises(CallerError):
        pmxcfs.atomic_write(str(tmp_path / "new.conf"), b"x" * (pmxcfs.MAX_FILE_SIZE + 1), error=CallerError)
    assert os.listdir(str(tmp_path)) == ["129.conf"]  # no new file either


def test_size_cap_default_error_exact_limit_custom_limit_and_no_cap(tmp_path):
    target = tmp_path / "f"
    with pytest.raises(pmxcfs.PmxcfsError, match="1 MiB"):
        pmxcfs.atomic_write(str(target), b"x" * (1024 * 1024 + 1))
    pmxcfs.atomic_write(str(target), b"x" * (1024 * 1024))  # exactly 1 MiB is allowed
    assert target.stat().st_size == 1024 * 1024
    with pytest.raises(CallerError, match="over 10 bytes"):
        pmxcfs.atomic_write(str(target), b"x" * 11, max_size=10, error=CallerError)
    pmxcfs.atomic_write(str(target), b"x" * (2 * 1024 * 1024), max_size=None)
    assert target.stat().st_size == 2 * 1024 * 1024


def test_failed_rename_removes_the_tmp_file_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "129.conf"
    target.write_bytes(b"old\n")

    def fail(src, dst):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "rename", fail)
    with pytest.raises(OSError, match="Input/output error"):
        pmxcfs.atomic_write(str(target), b"new\n")
    assert target.read_bytes() == b"old\n"
    assert os.listdir(str(tmp_path)) == ["129.conf"]


def test_a_stale_tmp_file_with_our_pid_is_replaced(tmp_path):
    target = tmp_path / "129.conf"
    target.write_bytes(b"old\n")
    stale = tmp_path / ("129.conf.tmp.%d" % os.getpid())
    stale.write_bytes(b"half a file from a dead process")
    pmxcfs.atomic_write(str(target), b"new\n")
    assert target.read_bytes() == b"new\n"
    assert os.listdir(str(tmp_path)) == ["129.conf"]


def test_unknown_mode_is_a_programming_error(tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        pmxcfs.atomic_write(str(tmp_path / "f"), b"x", mode="chmod")
    assert os.listdir(str(tmp_path)) == []


# ------------------------------------------------------------------ FlockLock


def test_lock_taken_released_and_directory_created(tmp_path):
    path = str(tmp_path / "run" / "lock" / "lxc" / "pve-config-129.lock")
    with pmxcfs.FlockLock(path, timeout=0, error=CallerError) as lk:
        assert lk.fd is not None and os.path.exists(path)
        probe = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # really held
        finally:
            os.close(probe)
    assert lk.fd is None
    with pmxcfs.FlockLock(path, timeout=0, error=CallerError):  # free again at once
        pass


def test_second_taker_times_out_with_the_callers_error_within_the_deadline(tmp_path):
    path = str(tmp_path / "pve-config-129.lock")
    with pmxcfs.FlockLock(path, error=CallerError):
        second = pmxcfs.FlockLock(path, timeout=0.3, error=CallerError, hint="another PVE operation holds it")
        t0 = time.monotonic()
        with pytest.raises(CallerError) as ei:
            with second:
                pytest.fail("the lock was taken twice")
        elapsed = time.monotonic() - t0
    assert str(ei.value) == "can't lock file '%s' - got timeout after 0.3s: another PVE operation holds it" % path
    assert 0.3 <= elapsed < 2  # waited the deadline out, not much longer
    assert second.fd is None  # its fd was closed


def test_timeout_zero_tries_once(tmp_path):
    path = str(tmp_path / "l")
    with pmxcfs.FlockLock(path):
        t0 = time.monotonic()
        with pytest.raises(pmxcfs.PmxcfsError, match=r"got timeout after 0s$"):
            pmxcfs.FlockLock(path, timeout=0).acquire()
        assert time.monotonic() - t0 < 0.5


HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
sys.stdout.write("held\n")
sys.stdout.flush()
sys.stdin.read()
"""


def test_lock_held_by_another_process(tmp_path):
    path = str(tmp_path / "lock" / "qemu-server" / "lock-105.conf")
    os.makedirs(os.path.dirname(path))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            universal_newlines=True)
    try:
        assert proc.stdout.readline() == "held\n"
        t0 = time.monotonic()
        with pytest.raises(CallerError, match="got timeout after 0.4s"):
            with pmxcfs.FlockLock(path, timeout=0.4, error=CallerError):
                pass
        assert 0.4 <= time.monotonic() - t0 < 2.4
    finally:
        proc.stdin.close()
        proc.wait(10)
    with pmxcfs.FlockLock(path, timeout=2, error=CallerError):  # the holder is gone: free
        pass


def test_a_waiter_gets_the_lock_when_the_holder_lets_go_before_the_deadline(tmp_path):
    path = str(tmp_path / "l")
    holder = pmxcfs.FlockLock(path).acquire()
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    try:
        t0 = time.monotonic()
        with pmxcfs.FlockLock(path, timeout=5, error=CallerError):
            waited = time.monotonic() - t0
    finally:
        timer.join()
    assert 0.2 <= waited < 4


def test_lock_directory_that_cannot_be_made_is_the_callers_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CallerError, match="cannot create the lock directory"):
        pmxcfs.FlockLock(str(tmp_path / "file" / "lxc" / "x.lock"), error=CallerError).acquire()


# ------------------------------------------------------------------ the callers' public names


@pytest.mark.parametrize("make_lock, error, name", [
    (lambda d, t: lc.ConfigLock(129, d, timeout=t), lc.LxcConfigError, "pve-config-129.lock"),
    (lambda d, t: pg.ConfigLock(129, d, timeout=t), pg.GuestError, "lock-129.conf"),
])
def test_callers_config_locks_share_the_lock_and_raise_their_own_errors(tmp_path, make_lock, error, name):
    (tmp_path / "lock").mkdir()  # pve_guests.ConfigLock locks nothing without the parent (/run/lock)
    lock_dir = str(tmp_path / "lock" / "sub")
    with make_lock(lock_dir, 10) as held:
        assert held.fd is not None
        assert isinstance(held, pmxcfs.FlockLock)
        assert held.path == os.path.join(lock_dir, name) and held.lock_dir == lock_dir
        with pytest.raises(error, match="got timeout after 0.2s: another"):
            with make_lock(lock_dir, 0.2):
                pass


def test_pve_guests_lock_is_a_no_op_without_run_lock(tmp_path):
    with pg.ConfigLock(105, str(tmp_path / "nolock" / "qemu-server"), timeout=0) as lk:
        assert lk.fd is None
    assert not (tmp_path / "nolock").exists()


def test_callers_atomic_writes(tmp_path, no_chmod):
    ct = tmp_path / "129.conf"
    ct.write_bytes(b"a\n")
    lc.atomic_write(str(ct), b"b\n")
    with pytest.raises(lc.LxcConfigError, match="1 MiB"):
        lc.atomic_write(str(ct), b"x" * (lc.MAX_CONFIG_SIZE + 1))
    vm = tmp_path / "105.conf"
    vm.write_bytes(b"a\n")
    pg.atomic_write(str(vm), b"b\n", preserve_mode=False)
    assert ct.read_bytes() == vm.read_bytes() == b"b\n"
    assert no_chmod == []
    assert sorted(os.listdir(str(tmp_path))) == ["105.conf", "129.conf"]
