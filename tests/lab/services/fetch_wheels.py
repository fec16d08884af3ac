#!/usr/bin/env python3
# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Download, once, the wheels the lab's package index serves that come from PyPI, for the container
(CPython 3.11, manylinux x86_64): uv, and huggingface_hub with its dependencies (the SGLang stand-in
depends on it as the real SGLang does; the collection's hf_model runs on the venv's Python).

Versions and sha256 hashes come from requirements/dev.lock (the project's own pins), so the lab
installs exactly what the project tested; pip checks every hash (--require-hashes). Runs on the
controller, which can reach PyPI; the lab's namespaces cannot.

    tests/lab/services/fetch_wheels.py [CACHE_DIR]   (default ${KPGS_LAB_CACHE:-/var/cache/kpgs-lab}/wheels)

Idempotent: when every wheel is already in the cache with a locked hash nothing is fetched.
"""

import hashlib
import os
import re
import subprocess
import sys
import tempfile

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LOCK = os.path.join(TOP, "requirements", "dev.lock")
ROOTS = ("uv", "huggingface-hub")
# and from the collection's own SGLang lock, the real wheels of what the real SGLang brings and the lab uses as it is:
# ninja (sglang 0.5.11 Requires-Dist; FlashInfer's JIT runs it from the server's PATH)
COLLECTION_LOCK = os.path.join(TOP, "roles", "sglang_install", "files", "locks", "sglang-0.5.11-py3.11-x86_64.txt")
COLLECTION_ROOTS = ("ninja",)
PYVER, ABI = "3.11", "cp311"
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")


def parse_lock(text):
    """{name: (version, [sha256...], [via...])} from a `uv pip compile --generate-hashes` file."""
    out = {}
    for block in re.split(r"\n(?=[a-z0-9])", text):
        head = block.split("\n", 1)[0]
        m = re.match(r"^([a-z0-9][a-z0-9._-]*)==(\S+)", head)
        if not m:
            continue
        via, lines = [], block.splitlines()
        for i, line in enumerate(lines):
            line = line.strip()
            if line.startswith("# via"):
                rest = line[5:].strip()
                via += [rest] if rest else [x.strip()[1:].strip() for x in lines[i + 1:] if x.strip().startswith("#   ")]
        out[m.group(1)] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block), via)
    return out


def closure(lock, roots):
    """The roots and every locked package required (transitively) by them, by the lock's `# via` lines."""
    names = set(roots)
    grew = True
    while grew:
        grew = False
        for name, (_v, _h, via) in lock.items():
            if name not in names and any(v in names for v in via):
                names.add(name)
                grew = True
    return sorted(names)


def norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def cached(cache, name, version, hashes):
    prefix = "%s-%s-" % (norm(name), version)
    for fn in sorted(os.listdir(cache)):
        if norm(fn).startswith(norm(prefix)) and fn.endswith(".whl"):
            with open(os.path.join(cache, fn), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() in hashes:
                    return fn
    return None


def find_pip():
    """A Python with pip: this one, else a python3 on PATH outside this venv (uv venvs have no pip)."""
    here = os.path.dirname(sys.executable)
    cands = [sys.executable] + [os.path.join(d, "python3") for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != here]
    cands.append("/usr/bin/python3")
    for py in cands:
        if os.access(py, os.X_OK) and subprocess.call([py, "-m", "pip", "--version"], stdout=subprocess.DEVNULL,
                                                      stderr=subprocess.DEVNULL) == 0:
            return [py, "-m", "pip"]
    sys.exit("fetch_wheels: no python3 with pip found (set PIP, e.g. PIP='python3 -m pip')")


def main(argv):
    cache = argv[1] if len(argv) > 1 else os.path.join(os.environ.get("KPGS_LAB_CACHE", "/var/cache/kpgs-lab"), "wheels")
    os.makedirs(cache, exist_ok=True)
    with open(LOCK) as f:
        lock = parse_lock(f.read())
    with open(COLLECTION_LOCK) as f:
        lock.update((n, v) for n, v in parse_lock(f.read()).items() if n in COLLECTION_ROOTS)
    missing = [n for n in ROOTS + COLLECTION_ROOTS if n not in lock]
    if missing:
        sys.exit("fetch_wheels: %s not pinned in %s" % (", ".join(missing), LOCK))
    wanted = closure(lock, ROOTS + COLLECTION_ROOTS)
    todo = [n for n in wanted if not cached(cache, n, lock[n][0], lock[n][1])]
    if not todo:
        print("fetch_wheels: cached %d wheels in %s" % (len(wanted), cache))
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        for n in todo:
            req.write("%s==%s %s\n" % (n, lock[n][0], " ".join("--hash=sha256:" + h for h in lock[n][1])))
    try:
        pip = os.environ.get("PIP", "").split() or find_pip()
        argv = pip + ["download", "--disable-pip-version-check", "--no-cache-dir", "--no-deps", "--only-binary=:all:",
                      "--require-hashes", "--python-version", PYVER, "--implementation", "cp", "--abi", ABI, "--abi", "abi3",
                      "--abi", "none", "-d", cache, "-r", req.name]
        for p in PLATFORMS + ("any",):
            argv += ["--platform", p]
        subprocess.check_call(argv)
    finally:
        os.unlink(req.name)
    still = [n for n in todo if not cached(cache, n, lock[n][0], lock[n][1])]
    if still:
        sys.exit("fetch_wheels: no wheel matching the lock's hashes for %s" % ", ".join(still))
    print("fetch_wheels: fetched %d wheels into %s (%d cached before)" % (len(todo), cache, len(wanted) - len(todo)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
