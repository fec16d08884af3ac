# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secure Boot signing of the NVIDIA module: DKMS's key settings, the operator's certificate, and the signature a
built module carries. Pure functions; the callers run the commands.

Sources (the real tools):

- DKMS 3.0.10 (Debian bookworm) reads ``mok_signing_key`` and ``mok_certificate`` from /etc/dkms/framework.conf and then
  /etc/dkms/framework.conf.d/*.conf, the later file winning (dkms.in:47, 652-655 read_framework_conf, sourced as shell
  by safe_source 406-418); unset, it signs with its own /var/lib/dkms/mok.key and mok.pub, generating them when absent
  (dkms.in:953-968), a key nobody enrolled. dkms_framework.conf:32-38 documents both settings.
- kmod 30 (bookworm) ``modinfo`` shows a PKCS#7 module signature as ``signer`` = the issuer's commonName and
  ``sig_key`` = the certificate's serial number, as upper-case hex bytes joined by ":" and wrapped every 20 bytes with
  "\\n\\t\\t" (libkmod/libkmod-signature.c:236-275 fill_pkcs7, libkmod/libkmod-module.c:2264-2289). An unsigned module
  has neither field.
- mokutil 0.6.0 ``--test-key <DER cert>``: "<file> is not enrolled" (rc 0), "<file> is already enrolled" (rc 1), "... is
  already in the enrollment request" (rc 1, enrolled only after the next boot's MokManager) (src/mokutil.c:780-800,
  1495-1545); ``--sb-state``: "SecureBoot enabled" / "SecureBoot disabled" (src/mokutil.c:1424-1428).
"""

from __future__ import annotations

import base64
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure

FRAMEWORK_CONF = "/etc/dkms/framework.conf"
FRAMEWORK_DROPINS = "/etc/dkms/framework.conf.d"
DKMS_OWN_KEY = "/var/lib/dkms/mok.key"
DKMS_OWN_CERT = "/var/lib/dkms/mok.pub"
SETTINGS = ("mok_signing_key", "mok_certificate")
_ASSIGN_RE = re.compile(r"^\s*(mok_signing_key|mok_certificate)=(.*)$")
_COMMENTED_RE = re.compile(r"^\s*#\s*(mok_signing_key|mok_certificate)=")
MANAGED = "# kpro.gpu_serving: sign DKMS builds with the enrolled key (gpu_host_module_signing_key/_cert)"


# --------------------------------------------------------------------------- the certificate (DER, minimal reader)
def _tlv(data, pos):
    """(tag, content start, content end) of the DER element at ``pos``."""
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        length = int.from_bytes(data[pos:pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _children(data, start, end):
    out = []
    while start < end:
        tag, cs, ce = _tlv(data, start)
        out.append((tag, cs, ce))
        start = ce
    return out


def cert_der(raw):
    """The DER bytes of a certificate given as DER or PEM (sign-file and mokutil accept DER; the installer PEM)."""
    text = raw.decode("ascii", "ignore") if isinstance(raw, bytes) else raw
    m = re.search(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", text, re.S)
    if m:
        return base64.b64decode("".join(m.group(1).split()))
    return raw if isinstance(raw, bytes) else raw.encode("latin-1")


def cert_identity(raw):
    """{serial: hex, issuer_cn: str|None} of an X.509 certificate: what modinfo shows as sig_key and signer."""
    data = cert_der(raw)
    try:
        _tag, cs, ce = _tlv(data, 0)
        tbs = _children(data, cs, ce)[0]
        fields = _children(data, tbs[1], tbs[2])
        if fields[0][0] == 0xA0:  # [0] version
            fields = fields[1:]
        serial = data[fields[0][1]:fields[0][2]].lstrip(b"\x00")
        issuer_cn = None
        for _set, ss, se in _children(data, fields[2][1], fields[2][2]):
            for _seq, qs, qe in _children(data, ss, se):
                oid, value = _children(data, qs, qe)[:2]
                if data[oid[1]:oid[2]] == b"\x55\x04\x03":  # 2.5.4.3 commonName
                    issuer_cn = data[value[1]:value[2]].decode("utf-8", "replace")
    except (IndexError, ValueError) as e:
        raise ValueError("not an X.509 certificate (%s)" % e)
    return {"serial": normalize_hex(serial.hex()), "issuer_cn": issuer_cn}


def normalize_hex(text):
    """A serial or sig_key as upper-case hex without separators, whitespace or leading zeros."""
    return re.sub(r"[^0-9A-Fa-f]", "", text or "").upper().lstrip("0")


# --------------------------------------------------------------------------- DKMS's framework.conf
def framework_settings(texts):
    """The effective mok_signing_key/mok_certificate over [(path, text)] in DKMS's order (framework.conf, then the
    drop-ins sorted): {setting: (value, path)}; DKMS's own key where nothing sets one."""
    found = {"mok_signing_key": (DKMS_OWN_KEY, None), "mok_certificate": (DKMS_OWN_CERT, None)}
    for path, text in texts:
        for line in (text or "").splitlines():
            m = _ASSIGN_RE.match(line)
            if m:
                found[m.group(1)] = (m.group(2).strip().strip("\"'"), path)
    return found


def edit_framework_conf(text, key, cert):
    """framework.conf with both settings pointing at ``key``/``cert``: active assignments rewritten in place, else
    added after DKMS's commented default (or at the end). Returns the new text (equal to ``text`` when nothing to do)."""
    want = {"mok_signing_key": key, "mok_certificate": cert}
    lines = (text or "").splitlines()
    done = set()
    for i, line in enumerate(lines):
        m = _ASSIGN_RE.match(line)
        if m:
            lines[i] = "%s=%s" % (m.group(1), want[m.group(1)])
            done.add(m.group(1))
    missing = [s for s in SETTINGS if s not in done]
    if missing:
        at = max([i + 1 for i, line in enumerate(lines) if _COMMENTED_RE.match(line)] or [len(lines)])
        lines[at:at] = [MANAGED] + ["%s=%s" % (s, want[s]) for s in missing]
    new = "\n".join(lines) + "\n"
    return new if new.rstrip("\n") != (text or "").rstrip("\n") else text


# --------------------------------------------------------------------------- the module's own signature
def parse_modinfo_fields(text):
    """``modinfo -k <kernel> nvidia`` -> {field: value}; continuation lines (sig_key/signature wrap) are joined."""
    fields, last = {}, None
    for line in (text or "").splitlines():
        m = re.match(r"^([a-z_]+):\s*(.*)$", line)
        if m:
            last = m.group(1)
            fields.setdefault(last, m.group(2).strip())
        elif last and line.startswith(("\t", " ")):
            fields[last] += line.strip()
    return fields


def check_signature(kernel, fields, cert, cert_path, dkms_key):
    """Raise ``module_unsigned`` or ``module_wrong_key`` unless the module (modinfo ``fields``) is signed by ``cert``
    ({serial, issuer_cn}); ``dkms_key``: the key DKMS signs with now (named in the failure)."""
    fix = ("set mok_signing_key/mok_certificate in %s to the enrolled key (gpu_host_module_signing_key/_cert) and "
           "rebuild: dkms install --force -m nvidia -v <version> -k %s (the gpu_host stage does both)" % (FRAMEWORK_CONF, kernel))
    if not fields.get("signer") and not fields.get("sig_key"):
        raise Failure("module_unsigned", "Secure Boot is on and the nvidia module for kernel %s (%s) is not signed: the kernel "
                      "will refuse it at the next boot." % (kernel, fields.get("filename", "?")), remedy=fix, kernel=kernel)
    got, want = normalize_hex(fields.get("sig_key")), cert["serial"]
    if got != want or (cert.get("issuer_cn") and fields.get("signer") != cert["issuer_cn"]):
        raise Failure("module_wrong_key", "the nvidia module for kernel %s is signed by %r (key %s), not by the enrolled "
                      "certificate %s (%r, serial %s); DKMS signs with %s." % (
                          kernel, fields.get("signer"), fields.get("sig_key"), cert_path, cert.get("issuer_cn"), want, dkms_key),
                      remedy=fix, kernel=kernel, signer=fields.get("signer"), sig_key=fields.get("sig_key"), dkms_key=dkms_key)


def mok_enrolled(rc, out):
    """mokutil --test-key's answer: True (enrolled, or in the db), False (not, or only requested), None (unknown)."""
    text = out or ""
    if "is already enrolled" in text or "is already in db" in text:
        return True
    if "is not enrolled" in text or "enrollment request" in text:
        return False
    return None


def secure_boot_from_mokutil(out):
    """mokutil --sb-state: True, False or None."""
    if "SecureBoot enabled" in (out or ""):
        return True
    if "SecureBoot disabled" in (out or ""):
        return False
    return None
