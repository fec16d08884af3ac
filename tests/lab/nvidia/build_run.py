"""Build the lab's NVIDIA-Linux-x86_64-<version>.run (a stand-in for NVIDIA's makeself file).

    python3 build_run.py --lib libnvidia-ml.so.1 --out NVIDIA-Linux-x86_64-580.126.09.run [--version 580.126.09]

The result is a ``sh`` script with a base64 tar.gz payload (nvidia-installer, nvlab.py,
libnvidia-ml.so.1, nvidia-smi, nvidia-persistenced, nvidia-modprobe, VERSION, the
persistenced init samples). It is byte-reproducible (fixed mtimes, sorted members), so
its sha256 is stable for the collection's ``installer_checksum``. Another driver version
for mismatch drills: ``--version 580.159`` (same library; it takes its version from the
file name the installer gives it). Standard library only.
"""

import argparse
import base64
import gzip
import hashlib
import io
import os
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
PAYLOAD = os.path.join(HERE, "payload")
NVLAB = os.path.join(HERE, "..", "rootfs", "usr", "lib", "kpro-lab", "nvlab.py")
MARKER = "__KPRO_LAB_PAYLOAD_BELOW__"

BOOTSTRAP = r'''
import base64, io, os, shutil, subprocess, sys, tarfile, tempfile
me, args = sys.argv[1], sys.argv[2:]
data = open(me, "rb").read()
mark = b"\n" + b"@MARKER@" + b"\n"
blob = base64.b64decode(data[data.rindex(mark) + len(mark):])
ver, label = "@VERSION@", "NVIDIA Accelerated Graphics Driver for Linux-x86_64 @VERSION@"
quiet = any(a in ("-s", "--silent", "-q", "--quiet") for a in args)
def extract(dest):
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as t:
        t.extractall(dest, **({"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}))
if args[:1] == ["--info"]:
    print("Identification: %s\nTarget directory: NVIDIA-Linux-x86_64-%s\nUncompressed size: %d bytes\n"
          "Compression: gzip" % (label, ver, len(blob)))
    sys.exit(0)
if args[:1] == ["--list"]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as t:
        for m in t.getmembers():
            print(m.name)
    sys.exit(0)
if args[:1] == ["--check"]:
    print("Verifying archive integrity...  100%   MD5 checksums are OK. All good.")
    sys.exit(0)
if args[:1] in (["-x"], ["--extract-only"]):
    dest = os.path.join(os.getcwd(), "NVIDIA-Linux-x86_64-" + ver)
    print("Creating directory %s\nVerifying archive integrity... OK\nUncompressing %s" % (dest, label))
    extract(dest)
    sys.exit(0)
if not quiet:
    print("Verifying archive integrity... OK\nUncompressing %s" % label)
tmp = tempfile.mkdtemp(prefix="makeself.", dir=os.environ.get("TMPDIR") or None)
try:
    extract(tmp)
    rc = subprocess.call([sys.executable, os.path.join(tmp, "nvidia-installer")] + args)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(rc)
'''

HEADER = """#!/bin/sh
# NVIDIA-Linux-x86_64-@VERSION@.run -- kpro lab stand-in for NVIDIA's makeself installer.
# Built by tests/lab/nvidia/build_run.py; run it like the real one: sh NVIDIA-Linux-x86_64-@VERSION@.run [options]
# Makeself options: --info, --list, --check, -x/--extract-only. Everything else goes to nvidia-installer.
PYTHON=${KPRO_LAB_PYTHON:-python3}
exec "$PYTHON" -c '@BOOTSTRAP@' "$0" "$@"
exit 1
@MARKER@
"""

PERSISTENCED_TEMPLATE = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user __USER__
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

PERSISTENCED_INSTALL = """#!/bin/sh
# kpro lab: nvidia-persistenced-init/install.sh (subset: systemd, user root by default)
set -e
user=${1:-root}
sed "s/__USER__/$user/" "$(dirname "$0")/systemd/nvidia-persistenced.service.template" \\
    > /lib/systemd/system/nvidia-persistenced.service
systemctl daemon-reload
systemctl enable nvidia-persistenced.service
systemctl start nvidia-persistenced.service
"""


def _add(tar, name, data, mode):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _targz(members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, mode in sorted(members):
            _add(tar, name, data, mode)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _tarbz2(members):
    import bz2
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, mode in sorted(members):
            _add(tar, name, data, mode)
    return bz2.compress(raw.getvalue())


def build(lib, out, version):
    def read(p):
        with open(p, "rb") as f:
            return f.read()
    members = [(name, read(os.path.join(PAYLOAD, name)), 0o755)
               for name in ("nvidia-installer", "nvidia-smi", "nvidia-persistenced", "nvidia-modprobe")]
    members += [("nvlab.py", read(NVLAB), 0o644), ("libnvidia-ml.so.1", read(lib), 0o755),
                ("VERSION", (version + "\n").encode(), 0o644)]
    members.append(("nvidia-persistenced-init.tar.bz2", _tarbz2([
        ("nvidia-persistenced-init/install.sh", PERSISTENCED_INSTALL.encode(), 0o755),
        ("nvidia-persistenced-init/systemd/nvidia-persistenced.service.template", PERSISTENCED_TEMPLATE.encode(), 0o644),
    ]), 0o644))
    payload = base64.encodebytes(_targz(members)).decode()
    boot = BOOTSTRAP.replace("@MARKER@", MARKER).replace("@VERSION@", version)
    assert "'" not in boot
    text = HEADER.replace("@BOOTSTRAP@", boot).replace("@MARKER@", MARKER).replace("@VERSION@", version) + payload
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.rename(tmp, out)
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="the compiled fake libnvidia-ml.so.1")
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", default="580.126.09")
    a = ap.parse_args(argv)
    digest = build(a.lib, a.out, a.version)
    with open(a.out + ".sha256", "w") as f:
        f.write("%s  %s\n" % (digest, os.path.basename(a.out)))
    print("%s  %s" % (digest, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
