# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kpro.gpu_serving.pve_api against a real HTTPS server on 127.0.0.1 (an ephemeral port, in a thread) whose
certificate is signed by a CA made in the test's temp dir, so trust, the header, the statuses and the redaction are
proven over real TLS. One test runs the lookup through ansible-playbook, loaded by its FQCN as the preflight calls it.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import socket
import ssl
import threading

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible import constants as C
from ansible.errors import AnsibleError

from ansible_collections.kpro.gpu_serving.plugins.lookup import pve_api as mod
from ansible_collections.kpro.gpu_serving.tests.unit.roles.resolve import PLAYBOOK, resolve

NAME = "kpro.gpu_serving.pve_api"
SECRET = "3f8c2a91-5b7e-4d0c-9a6f-1e2d3c4b5a69"
TOKEN = dict(token_user="root@pam", token_id="ansible", token_secret=SECRET)
HEADER = "PVEAPIToken=root@pam!ansible=" + SECRET
VERSION = {"data": {"release": "8.4", "version": "8.4.1", "repoid": "c17d1e4f4a0f8b6e"}}


def _cert(subject, issuer_name, key, issuer_key, ca):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=30))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False))
    if ca:
        b = b.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
    else:  # what OpenSSL checks of a server: the address in the SAN, serverAuth
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                         x509.DNSName("localhost")]), critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem(path, *objs):
    with open(path, "wb") as f:
        for o in objs:
            f.write(o.public_bytes(serialization.Encoding.PEM) if hasattr(o, "public_bytes") else o.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA (as PVE's pve-root-ca.pem) and the node's certificate for 127.0.0.1 signed by it."""
    d = tmp_path_factory.mktemp("pki")
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Proxmox Virtual Environment (test CA)")])
    ca = _cert(ca_name, ca_name, ca_key, ca_key, ca=True)
    node = _cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name, key, ca_key, ca=False)
    return dict(ca=_pem(d / "pve-root-ca.pem", ca), cert=_pem(d / "pve-ssl.pem", node), key=_pem(d / "pve-ssl.key", key))


class Handler(http.server.BaseHTTPRequestHandler):
    """pveproxy's answers: the version to the right token, 401 to a wrong one, 403 without the privilege; ``echo``
    answers 401 with the header it got in its reason and body, as a careless server might."""

    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        self.server.seen.append(auth)
        path = self.path.split("/api2/json/", 1)[-1]
        if path == "echo":
            return self._send(401, "invalid token '%s'" % auth, {"data": None, "errors": {"token": auth}})
        if auth != HEADER:
            return self._send(401, "authentication failure", None)
        if path == "version":
            return self._send(200, "OK", VERSION)
        if path == "text":
            return self._send(200, "OK", b"<html>not json</html>")
        return self._send(403, "Permission check failed (/, Sys.Audit)", {"data": None})

    def _send(self, code, reason, body):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code, reason)
        self.send_header("Content-Type", "text/html" if isinstance(body, bytes) else "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(pki):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["cert"], pki["key"])
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.seen = []
    thread = threading.Thread(target=httpd.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    # open_url honours the proxy variables, as uri does; 127.0.0.1 must be reached directly
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def lookup(terms, **options):
    """The plugin's run() with its options as Ansible's loader would define them."""
    C.config.initialize_plugin_configuration_definitions("lookup", NAME, yaml.safe_load(mod.DOCUMENTATION)["options"])
    plugin = mod.LookupModule()
    plugin._load_name = NAME  # pylint: disable=protected-access
    return plugin.run(terms, variables={}, **options)


def get(server, path="version", **options):
    (result,) = lookup([path], **dict(dict(TOKEN, host="127.0.0.1", port=server.server_address[1]), **options))
    return result


def test_version_with_the_ca_and_the_exact_header(server, pki):
    r = get(server, ca_path=pki["ca"])
    assert r == dict(status=200, msg="OK", json=VERSION, url="https://127.0.0.1:%d/api2/json/version" % server.server_address[1])
    assert r["json"]["data"]["release"] == "8.4"
    assert server.seen == [HEADER]


def test_leading_slash_and_two_terms_one_result_each(server, pki):
    rs = lookup(["/version", "text"], host="127.0.0.1", port=server.server_address[1], ca_path=pki["ca"], **TOKEN)
    assert [(r["status"], r["msg"], r["url"].rsplit("/", 1)[-1]) for r in rs] == [(200, "OK", "version"), (200, "OK", "text")]
    assert rs[1]["json"] == {}  # a body that is not JSON


def test_wrong_secret_is_401(server, pki):
    r = get(server, ca_path=pki["ca"], token_secret="wrong")
    assert r["status"] == 401 and "401" in r["msg"] and "authentication failure" in r["msg"]


def test_missing_privilege_is_403(server, pki):
    r = get(server, "nodes", ca_path=pki["ca"])
    assert r["status"] == 403 and r["msg"] == "HTTP Error 403: Permission check failed (/, Sys.Audit)"
    assert r["json"] == {"data": None}


def test_untrusted_certificate_is_status_minus_1_naming_the_certificate(server):
    r = get(server)  # the system's trust store does not hold the test CA
    assert r["status"] == -1 and r["msg"].startswith("Request failed: ")
    assert "certificate" in r["msg"].lower() and "CERTIFICATE_VERIFY_FAILED" in r["msg"]
    assert server.seen == []  # nothing was sent: the token never left over an untrusted connection


def test_validate_certs_false_accepts_the_untrusted_certificate(server):
    assert get(server, validate_certs=False)["status"] == 200


def test_ca_path_empty_means_the_system_store(server):
    # what `pve_api_ca_path | default('')` gives when the inventory has none
    assert get(server, ca_path="")["status"] == -1


def test_refused_connection_is_status_minus_1():
    with socket.socket() as held:  # bound, never listening: refused, and no parallel test can take the port
        held.bind(("127.0.0.1", 0))
        (r,) = lookup(["version"], host="127.0.0.1", port=held.getsockname()[1], **TOKEN)
    assert r["status"] == -1 and "refused" in r["msg"].lower() and r["json"] == {}


def test_silent_server_times_out_as_status_minus_1():
    with socket.socket() as mute:  # accepts the connection (the kernel does), never answers the TLS handshake
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)
        (r,) = lookup(["version"], host="127.0.0.1", port=mute.getsockname()[1], timeout=0.5, **TOKEN)
    assert r["status"] == -1 and "timed out" in r["msg"]


def test_the_secret_never_appears_even_when_the_server_echoes_it(server, pki):
    r = get(server, "echo", ca_path=pki["ca"])
    assert server.seen == [HEADER]  # the server did get (and echo) the secret
    assert r["status"] == 401 and "<secret>" in r["msg"] and r["json"]["errors"]["token"].endswith("=<secret>")
    assert SECRET not in json.dumps(r)


@pytest.mark.parametrize("options, words", [
    (dict(host=None), "host"),
    (dict(token_secret=""), "token_secret must not be empty"),
    (dict(ca_file="/etc/pve/pve-root-ca.pem"), "unknown option(s) ca_file"),
    (dict(ca_path="/nonexistent/pve-root-ca.pem"), "is not a file on the controller"),
    (dict(port="eighty"), "port"),
    (dict(validate_certs="ture"), "validate_certs: The value 'ture' is not a valid boolean"),  # not read as false
])
def test_bad_options_raise_with_the_fix(options, words):
    kwargs = {k: v for k, v in dict(dict(TOKEN, host="127.0.0.1"), **options).items() if v is not None}
    with pytest.raises(AnsibleError) as e:
        lookup(["version"], **kwargs)
    assert words in str(e.value) and "Pass it as lookup('kpro.gpu_serving.pve_api', 'version'" in str(e.value)


@pytest.mark.parametrize("term", ["", "/", None])
def test_a_term_that_is_no_path_raises(term):
    with pytest.raises(AnsibleError, match="a term must be an API path"):
        lookup([term], host="127.0.0.1", **TOKEN)


def test_ipv6_host_gets_brackets():
    assert mod.base_url("fd00::5", 8006) == "https://[fd00::5]:8006/api2/json/"


@pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason="needs the checkout's .venv (ansible-playbook)")
def test_through_ansible_by_fqcn_as_the_preflight_calls_it(server, pki, tmp_path):
    call = ("lookup('kpro.gpu_serving.pve_api', 'version', host='127.0.0.1', port=%d, token_user=pve_api_user, "
            "token_id=pve_api_token_id, token_secret=pve_api_token_secret, ca_path=pve_api_ca_path | default(''), "
            "validate_certs=pve_api_validate_certs | default(true))" % server.server_address[1])
    creds = dict(pve_api_user="root@pam", pve_api_token_id="ansible", pve_api_token_secret=SECRET)
    hosts = {"trusted": dict(creds, pve_api_ca_path=pki["ca"]), "untrusted": creds}
    play = {"hosts": "all", "gather_facts": False,
            "tasks": [{"ansible.builtin.debug": {"msg": "PVE {{ (%s) | to_json }}" % call}}]}
    got = resolve(tmp_path, hosts, [play], ["PVE"])
    assert got["trusted"]["PVE"]["status"] == 200 and got["trusted"]["PVE"]["json"]["data"]["release"] == "8.4"
    assert got["untrusted"]["PVE"]["status"] == -1 and "certificate" in got["untrusted"]["PVE"]["msg"].lower()
