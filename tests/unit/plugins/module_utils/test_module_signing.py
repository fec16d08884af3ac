# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_signing: DKMS's key settings, the certificate's identity, the module's own signature (modinfo)."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import module_signing as ms
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure


def make_cert(cn, serial):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kpro"), x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime(2026, 1, 1)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(serial).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=3650))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER), cert.public_bytes(serialization.Encoding.PEM)


def modinfo_sig_key(serial):
    """kmod's rendering (libkmod-module.c kmod_module_hex_to_str): upper hex bytes, ':', a break every 20 bytes."""
    raw = serial.to_bytes((serial.bit_length() + 7) // 8, "big")
    parts = ["%02X" % b for b in raw]
    return ":".join(parts[:20]) + ("\n\t\t" + ":".join(parts[20:]) if len(parts) > 20 else "")


SERIAL = 0x5A3C9E0112F00DBEEF42A1B2C3D4E5F60718293A


@pytest.mark.parametrize("form", [0, 1])
def test_cert_identity_der_and_pem(form):
    raw = make_cert("kpro Secure Boot module signing", SERIAL)[form]
    ident = ms.cert_identity(raw)
    assert ident == {"serial": "%X" % SERIAL, "issuer_cn": "kpro Secure Boot module signing"}
    with pytest.raises(ValueError):
        ms.cert_identity(b"not a certificate")


def test_modinfo_fields_join_the_wrapped_sig_key():
    text = ("filename:       /lib/modules/6.8.12-10-pve/updates/dkms/nvidia.ko\nversion:        580.126.09\n"
            "vermagic:       6.8.12-10-pve SMP preempt mod_unload modversions \nsig_id:         PKCS#7\n"
            "signer:         kpro Secure Boot module signing\nsig_key:        %s\nsig_hashalgo:   sha256\n"
            "signature:      30:45:02\n\t\t21:00\n" % modinfo_sig_key(SERIAL << 8 | 0x11))
    fields = ms.parse_modinfo_fields(text)
    assert fields["version"] == "580.126.09" and fields["signer"] == "kpro Secure Boot module signing"
    assert ms.normalize_hex(fields["sig_key"]) == "%X" % (SERIAL << 8 | 0x11)
    assert fields["signature"] == "30:45:0221:00"


def test_phases_module_unsigned_and_module_wrong_key():
    cert = ms.cert_identity(make_cert("kpro Secure Boot module signing", SERIAL)[0])
    good = {"filename": "/x/nvidia.ko", "signer": "kpro Secure Boot module signing", "sig_key": modinfo_sig_key(SERIAL)}
    assert ms.check_signature("6.8.12-10-pve", good, cert, "/root/mok.der", ms.DKMS_OWN_KEY) is None
    with pytest.raises(Failure) as e:
        ms.check_signature("6.8.12-10-pve", {"filename": "/x/nvidia.ko"}, cert, "/root/mok.der", ms.DKMS_OWN_KEY)
    assert e.value.phase == "module_unsigned" and "6.8.12-10-pve" in e.value.msg and "framework.conf" in e.value.remedy
    dkms_own = {"filename": "/x/nvidia.ko", "signer": "DKMS module signing key", "sig_key": "3F:01:AA"}
    with pytest.raises(Failure) as e:
        ms.check_signature("6.8.12-10-pve", dkms_own, cert, "/root/mok.der", ms.DKMS_OWN_KEY)
    assert e.value.phase == "module_wrong_key"
    assert "DKMS module signing key" in e.value.msg and "/var/lib/dkms/mok.key" in e.value.msg
    assert "dkms install" in e.value.remedy


FRAMEWORK_3_0_10 = """## This configuration file modifies the behavior of
## DKMS (Dynamic Kernel Module Support)...

# Location of the key and certificate files used for Secure boot. $kernelver
# can be used in path to represent the target kernel version.
# (default: /var/lib/dkms):
# mok_signing_key=/var/lib/dkms/mok.key
# mok_certificate=/var/lib/dkms/mok.pub

# Automatically modprobe the built modules upon succesful installation:
# modprobe_on_install="true"
"""


def test_framework_conf_edit_is_idempotent_and_keeps_the_file():
    assert ms.framework_settings([("/etc/dkms/framework.conf", FRAMEWORK_3_0_10)])["mok_signing_key"] == (ms.DKMS_OWN_KEY, None)
    new = ms.edit_framework_conf(FRAMEWORK_3_0_10, "/root/mok/MOK.priv", "/root/mok/MOK.der")
    assert new.startswith(FRAMEWORK_3_0_10.split("# Automatically", maxsplit=1)[0].rstrip("\n"))
    assert "mok_signing_key=/root/mok/MOK.priv\nmok_certificate=/root/mok/MOK.der\n\n# Automatically" in new
    assert ms.edit_framework_conf(new, "/root/mok/MOK.priv", "/root/mok/MOK.der") == new
    eff = ms.framework_settings([("/etc/dkms/framework.conf", new)])
    assert eff["mok_certificate"] == ("/root/mok/MOK.der", "/etc/dkms/framework.conf")
    # an active setting is rewritten in place; a drop-in read later wins
    moved = ms.edit_framework_conf('mok_signing_key="/old.key"\nmok_certificate=/old.der\n', "/k", "/c")
    assert moved == "mok_signing_key=/k\nmok_certificate=/c\n"
    eff = ms.framework_settings([("/etc/dkms/framework.conf", moved), ("/etc/dkms/framework.conf.d/x.conf", "mok_signing_key='/y'")])
    assert eff["mok_signing_key"] == ("/y", "/etc/dkms/framework.conf.d/x.conf")


def test_mokutil_answers():
    assert ms.mok_enrolled(1, "/root/mok/MOK.der is already enrolled\n") is True
    assert ms.mok_enrolled(0, "/root/mok/MOK.der is not enrolled\n") is False
    assert ms.mok_enrolled(1, "/root/mok/MOK.der is already in the enrollment request\n") is False
    assert ms.mok_enrolled(255, "EFI variables are not supported on this system\n") is None
    assert ms.secure_boot_from_mokutil("SecureBoot enabled\n") is True
    assert ms.secure_boot_from_mokutil("SecureBoot disabled\n") is False
