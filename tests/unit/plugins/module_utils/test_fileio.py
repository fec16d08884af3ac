# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""fileio: the one reader, JSON loader, atomic writer and backup of the collection."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import fileio
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pmxcfs


def test_read_text_keeps_undecodable_bytes_and_missing_is_none(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"a\xff\n")
    assert fileio.read_text(str(p)).encode("utf-8", "surrogateescape") == b"a\xff\n"
    assert fileio.read_text(str(p), strip=True) == "a\udcff"
    assert fileio.read_text(str(tmp_path / "none")) is None
    with pytest.raises(OSError):
        fileio.read_text(str(tmp_path / "none"), must_exist=True)


def test_load_json_default_on_missing_or_broken(tmp_path):
    p = tmp_path / "j"
    assert fileio.load_json(str(p), {}) == {}
    p.write_text("{broken")
    assert fileio.load_json(str(p)) is None
    p.write_text('{"a": 1}')
    assert fileio.load_json(str(p)) == {"a": 1}


def test_backup_takes_the_next_free_name_0600_in_a_0700_dir(tmp_path):
    dest = str(tmp_path / "bk" / "etc" / "x.conf.20260101T000000")
    assert fileio.backup(b"1", dest) == dest
    assert fileio.backup(b"2", dest) == dest + ".1"
    assert open(dest + ".1", "rb").read() == b"2"
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(str(tmp_path / "bk" / "etc")).st_mode) == 0o700


def test_atomic_write_preserves_mode_by_default_and_pmxcfs_keeps_its_rules(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"old")
    os.chmod(str(p), 0o600)
    fileio.atomic_write(str(p), b"new")
    assert p.read_bytes() == b"new" and stat.S_IMODE(os.stat(str(p)).st_mode) == 0o600
    with pytest.raises(pmxcfs.PmxcfsError):
        pmxcfs.atomic_write(str(p), b"x" * (pmxcfs.MAX_FILE_SIZE + 1))
    assert pmxcfs.atomic_write is not fileio.atomic_write and pmxcfs.tmp_path is fileio.tmp_path


def test_unique_tmp_lets_threads_write_the_same_file(tmp_path):
    p = str(tmp_path / "progress.json")
    errors = []

    def write(i):
        try:
            for _n in range(50):
                fileio.atomic_write(p, b"%d" % i, mode=fileio.MODE_DEFAULT, default_mode=0o600, unique_tmp=True)
        except Exception as e:  # pylint: disable=broad-except
            errors.append(e)
    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and os.listdir(str(tmp_path)) == ["progress.json"]
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
