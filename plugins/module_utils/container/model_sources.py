# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where hf_model's bytes come from: the Hub, a mirror directory, a peer's model directory over SSH.

A source only delivers bytes: ``label``, ``has(entry)`` and ``open(entry, offset)`` (a context manager yielding
``(start, iterator of bytes)``, ``start`` being ``offset`` or 0 when the source must start over). Sizes and hashes
always come from the Hub's listing or the operator's manifest; ``hf.download_one`` checks and publishes for all of
them, so a peer is never trusted for anything but bytes.

A peer is read with the OpenSSH client of the target: the SGLang venv has no paramiko, and OpenSSH multiplexing gives
one handshake per peer (a ControlMaster) and then a cheap channel per file. Host keys are checked against the given
known_hosts file only (StrictHostKeyChecking=yes, no trust on first use).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import hf

KEYS = {"hub": {"type"}, "mirror": {"type", "path"}, "peer": {"type", "ssh", "port", "path", "vmid", "bwlimit"}}
_DEST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9_.:\[\]-]+$")
_HEX = {"sha256": re.compile(r"^[0-9a-f]{64}$"), "oid": re.compile(r"^[0-9a-f]{40}$")}
PERSIST_S = 60  # a master left behind by a killed run goes away on its own this long after its last channel


def _peer_problem(src):
    if not isinstance(src.get("ssh"), str) or src["ssh"].startswith("-") or not _DEST.match(src["ssh"]):
        return "ssh must be user@host (got %r)" % src.get("ssh")
    for key, low, high in (("port", 1, 65535), ("vmid", 100, 999999999), ("bwlimit", 0, None)):
        v = src.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low or (high and v > high)):
            return "%s must be an integer from %d%s (got %r)" % (key, low, " to %d" % high if high else "", v)
    return None


def require_valid(p, check_mode=False):
    """Failure model_input when hf_model's options cannot be used (checked before anything is written). Check mode
    contacts no peer, so it needs no SSH key (the role's probe runs without one)."""
    bad = hf.check_local_dir(p["local_dir"]) or check_inputs(p, check_mode)
    if bad:
        raise Failure("model_input", bad)


def check_inputs(p, check_mode=False):
    """Why the sources / manifest / SSH options (or max_workers) cannot be used, or None."""
    sources = p.get("sources")
    if p.get("max_workers") is not None and p["max_workers"] < 1:
        return "max_workers must be at least 1"
    if not sources:
        return "sources is empty: give at least one, e.g. [{type: hub}]"
    for i, src in enumerate(sources):
        kind = src.get("type") if isinstance(src, dict) else None
        if kind not in KEYS:
            return "sources[%d]: %r is not {type: hub|mirror|peer, ...}" % (i, src)
        bad = set(src) - KEYS[kind]
        path = src.get("path")
        why = ("unknown key(s) %s (known: %s)" % (", ".join(sorted(bad)), ", ".join(sorted(KEYS[kind]))) if bad else
               "path must be an absolute path (got %r)" % path if kind != "hub" and not (
                   isinstance(path, str) and path.startswith("/")) else
               _peer_problem(src) if kind == "peer" else None)
        if why:
            return "sources[%d] (%s): %s" % (i, kind, why)
    if not check_mode and any(s["type"] == "peer" for s in sources):
        for opt in ("ssh_key_file", "ssh_known_hosts_file"):
            if not p.get(opt) or not os.path.isabs(p[opt]) or any(c.isspace() for c in p[opt]):
                return "a peer source needs %s: an absolute path without whitespace (got %r)" % (opt, p.get(opt))
    if p.get("manifest") is not None:
        if not hf.is_commit(p.get("revision")):
            return "with a manifest, revision must be the commit sha the manifest describes (got %r)" % p.get("revision")
        return manifest_problem(p["manifest"])
    return None


def manifest_problem(manifest):
    if not manifest:
        return "manifest is empty: list the files ({path, size, sha256} or {path, size, oid}) or leave it out"
    seen = set()
    for i, item in enumerate(manifest):
        if not isinstance(item, dict) or set(item) - {"path", "size", "sha256", "oid"} or "path" not in item:
            return "manifest[%d]: %r is not {path, size, sha256|oid}" % (i, item)
        try:
            hf.safe_relpath(item["path"])
        except hf.HfError as e:
            return "manifest[%d]: %s" % (i, e)
        size = item.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or item["path"] in seen:
            return "manifest[%d] (%s): a size (integer >= 0) and a path listed once are needed" % (i, item["path"])
        if not any(_HEX[k].match(str(item.get(k) or "")) for k in _HEX) or any(
                item.get(k) is not None and not _HEX[k].match(str(item[k])) for k in _HEX):
            return "manifest[%d] (%s): sha256 must be 64 and oid 40 lowercase hex digits, one of them given" % (i, item["path"])
        seen.add(item["path"])
    return None


def manifest_entries(manifest):
    """The manifest as the listing ``hf`` works on (sorted by path)."""
    return sorted(({"path": m["path"], "size": m["size"], "oid": m.get("oid"), "sha256": m.get("sha256")} for m in manifest),
                  key=lambda e: e["path"])


class SshIdentity(object):
    """The SSH key, moved from the role's file into a private 0700 directory (on /run, a tmpfs, when writable) that
    also holds the control sockets; ``cleanup`` removes it all."""

    def __init__(self, key_file, known_hosts):
        self.dir = tempfile.mkdtemp(prefix="kpro-hf-ssh.", dir="/run" if os.access("/run", os.W_OK) else None)
        self.key, self.known_hosts, self.secrets = os.path.join(self.dir, "id"), known_hosts, []
        try:
            content = hf.take_secret_file(key_file, "ssh_key_file", "model_input")
        except Failure:
            self.cleanup()
            raise
        fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        text = content.decode("utf-8", "replace")
        # the whole key and each of its lines: a message quoting a part of it shows none of it
        self.secrets = [text.strip()] + [ln.strip() for ln in text.splitlines() if len(ln.strip()) >= 16 and not ln.startswith("-----")]

    @classmethod
    def take(cls, p):
        """The identity of a download run (None without a key, or in watch mode, which reads no key)."""
        return cls(p["ssh_key_file"], p.get("ssh_known_hosts_file")) if p.get("ssh_key_file") and not p.get("job") else None

    def options(self):
        return ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + self.known_hosts,
                "-o", "IdentitiesOnly=yes", "-i", self.key, "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "Compression=no", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class Bucket(object):
    """A peer's ``bwlimit`` (bytes/s, 0 = none), shared by its channels: each block is due when the ones before it
    would have passed at that rate (as rsync's --bwlimit, a copy from a host still serving leaves it its link)."""

    def __init__(self, rate, clock=time.monotonic, sleep=time.sleep):
        self.rate, self.clock, self.sleep, self.due, self.lock = rate, clock, sleep, 0.0, threading.Lock()

    def take(self, n):
        if not self.rate:
            return
        with self.lock:
            now = self.clock()
            self.due = max(self.due, now) + float(n) / self.rate
            wait = self.due - now
        if wait > 0:
            self.sleep(wait)


class HubSource(object):
    """The Hub through ``hf.HubClient`` (made on first use: a run whose files all come from peers builds none): one
    HEAD per file for its URL (a signed CDN URL gets no token), then a GET with Range."""
    label = "hub"

    def __init__(self, client_factory, repo_id, commit):
        self._factory, self.repo_id, self.commit, self._client, self._where = client_factory, repo_id, commit, None, {}

    def has(self, entry):
        return True

    @property
    def endpoint(self):
        return getattr(self._client, "endpoint", "the hub")

    def probe(self, entry):
        """The HEAD of one file (the access check), or None without a client."""
        if self._client is None:
            self._client = self._factory()
        return self._target(entry) if self._client is not None else None

    def _target(self, entry):
        if entry["path"] not in self._where:
            location, same_origin = self._client.file_location(self.repo_id, self.commit, entry)
            headers = self._client.headers()
            if not same_origin:  # a signed CDN URL: the token stays on the hub
                headers = dict((k, v) for k, v in headers.items() if k.lower() != "authorization")
            self._where[entry["path"]] = (location, headers)
        return self._where[entry["path"]]

    @contextlib.contextmanager
    def open(self, entry, offset):
        if self.probe(entry) is None:
            raise hf.HfError("%s: no hub client" % entry["path"])
        location, headers = self._target(entry)
        ranged = dict(headers, Range="bytes=%d-" % offset) if offset else headers
        with contextlib.ExitStack() as stack:
            status, rheaders, body = stack.enter_context(self._client.stream(location, ranged))
            if status == 416 and offset:  # the part is no prefix the server knows: start over
                stack.close()
                offset, (status, rheaders, body) = 0, stack.enter_context(self._client.stream(location, headers))
            if status >= 400:
                cls = hf.HfFatal if status < 500 and status not in (408, 429) else hf.HfError
                raise cls("%s: GET answered HTTP %d" % (entry["path"], status))
            if status == 206:
                m = re.match(r"bytes (\d+)-", rheaders.get("Content-Range") or "")
                if not m or int(m.group(1)) != offset:
                    raise hf.HfError("%s: asked for bytes from %d, got Content-Range %r" % (
                        entry["path"], offset, rheaders.get("Content-Range")))
            yield (offset if status == 206 else 0), body  # a 200 to a Range request: the whole file again


class MirrorSource(object):
    """A directory on the target (an NFS mount, a copy on another disk) laid out as the model directory."""

    def __init__(self, path):
        self.path, self.label = path, "mirror:" + path

    def _file(self, entry):
        return os.path.join(self.path, hf.safe_relpath(entry["path"]))

    def has(self, entry):
        try:
            st = os.stat(self._file(entry))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == entry["size"]

    @contextlib.contextmanager
    def open(self, entry, offset):
        try:
            f = open(self._file(entry), "rb")
        except OSError as e:  # a read error of the source is the source's, never fatal for the run
            raise hf.HfError("%s: %s: %s" % (entry["path"], self.label, e))
        with f:
            f.seek(offset)
            yield offset, _blocks(f, entry, self.label)


def _blocks(f, entry, label):
    try:
        yield from iter(lambda: f.read(hf.CHUNK), b"")
    except OSError as e:
        raise hf.HfError("%s: %s: %s" % (entry["path"], label, e))


class PeerSource(object):
    """Another machine's model directory over SSH (``vmid``: a container of that Proxmox host, through ``pct exec``):
    one master connection, the peer's listing in one command, then ``tail -c +N`` per file over the master."""

    def __init__(self, spec, identity, index):
        self.dest, self.port, self.vmid, self.path = spec["ssh"], spec.get("port") or 22, spec.get("vmid"), spec["path"]
        self.label = "peer:%s%s:%s" % (self.dest, ":%d" % self.vmid if self.vmid else "", self.path)
        self.identity, self.index, self.bucket = identity, index, Bucket(spec.get("bwlimit") or 0)
        self.sizes, self.started = {}, False

    @property
    def ctl(self):
        """The master's control socket, in the identity's private directory (a check-mode run has no identity and never
        connects)."""
        return os.path.join(self.identity.dir, "c%d" % self.index)

    def argv(self, words, master=False):
        mux = ["-o", "ControlMaster=yes", "-o", "ControlPersist=%d" % PERSIST_S] if master else ["-o", "ControlMaster=no"]
        remote = (["pct", "exec", str(self.vmid), "--"] if self.vmid else []) + list(words)
        return (["ssh"] + self.identity.options() + ["-p", str(self.port), "-o", "ControlPath=" + self.ctl] + mux
                + [self.dest, " ".join(shlex.quote(w) for w in remote)])

    def start(self):
        """Open the master and read the peer's sizes; None, or why the peer serves nothing this run."""
        self.started = True
        with tempfile.TemporaryFile() as err:
            try:
                # not run_command: the module's runner is not at hand here, and the file reads below must stream
                listing = self.argv(["find", self.path, "-type", "f", "-printf", "%s %P\\0"], master=True)
                r = subprocess.run(listing, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,  # pylint: disable=ansible-bad-function
                                   timeout=300, check=False)
            except (OSError, subprocess.SubprocessError) as e:
                return "%s: %s" % (self.label, e)
            if r.returncode != 0:
                return "%s: listing exited %d: %s" % (self.label, r.returncode, _tail(err))
        for item in r.stdout.split(b"\0"):
            size, _sp, path = item.decode("utf-8", "surrogateescape").partition(" ")
            if size.isdigit() and path:
                self.sizes[path] = int(size)
        return None

    def has(self, entry):
        return self.sizes.get(entry["path"]) == entry["size"]

    @contextlib.contextmanager
    def open(self, entry, offset):
        remote = posixpath.join(self.path, hf.safe_relpath(entry["path"]))
        with tempfile.TemporaryFile() as err:
            read = self.argv(["tail", "-c", "+%d" % (offset + 1), "--", remote])
            proc = subprocess.Popen(read, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)  # pylint: disable=ansible-bad-function
            try:
                yield offset, self._read(proc, err, entry)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                proc.stdout.close()

    def _read(self, proc, err, entry):
        for block in iter(lambda: os.read(proc.stdout.fileno(), hf.CHUNK), b""):
            self.bucket.take(len(block))
            yield block
        if proc.wait() != 0:
            raise hf.HfError("%s: %s: the remote read exited %d: %s" % (entry["path"], self.label, proc.returncode, _tail(err)))

    def close(self):
        if self.started:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["ssh", "-o", "ControlPath=" + self.ctl, "-O", "exit", self.dest],  # pylint: disable=ansible-bad-function
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)


def _tail(err):
    err.seek(0)
    lines = err.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else "(no message)"


@contextlib.contextmanager
def opened(specs, hub_factory, repo_id, commit, identity, idle=False):
    """The sources of ``specs`` in order, yielded with the warnings of peers that serve nothing; peers are started
    (master and listing) unless ``idle`` (check mode, nothing to fetch: no peer is contacted) and closed at the end,
    also on failure."""
    out, warnings = [], []
    try:
        for i, spec in enumerate(specs or [{"type": "hub"}]):
            if spec["type"] == "hub":
                out.append(HubSource(hub_factory, repo_id, commit))
            elif spec["type"] == "mirror":
                out.append(MirrorSource(spec["path"]))
            else:
                out.append(PeerSource(spec, identity, i))
                why = None if idle else out[-1].start()
                if why:
                    warnings.append("%s; its files come from the next source" % why)
        yield out, warnings
    finally:
        for src in out:
            if isinstance(src, PeerSource):
                src.close()
