# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's controller-side services: a file server, a package index and a mock Hugging Face Hub.

Runs on the controller with the project venv's python (stdlib only). A service is started when its
port option is given; port 0 picks a free port (the READY line says which)::

    .venv/bin/python tests/lab/services/labsvc.py --addr 10.213.5.1 --state-dir tests/lab/.run/labsvc \\
        --files-port 18600 --files-dir tests/lab/rootfs/usr/lib/kpro-lab/blobs \\
        --index-port 18601 --index-dir /var/cache/kpgs-lab/wheels --index-dir tests/lab/.run/wheels \\
        --hub-port 18602 --hub-cdn-port 18603 [--hub-token-file F | --hub-token T] [--hub-shards 15] [--hub-shard-size 2MiB]

Options:
  --addr ADDR          address every service binds (the lab: 10.213.5.1; tests: 127.0.0.1)
  --state-dir DIR      logs, pidfile and the generated hub repository go here (created)
  --files-port/--files-dir   file server of one directory
  --index-port/--index-dir   PEP 503/691 simple index of the wheels/sdists in every --index-dir (repeatable)
  --hub-port           mock Hub serving Qwen/Qwen3.6-27B at commit HUB_COMMIT (``main`` resolves to it)
  --hub-cdn-port       the hub's "CDN" origin for LFS bytes (default 0 = any free port; the lab: 18603). A separate
                       origin, as on the real hub, so huggingface_hub does not follow the redirect on HEAD and does
                       not send the token there
  --hub-token T / --hub-token-file F / env LABSVC_HUB_TOKEN
                       require ``Authorization: Bearer T`` on the hub's API and resolve URLs (401 otherwise)
  --hub-shards N       number of safetensors shards (default 15, as the index fixture names them)
  --hub-shard-size S   approximate size of each shard, bytes or with KiB/MiB/GiB (default 2MiB)
  --hub-fixtures DIR   where config.json and model.safetensors.index.json come from
                       (default tests/unit/fixtures/qwen3.6-27b)

Once every service listens it writes ``<state-dir>/labsvc.pid`` and ``<state-dir>/labsvc.json`` and prints
one line ``READY {"pid": N, "files": URL, "index": URL, "hub": URL}`` on stdout. SIGTERM or SIGINT ends it
(the pidfile is removed). Every request is logged as one JSON line to ``<state-dir>/<service>-access.jsonl``.

File server: ``GET/HEAD /<path>`` with Content-Length and single-range ``Range``; ``/<path>.sha256`` is
computed on the fly (``sha256sum`` format) unless a real sidecar exists; ``/`` lists the files as JSON.

Package index: ``/simple/`` and ``/simple/<normalized-name>/`` (HTML, or PEP 691 JSON when the Accept
header asks for ``application/vnd.pypi.simple.v1+json``); links carry ``#sha256=``, ``data-requires-python``
and PEP 658/714 core metadata (``/files/<wheel>.metadata``); files are served from ``/files/<name>``.

Hub (what huggingface_hub 2.4.0 asks and checks: hf_api.py HfApi.model_info and list_repo_tree,
file_download.py get_hf_file_metadata and _get_metadata_or_catch_error (X-Repo-Commit, ETag, X-Linked-Etag,
X-Linked-Size), _snapshot_download.py snapshot_download):
  GET  /api/models/{repo}[/revision/{rev}]   model info (``sha``, ``siblings``, ``usedStorage``; ``?blobs=true``
                                             adds size/blobId/lfs to siblings)
  GET  /api/models/{repo}/tree/{rev}[/{dir}]?recursive=true   files with size, git oid and lfs{oid,size,pointerSize}
  GET  /api/whoami-v2                        the token's user (HfApi.whoami), 401 for another token or none
  HEAD/GET /{repo}/resolve/{rev}/{file}      regular files: 200 with ETag (git oid) and X-Repo-Commit;
                                             LFS files: 302 to <cdn>/_cdn/sha256/<oid>?... with X-Linked-Etag (sha256),
                                             X-Linked-Size, X-Repo-Commit
  GET  <cdn>/_cdn/sha256/{oid}               the LFS bytes (no auth, as a signed CDN URL), Range supported
  GET  /_log[?clear=true]                    request log as JSON (bytes = body bytes actually sent)
  GET  /_ctl?...                             faults for later body GETs of a file (the resolve GET of a regular
                                             file, the /_cdn GET of an LFS file), consumed one per GET:
      file=NAME (default: any file), cut_after=N&cut_count=K (send N body bytes then drop the connection,
      K times; with hang=S sleep S seconds before dropping), status=500&status_count=K (answer that status),
      hang=S&hang_count=K (sleep S seconds before answering), faults=cut:N,status:500,hang:S (an ordered list);
      rate=BYTES_PER_SEC throttles every body (0 = off); reset=true clears everything. Returns the state.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_FIXTURES = os.path.join(REPO_ROOT, "tests", "unit", "fixtures", "qwen3.6-27b")

HUB_REPO = "Qwen/Qwen3.6-27B"
HUB_COMMIT = "6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5"
HUB_BRANCHES = ("main",)
LFS_PATTERNS = (".safetensors", "tokenizer.json")
CHUNK = 64 * 1024
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def parse_size(text):
    m = re.match(r"^\s*(\d+)\s*([kmg]i?b?)?\s*$", str(text), re.I)
    if not m:
        raise argparse.ArgumentTypeError("not a size: %r" % text)
    mult = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[(m.group(2) or "")[:1].lower()]
    return int(m.group(1)) * mult


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            h.update(block)
    return h.hexdigest()


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def parse_range(value, size):
    """(start, end_inclusive) for a single ``bytes=`` range, None for no/unsupported range, 'bad' if unsatisfiable."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    first, _sep, last = value[6:].strip().partition("-")
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return "bad"
            return (max(size - n, 0), size - 1)
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size or end < start:
        return "bad"
    return (start, min(end, size - 1))


class AccessLog(object):
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.entries = []

    def add(self, entry):
        with self.lock:
            self.entries.append(entry)
            with open(self.path, "a") as f:
                f.write(json.dumps(entry, sort_keys=True) + "\n")

    def take(self, clear=False):
        with self.lock:
            out = list(self.entries)
            if clear:
                self.entries = []
            return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kpgs-labsvc/1"
    svc = "base"

    def log_message(self, fmt, *args):
        pass

    # -- plumbing ---------------------------------------------------------------------------------------
    def setup(self):
        BaseHTTPRequestHandler.setup(self)
        self._rec = None

    def _begin(self):
        svc = "cdn" if getattr(self.server, "is_cdn", False) else self.svc
        self._rec = {"ts": round(time.time(), 3), "svc": svc, "method": self.command, "path": self.path,
                     "range": self.headers.get("Range"), "ua": (self.headers.get("User-Agent") or "")[:80],
                     "auth": bool(self.headers.get("Authorization")), "status": None, "bytes": 0, "file": None}

    def _finish(self, log=True):
        if log and self._rec is not None:
            self.server.access_log.add(self._rec)
        self._rec = None

    def send_response(self, code, message=None):
        if self._rec is not None:
            self._rec["status"] = code
        BaseHTTPRequestHandler.send_response(self, code, message)

    def _write(self, data):
        self.wfile.write(data)
        if self._rec is not None:
            self._rec["bytes"] += len(data)

    def reply(self, code, body=b"", ctype="text/plain; charset=utf-8", headers=None):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self._write(body)

    def reply_json(self, code, obj, headers=None, ctype="application/json"):
        self.reply(code, json.dumps(obj, indent=None).encode(), ctype, headers)

    def send_file(self, path, headers=None, fault=None, ctype="application/octet-stream"):
        """Send ``path`` honouring Range; ``fault`` is a dict from the hub's fault queue or None."""
        size = os.path.getsize(path)
        rng = parse_range(self.headers.get("Range"), size)
        if rng == "bad":
            return self.reply(416, b"", headers=dict(headers or {}, **{"Content-Range": "bytes */%d" % size}))
        if fault and fault.get("kind") == "status":
            return self.reply_json(int(fault["value"]), {"error": "injected fault"})
        if fault and fault.get("kind") == "hang":
            time.sleep(float(fault["value"]))
        start, end = rng if rng else (0, size - 1)
        length = max(end - start + 1, 0)
        self.send_response(206 if rng else 200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if rng:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return None
        cut = int(fault["value"]) if fault and fault.get("kind") == "cut" else None
        # read per chunk: a test that lifts the throttle (reset=true) speeds up a body already under way
        rate_of = getattr(self.server, "rate", lambda: 0)
        sent = 0
        with open(path, "rb") as f:
            f.seek(start)
            while sent < length:
                n = min(CHUNK, length - sent)
                if cut is not None:
                    n = min(n, cut - sent)
                    if n <= 0:
                        break
                data = f.read(n)
                if not data:
                    break
                self._write(data)
                sent += len(data)
                rate = rate_of()
                if rate:
                    time.sleep(len(data) / float(rate))
        if cut is not None and sent < length:
            self.wfile.flush()
            if fault.get("hang"):
                time.sleep(float(fault["hang"]))
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return None

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self._begin()
        log = True
        try:
            log = self.route() is not False
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self._finish(log)

    def route(self):
        raise NotImplementedError


# -- file server --------------------------------------------------------------------------------------
class FilesHandler(Handler):
    svc = "files"

    def route(self):
        root = self.server.root
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        if rel == "":
            names = []
            for dirpath, _dirs, files in os.walk(root):
                for fn in files:
                    names.append(os.path.relpath(os.path.join(dirpath, fn), root))
            return self.reply_json(200, sorted(names))
        path = os.path.realpath(os.path.join(root, rel))
        if not (path + os.sep).startswith(os.path.realpath(root) + os.sep):
            return self.reply(403, "forbidden\n")
        if os.path.isfile(path):
            self._rec["file"] = rel
            return self.send_file(path)
        if rel.endswith(".sha256") and os.path.isfile(path[:-7]):
            target = path[:-7]
            st = os.stat(target)
            key = (target, st.st_size, st.st_mtime_ns)
            with self.server.lock:
                digest = self.server.hashes.get(key)
            if digest is None:
                digest = sha256_file(target)
                with self.server.lock:
                    self.server.hashes[key] = digest
            return self.reply(200, "%s  %s\n" % (digest, os.path.basename(target)))
        return self.reply(404, "not found: %s\n" % rel)


# -- package index ------------------------------------------------------------------------------------
def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(filename):
    if filename.endswith(".whl"):
        return filename.split("-")[0]
    m = re.match(r"^(.+)-[^-]+\.(tar\.gz|zip)$", filename)
    return m.group(1) if m else None


def dist_version(filename):
    if filename.endswith(".whl"):
        return filename.split("-")[1]
    m = re.match(r"^.+-([^-]+)\.(tar\.gz|zip)$", filename)
    return m.group(1) if m else None


class Index(object):
    def __init__(self, dirs):
        self.dirs = dirs
        self.lock = threading.Lock()
        self.cache = {}

    def files(self):
        out = {}
        for d in self.dirs:
            if not os.path.isdir(d):
                continue
            for fn in sorted(os.listdir(d)):
                if (fn.endswith(".whl") or fn.endswith(".tar.gz")) and fn not in out and dist_name(fn):
                    out[fn] = os.path.join(d, fn)
        return out

    def info(self, path):
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        with self.lock:
            if key in self.cache:
                return self.cache[key]
        info = {"sha256": sha256_file(path), "size": st.st_size, "requires_python": None, "metadata": None}
        if path.endswith(".whl"):
            try:
                with zipfile.ZipFile(path) as z:
                    names = [n for n in z.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n)]
                    if names:
                        meta = z.read(names[0])
                        info["metadata"] = meta
                        info["metadata_sha256"] = hashlib.sha256(meta).hexdigest()
                        for line in meta.decode("utf-8", "replace").splitlines():
                            if not line.strip():
                                break
                            if line.lower().startswith("requires-python:"):
                                info["requires_python"] = line.split(":", 1)[1].strip()
            except (zipfile.BadZipFile, OSError):
                pass
        with self.lock:
            self.cache[key] = info
        return info

    def projects(self):
        out = {}
        for fn, path in self.files().items():
            out.setdefault(normalize(dist_name(fn)), []).append((fn, path))
        return out


class IndexHandler(Handler):
    svc = "index"

    def route(self):
        index = self.server.index
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        want_json = SIMPLE_JSON in (self.headers.get("Accept") or "")
        if path in ("/", "/simple"):
            return self.reply(301, "", headers={"Location": "/simple/"})
        if path == "/simple/":
            names = sorted(index.projects())
            if want_json:
                return self.reply_json(200, {"meta": {"api-version": "1.1"}, "projects": [{"name": n} for n in names]},
                                       ctype=SIMPLE_JSON)
            body = "<!DOCTYPE html>\n<html><head><title>Simple index</title></head><body>\n%s</body></html>\n" % "".join(
                '<a href="/simple/%s/">%s</a><br/>\n' % (n, n) for n in names)
            return self.reply(200, body, "text/html; charset=utf-8")
        m = re.match(r"^/simple/([^/]+)/?$", path)
        if m:
            name = m.group(1)
            if normalize(name) != name or not path.endswith("/"):
                return self.reply(301, "", headers={"Location": "/simple/%s/" % normalize(name)})
            files = index.projects().get(name)
            if not files:
                return self.reply(404, "no such project: %s\n" % name)
            return self.project_page(name, files, want_json)
        m = re.match(r"^/files/([^/]+?)(\.metadata)?$", path)
        if m:
            files = index.files()
            fn = m.group(1)
            if fn not in files:
                return self.reply(404, "not found: %s\n" % fn)
            self._rec["file"] = fn
            if m.group(2):
                info = index.info(files[fn])
                if not info["metadata"]:
                    return self.reply(404, "no metadata\n")
                return self.reply(200, info["metadata"], "text/plain; charset=utf-8")
            return self.send_file(files[fn])
        return self.reply(404, "not found: %s\n" % path)

    def project_page(self, name, files, want_json):
        index = self.server.index
        rows = []
        for fn, p in files:
            rows.append((fn, index.info(p)))
        if want_json:
            out = {"meta": {"api-version": "1.1"}, "name": name,
                   "versions": sorted(set(dist_version(fn) for fn, _i in rows)), "files": []}
            for fn, info in rows:
                entry = {"filename": fn, "url": "/files/%s" % urllib.parse.quote(fn), "hashes": {"sha256": info["sha256"]},
                         "size": info["size"]}
                if info["requires_python"]:
                    entry["requires-python"] = info["requires_python"]
                if info["metadata"]:
                    # PEP 714's key only: Debian bookworm's pip 23.0 crashes on a dict in the older "dist-info-metadata"
                    entry["core-metadata"] = {"sha256": info["metadata_sha256"]}
                out["files"].append(entry)
            return self.reply_json(200, out, ctype=SIMPLE_JSON)
        links = []
        for fn, info in rows:
            attrs = ""
            if info["requires_python"]:
                attrs += ' data-requires-python="%s"' % html.escape(info["requires_python"], quote=True)
            if info["metadata"]:
                attrs += ' data-dist-info-metadata="sha256=%s" data-core-metadata="sha256=%s"' % (
                    info["metadata_sha256"], info["metadata_sha256"])
            links.append('<a href="/files/%s#sha256=%s"%s>%s</a><br/>\n' % (
                urllib.parse.quote(fn), info["sha256"], attrs, html.escape(fn)))
        body = "<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content=\"1.1\">" \
               "<title>Links for %s</title></head><body>\n<h1>Links for %s</h1>\n%s</body></html>\n" % (name, name, "".join(links))
        return self.reply(200, body, "text/html; charset=utf-8")


# -- hub ------------------------------------------------------------------------------------------------
def _tokenizer_files():
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u0120"]
    vocab = dict((c, i) for i, c in enumerate(chars))
    merges = ["t h", "th e", "\u0120 t", "i n", "a n"]
    for m in merges:
        vocab["".join(m.split())] = len(vocab)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = [{"id": 248043 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(specials)]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": {"type": "NFC"},
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
                 "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                     "use_regex": True},
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                           "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                           "vocab": vocab, "merges": merges}}
    tok_config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
                  "pad_token": "<|endoftext|>", "model_max_length": 262144, "tokenizer_class": "Qwen2Tokenizer",
                  "errors": "replace", "split_special_tokens": False,
                  "added_tokens_decoder": dict((str(a["id"]), dict((k, v) for k, v in a.items() if k != "id")) for a in added),
                  "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}
    return {
        "tokenizer.json": json.dumps(tokenizer, indent=2, ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": json.dumps(tok_config, indent=2).encode(),
        "vocab.json": json.dumps(vocab, ensure_ascii=False).encode("utf-8"),
        "merges.txt": ("#version: 0.2\n" + "\n".join(merges) + "\n").encode("utf-8"),
    }


def safetensors_bytes(tensors, size, rnd):
    """A valid safetensors file of about ``size`` bytes holding ``tensors`` (names) as BF16 vectors."""
    def header_for(elems):
        hdr, off = {"__metadata__": {"format": "pt"}}, 0
        for name, n in zip(tensors, elems):
            hdr[name] = {"dtype": "BF16", "shape": [n], "data_offsets": [off, off + 2 * n]}
            off += 2 * n
        raw = json.dumps(hdr, separators=(",", ":")).encode()
        return raw + b" " * (-len(raw) % 8)
    guess = len(header_for([10 ** 9] * len(tensors)))
    data_elems = max((size - 8 - guess) // 2, len(tensors))
    per = [data_elems // len(tensors)] * len(tensors)
    per[-1] += data_elems - sum(per)
    header = header_for(per)
    return len(header).to_bytes(8, "little") + header + rnd.randbytes(2 * sum(per))


class HubRepo(object):
    """The generated repository, materialized under ``<state>/hub/<commit>/`` (deterministic content)."""

    def __init__(self, state_dir, fixtures, shards, shard_size):
        self.commit = HUB_COMMIT
        self.root = os.path.join(state_dir, "hub", self.commit)
        self.files = {}
        rnd = random.Random("kpgs-hub-%d-%d" % (shards, shard_size))
        with open(os.path.join(fixtures, "config.json"), "rb") as f:
            config = f.read()
        with open(os.path.join(fixtures, "model.safetensors.index.json")) as f:
            index = json.load(f)
        names = ["model-%05d-of-%05d.safetensors" % (i, shards) for i in range(1, shards + 1)]
        weight_map = {}
        for tensor, shard in index.get("weight_map", {}).items():
            m = re.match(r"^model-(\d+)-of-(\d+)\.safetensors$", shard)
            i = min(int(m.group(1)), shards) if m else 1
            weight_map[tensor] = names[i - 1]
        layers_per = max(64 // shards, 1)
        for i, shard in enumerate(names):
            for layer in range(i * layers_per, min((i + 1) * layers_per, 64)):
                weight_map["model.language_model.layers.%d.mlp.down_proj.weight" % layer] = shard
            if shard not in weight_map.values():
                weight_map["model.language_model.extra.%d.weight" % i] = shard
        index["weight_map"] = dict(sorted(weight_map.items()))
        contents = {
            ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\ntokenizer.json filter=lfs diff=lfs merge=lfs -text\n",
            "README.md": b"---\nlicense: apache-2.0\npipeline_tag: image-text-to-text\nlibrary_name: transformers\n---\n\n"
                         b"# Qwen3.6-27B (kpgs lab stand-in)\n\nSmall, valid stand-in files; not the real weights.\n",
            "config.json": config,
            "generation_config.json": json.dumps({"bos_token_id": 248044, "do_sample": True, "eos_token_id": [248046, 248044],
                                                  "pad_token_id": 248044, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                                  "transformers_version": "4.57.1"}, indent=2).encode(),
            "model.safetensors.index.json": json.dumps(index, indent=2).encode(),
        }
        contents.update(_tokenizer_files())
        for shard in names:
            tensors = sorted(t for t, s in weight_map.items() if s == shard)
            contents[shard] = safetensors_bytes(tensors, shard_size, rnd)
        os.makedirs(self.root, exist_ok=True)
        for name in sorted(contents):
            data = contents[name]
            path = os.path.join(self.root, name)
            if not (os.path.isfile(path) and os.path.getsize(path) == len(data) and sha256_file(path) == hashlib.sha256(data).hexdigest()):
                with open(path + ".tmp", "wb") as f:
                    f.write(data)
                os.replace(path + ".tmp", path)
            entry = {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "local": path}
            if name.endswith(LFS_PATTERNS):
                pointer = ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (entry["sha256"], len(data))).encode()
                entry["oid"] = git_blob_sha1(pointer)
                entry["lfs"] = {"oid": entry["sha256"], "size": len(data), "pointerSize": len(pointer)}
            else:
                entry["oid"] = git_blob_sha1(data)
            self.files[name] = entry
        self.by_sha = dict((e["sha256"], e) for e in self.files.values() if "lfs" in e)

    def total(self):
        return sum(e["size"] for e in self.files.values())


class HubHandler(Handler):
    svc = "hub"

    def _need_auth(self):
        token = self.server.token
        if not token:
            return False
        got = self.headers.get("Authorization") or ""
        if got == "Bearer " + token:
            return False
        if not got:
            msg = "Access to model %s is restricted. You must have access to it and be authenticated to access it. Please log in." % HUB_REPO
            code = "GatedRepo"
        else:
            msg = "Invalid credentials in Authorization header"
            code = "RepoNotFound"
        self.reply_json(401, {"error": msg}, {"X-Error-Code": code, "X-Error-Message": msg})
        return True

    def _whoami(self):
        """GET /api/whoami-v2 as the Hub answers huggingface_hub's HfApi.whoami (2.4.0 hf_api.py _inner_whoami: a 401
        becomes "Invalid user token."; _login.py _login reads ``name`` and ``auth.accessToken.role``/``displayName``):
        the token's user for the lab's token, 401 for any other token or none (the Hub knows no anonymous user)."""
        got = self.headers.get("Authorization") or ""
        if not self.server.token or got != "Bearer " + self.server.token:
            msg = "Invalid credentials in Authorization header"
            return self.reply_json(401, {"error": msg}, {"X-Error-Message": msg})
        return self.reply_json(200, {"type": "user", "id": "kpgs" + "0" * 20, "name": "kpgs-lab", "fullname": "kpgs lab",
                                     "isPro": False, "orgs": [], "auth": {"type": "access_token", "accessToken": {
                                         "displayName": "kpgs-lab-read", "role": "read",
                                         "createdAt": "2026-04-20T09:00:00.000Z"}}})

    def _rev(self, rev):
        rev = urllib.parse.unquote(rev)
        if rev in HUB_BRANCHES or rev == self.server.repo.commit:
            return self.server.repo.commit
        msg = "Invalid rev id: %s" % rev
        self.reply_json(404, {"error": msg}, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": msg})
        return None

    def _info(self, blobs):
        repo = self.server.repo
        siblings = []
        for name in sorted(repo.files):
            e = repo.files[name]
            s = {"rfilename": name}
            if blobs:
                s.update({"blobId": e["oid"], "size": e["size"]})
                if "lfs" in e:
                    s["lfs"] = {"sha256": e["sha256"], "size": e["size"], "pointerSize": e["lfs"]["pointerSize"]}
            siblings.append(s)
        return {"_id": "kpgs" + repo.commit[:20], "id": HUB_REPO, "modelId": HUB_REPO, "author": HUB_REPO.split("/", maxsplit=1)[0],
                "sha": repo.commit, "lastModified": "2026-04-20T10:00:00.000Z", "createdAt": "2026-04-20T09:00:00.000Z",
                "private": False, "disabled": False, "gated": "manual" if self.server.token else False, "downloads": 0,
                "likes": 0, "library_name": "transformers", "pipeline_tag": "image-text-to-text",
                "tags": ["transformers", "safetensors", "qwen3_5", "image-text-to-text", "license:apache-2.0"],
                "config": {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5"},
                "siblings": siblings, "usedStorage": repo.total(), "spaces": []}

    def route(self):
        u = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(u.path)
        q = urllib.parse.parse_qs(u.query)
        if path == "/_log":
            clear = q.get("clear", ["false"])[0].lower() in ("1", "true", "yes")
            self.reply_json(200, self.server.access_log.take(clear))
            return False
        if path == "/_ctl":
            self.reply_json(200, self.server.control(q))
            return False
        repo = self.server.repo
        parts = [p for p in path.split("/") if p]
        if self.server.is_cdn and not path.startswith("/_cdn/"):
            return self.reply(403, "AccessDenied\n")
        if path.startswith("/_cdn/sha256/") and len(parts) == 3:
            e = repo.by_sha.get(parts[2])
            if e is None:
                return self.reply(404, "NoSuchKey\n")
            self._rec["file"] = e["path"]
            fault = self.server.next_fault(e["path"]) if self.command == "GET" else None
            return self.send_file(e["local"], {"ETag": '"%s"' % e["sha256"]}, fault)
        if path == "/api/whoami-v2":
            return self._whoami()
        if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
            name = parts[2] + "/" + parts[3]
            if self._need_auth():
                return None
            if name != HUB_REPO:
                return self.reply_json(401 if not self.server.token else 404, {"error": "Repository Not Found"},
                                       {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository Not Found"})
            blobs = q.get("blobs", ["false"])[0].lower() in ("1", "true")
            if len(parts) == 4:
                return self.reply_json(200, self._info(blobs))
            kind = parts[4]
            if kind == "revision" and len(parts) >= 6:
                if self._rev("/".join(parts[5:])) is None:
                    return None
                return self.reply_json(200, self._info(blobs))
            if kind == "tree" and len(parts) >= 6:
                if self._rev(parts[5]) is None:
                    return None
                sub = "/".join(parts[6:])
                out = []
                for fname in sorted(repo.files):
                    if sub and not fname.startswith(sub + "/"):
                        continue
                    e = repo.files[fname]
                    item = {"type": "file", "oid": e["oid"], "size": e["size"], "path": fname}
                    if "lfs" in e:
                        item["lfs"] = dict(e["lfs"])
                    out.append(item)
                return self.reply_json(200, out)
            return self.reply_json(404, {"error": "Sorry, we can't find the page you are looking for."})
        if len(parts) >= 5 and parts[2] == "resolve":
            name, rev, fname = parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:])
            if self._need_auth():
                return None
            if name != HUB_REPO:
                return self.reply_json(401 if not self.server.token else 404, {"error": "Repository Not Found"},
                                       {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository Not Found"})
            commit = self._rev(rev)
            if commit is None:
                return None
            e = repo.files.get(fname)
            if e is None:
                return self.reply_json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound",
                                                                           "X-Error-Message": "Entry not found",
                                                                           "X-Repo-Commit": commit})
            self._rec["file"] = fname
            if "lfs" in e:
                host = urllib.parse.urlsplit("http://" + (self.headers.get("Host") or self.server.server_address[0])).hostname
                loc = "http://%s:%d/_cdn/sha256/%s?X-Amz-Expires=3600&X-Amz-Signature=%s" % (
                    host, self.server.cdn_port, e["sha256"], hashlib.sha256((e["sha256"] + commit).encode()).hexdigest()[:32])
                return self.reply(302, "Found. Redirecting to %s" % loc, headers={
                    "Location": loc, "X-Repo-Commit": commit, "ETag": '"%s"' % e["sha256"],
                    "X-Linked-Etag": '"%s"' % e["sha256"], "X-Linked-Size": str(e["size"]), "Accept-Ranges": "bytes"})
            fault = self.server.next_fault(fname) if self.command == "GET" else None
            return self.send_file(e["local"], {"ETag": '"%s"' % e["oid"], "X-Repo-Commit": commit}, fault)
        return self.reply_json(404, {"error": "Sorry, we can't find the page you are looking for."})


class Faults(object):
    """Fault queues per file (shared by the hub and its CDN port) and the body rate limit."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queues = {}
        self.rate_bps = 0

    def control(self, q):
        one = dict((k, v[0]) for k, v in q.items())
        with self.lock:
            if one.get("reset", "").lower() in ("1", "true"):
                self.queues, self.rate_bps = {}, 0
            if "rate" in one:
                self.rate_bps = int(one["rate"])
            fname = one.get("file", "*")
            queue = self.queues.setdefault(fname, [])
            if "faults" in one:
                for item in one["faults"].split(","):
                    kind, _sep, value = item.partition(":")
                    queue.append({"kind": kind, "value": value})
            if "cut_after" in one:
                for _i in range(int(one.get("cut_count", "1"))):
                    queue.append({"kind": "cut", "value": one["cut_after"], "hang": one.get("hang")})
            elif "hang" in one:
                for _i in range(int(one.get("hang_count", "1"))):
                    queue.append({"kind": "hang", "value": one["hang"]})
            if "status" in one:
                for _i in range(int(one.get("status_count", "1"))):
                    queue.append({"kind": "status", "value": one["status"]})
            if not queue:
                del self.queues[fname]
            return {"faults": self.queues, "rate": self.rate_bps}

    def next(self, fname):
        with self.lock:
            for key in (fname, "*"):
                if self.queues.get(key):
                    return self.queues[key].pop(0)
        return None


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, access_log, faults=None):
        ThreadingHTTPServer.__init__(self, addr, handler)
        self.access_log = access_log
        self.lock = threading.Lock()
        self.hashes = {}
        self.faults = faults or Faults()
        self.is_cdn = False
        self.cdn_port = None

    def rate(self):
        return self.faults.rate_bps

    def control(self, q):
        return self.faults.control(q)

    def next_fault(self, fname):
        return self.faults.next(fname)


class Running(object):
    """A labsvc started by :func:`start` (for tests and labctl): ``urls`` from its READY line, ended by PID."""

    def __init__(self, proc, urls, state_dir):
        self.proc, self.urls, self.state_dir, self.pid = proc, urls, state_dir, proc.pid

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except Exception:  # pylint: disable=broad-except
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start(args, python=None, timeout=60, env=None):
    """Start ``labsvc.py args...`` as a child process, wait for READY, return a :class:`Running`."""
    import subprocess
    import tempfile
    state = args[args.index("--state-dir") + 1]
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([python or sys.executable, os.path.abspath(__file__)] + list(args), stdout=subprocess.PIPE,
                            stderr=err, env=env, universal_newlines=True)
    deadline = time.time() + timeout
    line = ""
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith("READY "):
            err.close()
            return Running(proc, json.loads(line[6:]), state)
        if not line and proc.poll() is not None:
            break
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    err.seek(0)
    msg = err.read().decode("utf-8", "replace")
    err.close()
    raise RuntimeError("labsvc did not become ready (rc %s): %s %s" % (proc.returncode, line, msg[-2000:]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--addr", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--files-port", type=int)
    ap.add_argument("--files-dir")
    ap.add_argument("--index-port", type=int)
    ap.add_argument("--index-dir", action="append", default=[])
    ap.add_argument("--hub-port", type=int)
    ap.add_argument("--hub-cdn-port", type=int, default=0)
    ap.add_argument("--hub-token", "--token", dest="hub_token")
    ap.add_argument("--hub-token-file")
    ap.add_argument("--hub-shards", type=int, default=15)
    ap.add_argument("--hub-shard-size", type=parse_size, default=2 * 1024 * 1024)
    ap.add_argument("--hub-fixtures", default=DEFAULT_FIXTURES)
    args = ap.parse_args(argv)
    if args.files_port is None and args.index_port is None and args.hub_port is None:
        ap.error("give at least one of --files-port, --index-port, --hub-port")
    if args.files_port is not None and not args.files_dir:
        ap.error("--files-port needs --files-dir")
    state = os.path.abspath(args.state_dir)
    os.makedirs(state, exist_ok=True)
    token = args.hub_token or os.environ.get("LABSVC_HUB_TOKEN") or None
    if args.hub_token_file:
        with open(args.hub_token_file) as f:
            token = f.read().strip()
    servers, urls = [], {"pid": os.getpid()}
    if args.files_port is not None:
        s = Server((args.addr, args.files_port), FilesHandler, AccessLog(os.path.join(state, "files-access.jsonl")))
        s.root = os.path.abspath(args.files_dir)
        servers.append(s)
        urls["files"] = "http://%s:%d" % (args.addr, s.server_address[1])
    if args.index_port is not None:
        s = Server((args.addr, args.index_port), IndexHandler, AccessLog(os.path.join(state, "index-access.jsonl")))
        s.index = Index([os.path.abspath(d) for d in args.index_dir])
        servers.append(s)
        urls["index"] = "http://%s:%d/simple/" % (args.addr, s.server_address[1])
    if args.hub_port is not None:
        s = Server((args.addr, args.hub_port), HubHandler, AccessLog(os.path.join(state, "hub-access.jsonl")))
        s.repo = HubRepo(state, args.hub_fixtures, args.hub_shards, args.hub_shard_size)
        s.token = token
        cdn = Server((args.addr, args.hub_cdn_port), HubHandler, s.access_log, s.faults)
        cdn.repo, cdn.token, cdn.is_cdn = s.repo, None, True
        s.cdn_port = cdn.server_address[1]
        servers.extend([s, cdn])
        urls["hub"] = "http://%s:%d" % (args.addr, s.server_address[1])
        urls["hub_cdn"] = "http://%s:%d" % (args.addr, cdn.server_address[1])
        urls["hub_repo"] = HUB_REPO
        urls["hub_commit"] = s.repo.commit

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True) for s in servers]
    for t in threads:
        t.start()
    pidfile = os.path.join(state, "labsvc.pid")
    with open(pidfile, "w") as f:
        f.write("%d\n" % os.getpid())
    with open(os.path.join(state, "labsvc.json"), "w") as f:
        json.dump(urls, f, indent=2)
    sys.stdout.write("READY %s\n" % json.dumps(urls, sort_keys=True))
    sys.stdout.flush()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
        try:
            with open(pidfile) as f:
                if f.read().strip() == str(os.getpid()):
                    os.unlink(pidfile)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
