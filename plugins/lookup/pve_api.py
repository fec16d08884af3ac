# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lookup kpro.gpu_serving.pve_api: GET on the Proxmox VE API with an API token, answered as data, never raised.

Why our own lookup and not a library's:

* ``ansible.builtin.uri`` delegated to localhost gives the status but costs a new Python process per call (the module
  and its module_utils imported again, an AnsiballZ payload built): about 0.8 s per preflight. A lookup runs in the
  controller's worker process, already loaded.
* ``ansible.builtin.url`` (lookup) runs there too, but raises on an HTTP error ("Received HTTP error for <url>") without
  giving the status, and on a TLS or connection failure ("Failed lookup url for <url>") likewise. The preflight's assert
  needs the status and the reason to name the fix: 401 the token, 403 a privilege, a TLS failure the CA.

So this lookup returns, for each path, the fields of ``uri``'s result that the preflight reads (status, msg, json,
url), with HTTP, TLS and connection failures as a status (-1 when nothing answered), and raises only on bad options.
HTTP goes through ``ansible.module_utils.urls.open_url``, as ``uri`` and ``url`` do.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: pve_api
author:
  - kpro.gpu_serving contributors (!UNKNOWN)
version_added: "0.2.0"
short_description: Read the Proxmox VE API with an API token, the HTTP status and reason returned, never raised
description:
  - >-
    Sends C(GET https://<host>:<port>/api2/json/<term>) for each term, with the header
    C(Authorization: PVEAPIToken=<token_user>!<token_id>=<token_secret>), from the controller's own process (no
    module run, no delegation).
  - Returns one dictionary per term with the fields of M(ansible.builtin.uri)'s result that a check reads
    (C(status), C(msg), C(json), C(url)), so a task can assert on the status and name the fix. An HTTP error
    status, a TLS failure (an untrusted certificate), a refused connection or a timeout is returned, never raised;
    only a missing or invalid option raises an error.
  - P(ansible.builtin.url#lookup) also runs in the controller's process, but raises on an HTTP error without the
    status; this lookup returns it.
  - The token secret never appears in the result; any occurrence of it (a server that echoes the header in its
    reason, say) is replaced by C(<secret>).
  - Redirects are not followed (a 3xx is returned as its status), so the token is never sent to another address; a
    C(~/.netrc) entry is not read, so it cannot replace the token's header.
options:
  _terms:
    description:
      - API paths relative to C(/api2/json), for example C(version) or C(nodes/pve1/status). A leading C(/) is ignored.
      - A path may end in a query string, for example C(access/permissions?path=/vms/129); its values are sent
        URL-encoded (C(path=%2Fvms%2F129)).
    type: list
    elements: str
    required: true
  api_host:
    description:
      - The Proxmox VE node's address or name (its C(pveproxy)).
      - You can use the E(PROXMOX_HOST) environment variable.
    type: str
    required: true
    aliases: [host]
    env:
      - name: PROXMOX_HOST
  api_port:
    description:
      - The port of C(pveproxy).
      - You can use the E(PROXMOX_PORT) environment variable.
    type: int
    default: 8006
    aliases: [port]
    env:
      - name: PROXMOX_PORT
  api_user:
    description:
      - The user the API token belongs to, for example C(root@pam). Not read when O(api_token_id) is a full ID.
      - You can use the E(PROXMOX_USER) environment variable.
    type: str
    default: root@pam
    aliases: [token_user]
    env:
      - name: PROXMOX_USER
  api_token_id:
    description:
      - The token's name (C(ansible)) or its full ID (C(root@pam!ansible)), as the modules' O(api_token_id).
      - You can use the E(PROXMOX_TOKEN_ID) environment variable.
    type: str
    required: true
    aliases: [token_id]
    env:
      - name: PROXMOX_TOKEN_ID
  api_token_secret:
    description:
      - The token's secret (a UUID). Never returned.
      - You can use the E(PROXMOX_TOKEN_SECRET) environment variable.
    type: str
    required: true
    aliases: [token_secret]
    env:
      - name: PROXMOX_TOKEN_SECRET
  ca_path:
    description:
      - A PEM file with the CA that signed the node's certificate (the node's C(/etc/pve/pve-root-ca.pem)), on the
        controller. Only this CA is then trusted.
      - Unset or empty, the system's trust store is used. Pass an empty string when the inventory sets none, not the
        C(omit) placeholder; a lookup's argument cannot be omitted, Ansible refuses the placeholder as a value.
      - You can use the E(PROXMOX_CA_PATH) environment variable.
    type: str
    env:
      - name: PROXMOX_CA_PATH
  validate_certs:
    description:
      - Whether the server's certificate is verified. Set V(false) only for a test node.
      - A value that is no boolean raises an error (Ansible's own option typing would read it as V(false)).
      - You can use the E(PROXMOX_VALIDATE_CERTS) environment variable.
    type: bool
    default: true
    env:
      - name: PROXMOX_VALIDATE_CERTS
  api_timeout:
    description:
      - Seconds to wait for the connection and for each read before the request counts as failed (status -1).
      - You can use the E(PROXMOX_API_TIMEOUT) environment variable.
    type: float
    default: 10
    aliases: [timeout]
    env:
      - name: PROXMOX_API_TIMEOUT
notes:
  - Runs on the controller, whatever host the task is for.
  - >-
    The options have the names of the modules' API options (doc fragment kpro.gpu_serving.proxmox_api) and fall back
    to the same E(PROXMOX_*) environment variables (of the controller here); the former names (C(host), C(port),
    C(token_user), C(token_id), C(token_secret), C(timeout)) remain as aliases.
  - The result never holds the token secret, so registering or printing it does not show the secret.
seealso:
  - module: ansible.builtin.uri
  - plugin: ansible.builtin.url
    plugin_type: lookup
"""

EXAMPLES = r"""
- name: Read the Proxmox VE version through the API
  ansible.builtin.set_fact:
    pve_version: >-
      {{ lookup('kpro.gpu_serving.pve_api', 'version', api_host=pve_api_host, api_user=pve_api_user,
                api_token_id=pve_api_token_id, api_token_secret=pve_api_token_secret,
                ca_path=pve_api_ca_path | default(''), validate_certs=pve_api_validate_certs | default(true)) }}
  no_log: true

- name: The Proxmox API answers to the token
  ansible.builtin.assert:
    that: pve_version.status == 200
    fail_msg: "HTTP {{ pve_version.status }}: {{ pve_version.msg }}"

- name: The token's own privileges on CT 129 (PVE answers any token about itself)
  ansible.builtin.set_fact:
    ct_privileges: >-
      {{ lookup('kpro.gpu_serving.pve_api', 'access/permissions?path=/vms/129', api_host=pve_api_host,
                api_user=pve_api_user, api_token_id=pve_api_token_id, api_token_secret=pve_api_token_secret) }}
  no_log: true

- name: Two paths in one call (one dictionary each)
  ansible.builtin.debug:
    msg: "{{ query('kpro.gpu_serving.pve_api', 'version', 'nodes', api_host='pve1.example.com',
              api_token_id='root@pam!ansible', api_token_secret=pve_api_token_secret) | map(attribute='status') }}"

- name: The same from the environment (PROXMOX_HOST, PROXMOX_TOKEN_ID, PROXMOX_TOKEN_SECRET set on the controller)
  ansible.builtin.debug:
    msg: "{{ lookup('kpro.gpu_serving.pve_api', 'version').status }}"
"""

RETURN = r"""
_list:
  description: One dictionary per term, in the order of the terms.
  type: list
  elements: dict
  contains:
    status:
      description: The HTTP status; V(-1) when no HTTP answer came (connection refused, TLS failure, timeout).
      type: int
      sample: 200
    msg:
      description:
        - V(OK) on a 2xx status.
        - >-
          On an HTTP error, C(HTTP Error <status>: <reason>) (the reason PVE gives, for example C(authentication failure)).
        - >-
          Without an HTTP answer, C(Request failed: <the error>); an untrusted certificate keeps its words
          (C(CERTIFICATE_VERIFY_FAILED), C(certificate verify failed)).
        - The token secret, where it appeared, is C(<secret>).
      type: str
      sample: OK
    json:
      description:
        - >-
          The body parsed, when it is a JSON object (PVE's C({"data": ...})), on success and on an HTTP error;
          else V({}).
      type: dict
      sample: {"data": {"release": "8.4", "repoid": "c17d1e4f4a0f8b6e", "version": "8.4.1"}}
    url:
      description: The URL requested.
      type: str
      sample: https://pve1.example.com:8006/api2/json/version
"""

import http.client
import json
import os
import urllib.error
from urllib.parse import parse_qsl, urlencode

from ansible.errors import AnsibleLookupError, AnsibleOptionsError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError, open_url
from ansible.plugins.lookup import LookupBase

NAME = "kpro.gpu_serving.pve_api"
REQUIRED = ("api_host", "api_user", "api_token_id", "api_token_secret")
USAGE = ("lookup('%s', 'version', api_host=pve_api_host, api_user=pve_api_user, api_token_id=pve_api_token_id, "
         "api_token_secret=pve_api_token_secret)" % NAME)
# What a failed request raises: urllib's HTTPError/URLError, OSError (refused, reset, timeout, ssl.SSLError, an
# unreadable CA), http.client's protocol errors, and the urls module's own ConnectionError.
REQUEST_ERRORS = (urllib.error.URLError, OSError, http.client.HTTPException, UrlsConnectionError)


def _option_error(what):
    return AnsibleLookupError("%s: %s. Pass it as %s." % (NAME, what.rstrip("."), USAGE))


def api_path(term):
    """The path under /api2/json a term names, its query string (if any) encoded again; an empty or non-text term
    is a caller's mistake."""
    path, sep, query = term.strip().partition("?") if isinstance(term, str) else ("", "", "")
    if not path.strip("/ "):
        raise _option_error("a term must be an API path under /api2/json such as 'version', got %r" % (term,))
    path = path.lstrip("/")
    return path + "?" + urlencode(parse_qsl(query, keep_blank_values=True)) if sep else path


def base_url(host, port):
    # an IPv6 literal needs brackets before the port
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    return "https://%s:%d/api2/json/" % (host, port)


def redact(value, secret):
    """``value`` with every occurrence of ``secret`` in its strings (keys too) replaced by ``<secret>``."""
    if isinstance(value, str):
        return value.replace(secret, "<secret>")
    if isinstance(value, dict):
        return {redact(k, secret): redact(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secret) for v in value]
    return value


def parse_json(body):
    """The body as a dict when it is a JSON object, else {} (an HTML error page, an empty 401)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return {}
    return data if isinstance(data, dict) else {}


def _error_body(err):
    # HTTPError's body can be absent (fp None) or cut off; the status and reason are what matter
    try:
        return err.read() if err.fp is not None else b""
    except (OSError, http.client.HTTPException, AttributeError):
        return b""


def get(url, headers, ca_path, validate_certs, timeout):
    """(status, msg, body) of one GET; every HTTP, TLS and connection failure is a result, never an exception."""
    try:
        resp = open_url(url, headers=headers, method="GET", validate_certs=validate_certs, ca_path=ca_path or None,
                        timeout=timeout, follow_redirects="none", use_netrc=False)
        with resp:
            return resp.status, "OK", resp.read()
    except urllib.error.HTTPError as e:  # before URLError: it is one
        return e.code, str(e), _error_body(e)
    except REQUEST_ERRORS as e:
        return -1, "Request failed: %s" % (str(e) or type(e).__name__), b""


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        opts = self._read_options(variables, kwargs)
        root = base_url(opts["api_host"], opts["api_port"])
        secret = opts["api_token_secret"]
        # a full token ID (root@pam!ansible) names its user, as the modules' api_token_id does
        user, _sep, token = opts["api_token_id"].rpartition("!")
        headers = {"Authorization": "PVEAPIToken=%s!%s=%s" % (user or opts["api_user"], token, secret)}
        out = []
        for url in [root + api_path(t) for t in terms]:  # every term checked before the first request
            status, msg, body = get(url, headers, opts["ca_path"], opts["validate_certs"], opts["api_timeout"])
            out.append(redact(dict(status=status, msg=msg, json=parse_json(body), url=url), secret))
        return out

    def _read_options(self, variables, kwargs):
        """The options as plain values; a missing, empty, unknown or invalid one raises with the fix."""
        known = set(self.option_definitions) - {"_terms"}
        unknown = sorted(set(kwargs) - known - {a for k in known for a in self.option_definitions[k].get("aliases", [])})
        if unknown:
            raise _option_error("unknown option(s) %s (known: %s)" % (", ".join(unknown), ", ".join(sorted(known))))
        try:
            # strict: Ansible's option typing reads any unknown word as false, and a typo must not turn verification off
            boolean(kwargs.get("validate_certs", os.environ.get("PROXMOX_VALIDATE_CERTS", True)), strict=True)
        except TypeError as e:
            raise _option_error("validate_certs: %s" % e) from None
        try:
            self.set_options(var_options=variables, direct=kwargs)
        except AnsibleOptionsError as e:
            raise _option_error(str(e)) from None  # str(e) already holds the cause's words
        opts = {k: self.get_option(k) for k in REQUIRED + ("api_port", "ca_path", "validate_certs", "api_timeout")}
        empty = [k for k in REQUIRED if not str(opts[k] or "").strip()]
        if empty:
            raise _option_error("%s must not be empty" % ", ".join(empty))
        opts.update({k: str(opts[k]) for k in REQUIRED})  # plain str: they go into a header
        opts["ca_path"] = os.path.expanduser(str(opts["ca_path"])) if opts["ca_path"] else None
        if opts["ca_path"] and not os.path.isfile(opts["ca_path"]):
            raise _option_error("ca_path %s is not a file on the controller; copy the node's /etc/pve/pve-root-ca.pem "
                                "there, or leave ca_path empty to use the system's trust store" % opts["ca_path"])
        return opts
