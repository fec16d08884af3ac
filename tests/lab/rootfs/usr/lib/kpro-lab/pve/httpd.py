"""pveproxy stand-in: HTTPS on :8006, ``/api2/json/...``, PVE's auth and response conventions.

- success: 200, ``{"data": ...}`` (+ ``"total"`` where PVE sets it);
- errors: HTTP status = the exception's code (500 for a plain die), reason phrase = the first
  line of the message, body ``{"data": null, "message": "<msg>\\n", "errors": {...}}``;
- auth: ``PVEAuthCookie`` cookie (or in ``Authorization``), else ``Authorization:
  PVEAPIToken=<user>@<realm>!<name>=<secret>``; writes with a ticket need the
  ``CSRFPreventionToken`` header; failures are 401 with the reason and no body, delayed 3 s
  like pveproxy (``KPRO_LAB_PVE_AUTH_DELAY``).
- TLS: /etc/pve/local/pveproxy-ssl.{pem,key} when present, else pve-ssl.{pem,key}.
"""

import json
import os
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import pve
from pve import PVEError, api, auth

BASE = "/api2/json"


def _flatten(qs):
    return {k: (v[0] if len(v) == 1 else v) for k, v in qs.items()}


def auth_delay():
    return float(os.environ.get("KPRO_LAB_PVE_AUTH_DELAY", "3"))


def _cookie(header, name):
    for part in (header or "").split(";"):
        k, _s, v = part.strip().partition("=")
        if k == name and v:
            return unquote(v.strip('"'))
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-daemon/3.0"

    def log_message(self, fmt, *args):
        if os.environ.get("KPRO_LAB_PVE_ACCESS_LOG"):
            sys.stderr.write("%s - %s\n" % (self.address_string(), fmt % args))

    def _send(self, code, reason, body=None, ctype="application/json;charset=UTF-8", delay=0):
        if delay:
            time.sleep(delay)
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        reason = (reason or "").split("\n", 1)[0]
        self.send_response(code, reason)
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        if data:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _params(self):
        url = urlsplit(self.path)
        params = _flatten(parse_qs(url.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if body:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype == "application/json":
                try:
                    obj = json.loads(body.decode())
                except ValueError:
                    raise PVEError("unable to parse JSON body", 400)
                if isinstance(obj, dict):
                    params.update({k: (v if isinstance(v, list) else ("1" if v is True else "0" if v is False else str(v)))
                                   for k, v in obj.items() if v is not None})
            else:
                params.update(_flatten(parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)))
        return url.path, params

    def _authenticate(self, method, rel):
        cookie = _cookie(self.headers.get("Cookie"), "PVEAuthCookie")
        authz = self.headers.get("Authorization") or ""
        ticket = cookie or _cookie(authz, "PVEAuthCookie")
        if ticket:
            user = auth.verify_ticket(ticket)
            if method != "GET":
                auth.verify_csrf_token(user, self.headers.get("CSRFPreventionToken"))
            return user
        if authz.startswith("PVEAPIToken="):
            return auth.verify_api_token(authz[len("PVEAPIToken="):])
        raise auth.AuthError("No ticket")

    def _handle(self, method):
        try:
            path, params = self._params()
        except PVEError as e:
            return self._send(e.code, e.msg, {"data": None, "message": e.msg})
        if not path.startswith(BASE + "/") and path != BASE:
            if path.startswith("/api2/"):
                return self._send(501, "no such uri")
            return self._send(501, "no such uri")
        rel = path[len(BASE):] or "/"
        found = api.find(method, rel)
        user = None
        if not (found and found[2]):
            try:
                user = self._authenticate(method, rel)
            except auth.AuthError as e:
                reason = str(e)
                if reason not in ("No ticket", "Permission denied - invalid csrf token"):
                    reason = "Authentication failed!" if "csrf" not in reason else reason
                return self._send(401, reason, delay=auth_delay())
        if not found:
            msg = "Method '%s %s' not implemented" % (method, rel)
            return self._send(501, msg, {"data": None, "message": msg + "\n"})
        try:
            data, attrs = api.call(method, rel, params, user=user)
        except PVEError as e:
            body = {"data": None, "message": e.msg}
            if e.errors:
                body["errors"] = e.errors
            return self._send(e.code, e.msg, body, delay=auth_delay() if e.code == 401 else 0)
        except Exception as e:  # a bug in the fake: 500 with the exception text
            import traceback
            traceback.print_exc()
            msg = "%s: %s\n" % (type(e).__name__, e)
            return self._send(500, msg, {"data": None, "message": msg})
        body = {"data": data}
        if attrs.get("total") is not None:
            body["total"] = attrs["total"]
        return self._send(200, "OK", body)

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def ssl_context():
    local = pve.pve_dir("local")
    for stem in ("pveproxy-ssl", "pve-ssl"):
        pem, key = os.path.join(local, stem + ".pem"), os.path.join(local, stem + ".key")
        if os.path.exists(pem) and os.path.exists(key):
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(pem, key)
            return ctx
    raise SystemExit("pveproxy: no certificate in %s (pve-ssl.pem/pve-ssl.key): run tests/lab/build.d/20-pve-pki.sh" % local)


def make_server(host="0.0.0.0", port=8006, tls=True):
    srv = Server((host, port), Handler)
    if tls:
        ctx = ssl_context()

        # handshake in the request thread, not in accept(): one slow client cannot block the others
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
    return srv


def serve_in_thread(host="127.0.0.1", port=0, tls=True):
    """For tests: (server, thread); ``server.server_address[1]`` is the port."""
    srv = make_server(host, port, tls)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return srv, t


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="pveproxy", description="the lab's PVE API server")
    ap.add_argument("--host", default=os.environ.get("KPRO_LAB_PVE_BIND", "0.0.0.0"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("KPRO_LAB_PVE_PORT", "8006")))
    ap.add_argument("--no-tls", action="store_true")
    args = ap.parse_args(argv)
    srv = make_server(args.host, args.port, not args.no_tls)
    sys.stderr.write("pveproxy (kpro lab): listening on %s:%d, node %s\n" % (args.host, srv.server_address[1],
                                                                             pve.nodename()))
    sys.stderr.flush()
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
