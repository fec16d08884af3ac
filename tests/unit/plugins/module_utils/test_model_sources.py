# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_sources.py and hf.download_one over several sources: mirror, peer (a fake ``ssh`` on PATH that runs the
remote command here), fallbacks, resume, bwlimit, the input checks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import time

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import model_sources as ms

FAKE_SSH = r'''#!%(python)s
"""A stand-in for the OpenSSH client: runs the remote command locally with sh (ControlMaster/ControlPath and the
other options are ignored, -O exit answers 0), logs each call as a JSON line to $FAKE_SSH_LOG.
FAKE_SSH_DIE_AFTER=N: a remote tail sends N bytes and the connection dies (exit 255).
FAKE_SSH_FAIL=1: the connection is refused (exit 255). FAKE_SSH_LEAK=1: stderr quotes the key's second line."""
import json, os, subprocess, sys
args = sys.argv[1:]
i, ctl, key = 0, None, None
while i < len(args) and args[i].startswith("-"):
    if args[i] in ("-o", "-i", "-p", "-S", "-F", "-O", "-l"):
        ctl = args[i + 1] if args[i] == "-O" else ctl
        key = args[i + 1] if args[i] == "-i" else key
        i += 2
    else:
        i += 1
dest, remote = args[i], " ".join(args[i + 1:])
with open(os.environ["FAKE_SSH_LOG"], "a") as f:
    f.write(json.dumps({"argv": args, "dest": dest, "remote": remote, "ctl": ctl, "key_exists": bool(key and os.path.exists(key))}) + "\n")
if ctl:
    sys.exit(0)
if os.environ.get("FAKE_SSH_LEAK"):
    sys.stderr.write("oops " + open(key).read().splitlines()[1] + "\n")
    sys.exit(255)
if os.environ.get("FAKE_SSH_FAIL"):
    sys.stderr.write("root@peer: Permission denied (publickey).\n")
    sys.exit(255)
p = subprocess.Popen(["sh", "-c", remote], stdout=subprocess.PIPE)
die = int(os.environ.get("FAKE_SSH_DIE_AFTER") or -1) if remote.startswith(("tail", "pct exec 131 -- tail")) else -1
sent = 0
out = sys.stdout.buffer
while True:
    block = p.stdout.read(65536 if die < 0 else min(65536, die - sent))
    if not block:
        break
    out.write(block)
    sent += len(block)
    if die >= 0 and sent >= die:
        out.flush()
        p.kill()
        sys.exit(255)
out.flush()
sys.exit(p.wait())
'''

FAKE_PCT = '''#!/bin/sh
# pct exec VMID -- CMD...: the command runs here (the peer container's filesystem is this one)
[ "$1" = exec ] || exit 2
shift 2
[ "$1" = -- ] && shift
exec "$@"
'''

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n" \
      "QyNTUxOQAAACBZkproTestKeyBodyDoNotLogThisLine0123456789abcdefAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


def install_fake_ssh(bindir, monkeypatch):
    """``ssh`` and ``pct`` stand-ins first on PATH; returns a function giving the logged calls."""
    os.makedirs(str(bindir), exist_ok=True)
    for name, text in (("ssh", FAKE_SSH % {"python": sys.executable}), ("pct", FAKE_PCT)):
        path = os.path.join(str(bindir), name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    log = os.path.join(str(bindir), "ssh.log")
    open(log, "w").close()
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("FAKE_SSH_LOG", log)
    for var in ("FAKE_SSH_DIE_AFTER", "FAKE_SSH_FAIL", "FAKE_SSH_LEAK"):
        monkeypatch.delenv(var, raising=False)

    def calls(clear=True):
        with open(log) as f:
            out = [json.loads(line) for line in f if line.strip()]
        if clear:
            open(log, "w").close()
        return out
    return calls


def write_key(path):
    with open(str(path), "w") as f:
        f.write(KEY)
    os.chmod(str(path), 0o600)
    return str(path)


class Progress(object):
    def __init__(self):
        self.done = 0

    def file_start(self, path, have, size):
        pass

    def add(self, path, n):
        self.done += n

    def restart_file(self, path, lost=None):
        pass


class Fake(object):
    """A source serving ``data`` (``cut``: dies after that many bytes of a read; ``fatal``: raises HfFatal)."""

    def __init__(self, label, data, cut=None, fatal=False, present=True):
        self.label, self.data, self.cut, self.fatal, self.present, self.opened = label, data, cut, fatal, present, []

    def has(self, entry):
        return self.present

    @contextlib.contextmanager
    def open(self, entry, offset):
        self.opened.append(offset)
        if self.fatal:
            raise hf.HfFatal("%s: no space" % entry["path"])
        body = self.data[offset:] if self.cut is None else self.data[offset:offset + self.cut]
        yield offset, iter([body[i:i + 1000] for i in range(0, len(body), 1000)])


def entry_for(data, path="model-00001-of-00002.safetensors"):
    return {"path": path, "size": len(data), "oid": "0" * 40, "sha256": hashlib.sha256(data).hexdigest()}


DATA = os.urandom(10000)


def test_mismatch_goes_to_the_next_source_from_byte_zero(tmp_path):
    bad = bytearray(DATA)
    bad[5000] ^= 1
    peer, hub = Fake("peer:x", bytes(bad)), Fake("hub", DATA)
    got = hf.download_one([peer, hub], str(tmp_path), "c" * 40, entry_for(DATA), Progress(), retries=0, backoff=0)
    assert got["source"] == "hub" and hub.opened == [0] and got["bytes"] == {"peer:x": 10000, "hub": 10000}
    assert [(f["from"], f["to"], f["reason"]) for f in got["fallbacks"]] == [("peer:x", "hub", "mismatch")]
    assert "sha256 mismatch" in got["fallbacks"][0]["error"]
    assert (tmp_path / entry_for(DATA)["path"]).read_bytes() == DATA and got["marker"]["digest"] == entry_for(DATA)["sha256"]


def test_transport_error_keeps_the_part_and_the_next_source_continues(tmp_path):
    peer, mirror = Fake("peer:x", DATA, cut=4000), Fake("mirror:/m", DATA)
    got = hf.download_one([Fake("absent", DATA, present=False), peer, mirror], str(tmp_path), "c" * 40, entry_for(DATA),
                          Progress(), retries=0, backoff=0)
    assert peer.opened == [0] and mirror.opened == [4000]
    assert got["source"] == "mirror:/m" and got["bytes"] == {"peer:x": 4000, "mirror:/m": 6000}
    assert got["fallbacks"][0]["reason"] == "transport" and got["fallbacks"][0]["from"] == "peer:x"
    assert (tmp_path / entry_for(DATA)["path"]).read_bytes() == DATA


def test_last_error_is_the_files_and_the_part_is_kept_fatal_stops(tmp_path):
    e = entry_for(DATA)
    with pytest.raises(hf.HfError, match="ended at 3000 of 10000"):
        hf.download_one([Fake("peer:x", DATA, cut=3000)], str(tmp_path), "c" * 40, e, Progress(), retries=0, backoff=0)
    assert os.path.getsize(hf.incomplete_path(str(tmp_path), e["path"])) == 3000
    after = Fake("hub", DATA)
    with pytest.raises(hf.HfFatal):
        hf.download_one([Fake("peer:x", DATA, fatal=True), after], str(tmp_path), "c" * 40, e, Progress(), retries=0, backoff=0)
    assert after.opened == []
    with pytest.raises(hf.HfError, match="no source has it"):
        hf.download_one([Fake("peer:x", DATA, present=False)], str(tmp_path), "c" * 40, e, Progress())


class Client(object):
    """HubClient's interface: statuses to answer, in order."""

    def __init__(self, answers, data):
        self.answers, self.data, self.ranges, self.endpoint = list(answers), data, [], "http://hub"

    def file_location(self, repo_id, commit, entry):
        return "http://cdn/x", False

    def headers(self):
        return {"authorization": "Bearer t", "Accept-Encoding": "identity"}

    @contextlib.contextmanager
    def stream(self, url, headers):
        self.ranges.append(headers.get("Range"))
        assert "authorization" not in headers  # another origin: the token stays on the hub
        status = self.answers.pop(0)
        start = int(headers["Range"][6:-1]) if status == 206 else 0
        yield status, {"Content-Range": "bytes %d-%d/%d" % (start, len(self.data) - 1, len(self.data))}, iter([self.data[start:]])


@pytest.mark.parametrize("answers,ranges", [([206], ["bytes=4000-"]), ([200], ["bytes=4000-"]),
                                            ([416, 200], ["bytes=4000-", None])])
def test_hub_source_resumes_or_starts_over(tmp_path, answers, ranges):
    e = entry_for(DATA)
    part = hf.incomplete_path(str(tmp_path), e["path"])
    os.makedirs(os.path.dirname(part))
    with open(part, "wb") as f:
        f.write(DATA[:4000])
    client = Client(answers, DATA)
    got = hf.download_one([ms.HubSource(lambda: client, "r/m", "c" * 40)], str(tmp_path), "c" * 40, e, Progress(), retries=0)
    assert client.ranges == ranges and (tmp_path / e["path"]).read_bytes() == DATA
    assert got["bytes"]["hub"] == (6000 if answers == [206] else 10000)


def test_mirror_source(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "a.bin").write_bytes(DATA)
    src = ms.MirrorSource(str(mirror))
    assert src.label == "mirror:%s" % mirror
    assert src.has(entry_for(DATA, "a.bin")) and not src.has(entry_for(DATA + b"x", "a.bin")) and not src.has(entry_for(DATA, "b"))
    with src.open(entry_for(DATA, "a.bin"), 7000) as (start, body):
        assert start == 7000 and b"".join(body) == DATA[7000:]


@pytest.fixture
def peer_env(tmp_path, monkeypatch):
    calls = install_fake_ssh(tmp_path / "bin", monkeypatch)
    kh = tmp_path / "known_hosts"
    kh.write_text("10.213.5.3 ssh-ed25519 AAAA\n")
    role_key = write_key(tmp_path / "role-key")
    ident = ms.SshIdentity(role_key, str(kh))
    yield calls, ident, tmp_path
    ident.cleanup()


def test_ssh_identity_takes_the_key_privately(peer_env):
    _calls, ident, tmp_path = peer_env
    assert not (tmp_path / "role-key").exists()
    assert stat.S_IMODE(os.stat(ident.dir).st_mode) == 0o700 and stat.S_IMODE(os.stat(ident.key).st_mode) == 0o600
    with open(ident.key) as f:
        assert f.read() == KEY
    line = KEY.splitlines()[2]
    assert hf.scrub("x %s y" % line, None, ident.secrets) == "x ******** y" and "BEGIN" in hf.scrub(KEY, ident.secrets[1:])
    ident.cleanup()
    assert not os.path.exists(ident.dir)
    with pytest.raises(Failure, match="cannot read ssh_key_file"):
        ms.SshIdentity(str(tmp_path / "gone"), "/kh")


def test_peer_lists_once_then_one_channel_per_file_resuming(peer_env):
    calls, ident, tmp_path = peer_env
    model = tmp_path / "peer model"  # a space: every remote word is quoted
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "a.bin").write_bytes(DATA)
    (model / "b.json").write_bytes(b"{}")
    peer = ms.PeerSource({"ssh": "root@10.213.5.3", "port": 2222, "path": str(model), "vmid": 131}, ident, 0)
    assert peer.label == "peer:root@10.213.5.3:131:%s" % model
    assert peer.start() is None and peer.sizes == {"sub/a.bin": 10000, "b.json": 2}
    e = entry_for(DATA, "sub/a.bin")
    assert peer.has(e) and not peer.has(dict(e, size=9999)) and not peer.has(entry_for(DATA, "c.bin"))
    with peer.open(e, 4000) as (start, body):
        assert start == 4000 and b"".join(body) == DATA[4000:]
    peer.close()
    log = calls()
    assert [c["ctl"] for c in log] == [None, None, "exit"]
    master, read = log[0]["argv"], log[1]["argv"]
    assert "ControlMaster=yes" in master and "ControlMaster=no" in read and "ControlPersist=60" in master
    ctlpath = [a for a in master if a.startswith("ControlPath=")]
    assert ctlpath and ctlpath == [a for a in read if a.startswith("ControlPath=")] and ctlpath[0].startswith("ControlPath=" + ident.dir)
    for opt in ("BatchMode=yes", "StrictHostKeyChecking=yes", "UserKnownHostsFile=%s" % ident.known_hosts, "IdentitiesOnly=yes",
                "ServerAliveInterval=5", "ServerAliveCountMax=3", "Compression=no"):
        assert opt in master and opt in read
    assert master[master.index("-i") + 1] == ident.key and master[master.index("-p") + 1] == "2222"
    assert log[0]["remote"].startswith("pct exec 131 -- find '%s' -type f -printf" % model)
    assert log[1]["remote"] == "pct exec 131 -- tail -c +4001 -- '%s/sub/a.bin'" % model


def test_peer_that_cannot_be_reached_serves_nothing(peer_env, monkeypatch):
    calls, ident, tmp_path = peer_env
    monkeypatch.setenv("FAKE_SSH_FAIL", "1")
    with ms.opened([{"type": "peer", "ssh": "root@h", "path": str(tmp_path)}, {"type": "hub"}], lambda: None, "r/m", "c", ident) as (
            sources, warnings):
        assert not sources[0].has(entry_for(DATA, "known_hosts")) and sources[1].label == "hub"
    assert len(warnings) == 1 and "listing exited 255" in warnings[0] and "Permission denied" in warnings[0]
    assert [c["ctl"] for c in calls()] == [None, "exit"]  # the master is closed, also after a failure
    with ms.opened([{"type": "peer", "ssh": "root@h", "path": str(tmp_path)}], None, "r/m", "c", ident, idle=True) as (sources, w):
        assert w == [] and not sources[0].has(entry_for(DATA, "known_hosts"))
    assert calls() == []  # check mode: no peer is contacted


def test_peer_bwlimit_is_shared_and_honoured(peer_env):
    _calls, ident, tmp_path = peer_env
    model = tmp_path / "m"
    model.mkdir()
    data = os.urandom(300 * 1024)
    (model / "a.bin").write_bytes(data)
    peer = ms.PeerSource({"ssh": "root@h", "path": str(model), "bwlimit": 1024 * 1024}, ident, 1)
    assert peer.start() is None
    t0 = time.monotonic()
    with peer.open(entry_for(data, "a.bin"), 0) as (_start, body):
        assert b"".join(body) == data
    assert time.monotonic() - t0 >= 0.9 * len(data) / (1024 * 1024)


def test_bucket_paces_blocks():
    now = [0.0]
    slept = []
    b = ms.Bucket(1000, clock=lambda: now[0], sleep=slept.append)
    for _i in range(4):
        b.take(500)
    assert slept == [0.5, 1.0, 1.5, 2.0]  # 2000 bytes at 1000 B/s: done after 2 s
    ms.Bucket(0, sleep=slept.append).take(10 ** 9)
    assert len(slept) == 4


def params(**kw):
    p = {"local_dir": "/srv/models/m", "revision": "a" * 40, "max_workers": 2, "sources": [{"type": "hub"}], "manifest": None,
         "ssh_key_file": None, "ssh_known_hosts_file": None}
    p.update(kw)
    return p


PEER = {"type": "peer", "ssh": "root@10.213.5.3", "path": "/srv/models/m"}


@pytest.mark.parametrize("kw,words", [
    ({"sources": []}, "sources is empty"),
    ({"sources": [{"type": "ftp"}]}, "is not {type: hub|mirror|peer"),
    ({"sources": [{"type": "hub", "url": "x"}]}, "unknown key(s) url"),
    ({"sources": [{"type": "mirror", "path": "rel/dir"}]}, "absolute path"),
    ({"sources": [PEER]}, "needs ssh_key_file"),
    ({"sources": [PEER], "ssh_key_file": "/run/k"}, "needs ssh_known_hosts_file"),
    ({"sources": [dict(PEER, ssh="-oProxyCommand=sh")], "ssh_key_file": "/k", "ssh_known_hosts_file": "/kh"}, "ssh must be"),
    ({"sources": [dict(PEER, port=0)], "ssh_key_file": "/k", "ssh_known_hosts_file": "/kh"}, "port must be"),
    ({"sources": [dict(PEER, vmid="131")], "ssh_key_file": "/k", "ssh_known_hosts_file": "/kh"}, "vmid must be"),
    ({"sources": [dict(PEER, path="x")], "ssh_key_file": "/k", "ssh_known_hosts_file": "/kh"}, "absolute path"),
    ({"max_workers": 0}, "max_workers"),
    ({"manifest": []}, "manifest is empty"),
    ({"manifest": [{"path": "a", "size": 1, "sha256": "x" * 64}]}, "64 and oid 40"),
    ({"manifest": [{"path": "a", "size": 1}]}, "one of them given"),
    ({"manifest": [{"path": "../a", "size": 1, "oid": "a" * 40}]}, "outside local_dir"),
    ({"manifest": [{"path": "a", "size": -1, "oid": "a" * 40}]}, "size"),
    ({"manifest": [{"path": "a", "size": 1, "oid": "a" * 40}] * 2}, "listed once"),
    ({"manifest": [{"path": "a", "size": 1, "oid": "a" * 40, "md5": "x"}]}, "is not {path, size"),
    ({"manifest": [{"path": "a", "size": 1, "oid": "a" * 40}], "revision": "main"}, "revision must be the commit"),
])
def test_bad_inputs(kw, words):
    why = ms.check_inputs(params(**kw))
    assert why and words in why, why
    with pytest.raises(Failure) as e:
        ms.require_valid(params(**kw))
    assert e.value.phase == "model_input"


def test_good_inputs_and_manifest_entries():
    assert ms.check_inputs(params(sources=[dict(PEER, vmid=131, port=22, bwlimit=0), {"type": "mirror", "path": "/mnt/m"},
                                           {"type": "hub"}], ssh_key_file="/run/k", ssh_known_hosts_file="/etc/kh")) is None
    man = [{"path": "b", "size": 2, "oid": "b" * 40}, {"path": "a", "size": 1, "sha256": "a" * 64}]
    assert ms.check_inputs(params(manifest=man)) is None
    assert ms.manifest_entries(man) == [{"path": "a", "size": 1, "oid": None, "sha256": "a" * 64},
                                        {"path": "b", "size": 2, "oid": "b" * 40, "sha256": None}]
