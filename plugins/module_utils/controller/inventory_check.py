# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inventory, checked offline: is every input a run reads present and well-formed?

``playbooks/check-inventory.yml`` (``make check-inventory``) and the preflight use it on the controller, through the
lookup kpro.gpu_serving.inventory_inputs (each variable resolved on its own; what cannot be resolved comes back as
data) and the filters kpro.gpu_serving.inventory_problems and inventory_address_problems. One function per concern;
each returns problems, never raises. A problem is a dict: ``host``, ``var``, ``level`` (error or warning), ``what``
(what is wrong), ``fix`` and ``line`` ("<host>: <var>: <what> - <fix>"). Secret values are never put in a problem.
"""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import nvidia_installer as ni
from ansible_collections.kpro.gpu_serving.plugins.module_utils.container.sglang_releases import lock_versions

# What each concern reads; a group of the run is checked for its concerns (the run reads these on its hosts).
CONCERNS = {
    "api": ("pve_api_host", "pve_api_user", "pve_api_token_id", "pve_api_token_secret", "pve_api_validate_certs",
            "pve_api_ca_path"),
    "host_installer": ("gpu_host_driver_version", "gpu_host_driver_url", "gpu_host_driver_checksum",
                       "gpu_host_driver_path", "gpu_host_driver_src"),
    "container": ("pve_node_host", "pve_vmid", "pct_host"),
    "container_installer": ("gpu_container_driver_version", "gpu_container_driver_url",
                            "gpu_container_driver_checksum", "gpu_container_driver_path", "gpu_container_driver_src"),
    "lock": ("sglang_install_version", "sglang_install_python", "sglang_install_lock_file"),
    "model": ("model_repo_id", "model_revision", "hf_token", "model_hf_token"),
    "server": ("sglang_server_api_key", "sglang_server_options", "sglang_install_tp"),
}
GROUP_CONCERNS = {
    "proxmox_hosts": ("api", "host_installer"),
    "gpu_containers": ("container", "container_installer", "lock", "model", "server"),
}
# Read with every concern: where the vault is (the fixes name it).
ALWAYS = ("inventory_dir",)

SECRETS = ("pve_api_token_secret", "sglang_server_api_key", "hf_token", "model_hf_token")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
PLACEHOLDERS = ("change-me", "changeme", "change_me", "replace-me", "todo", "secret", "password")
DERIVE_PCT_HOST = "pct_host: \"{{ hostvars[pve_node_host].ansible_host }}\""
DERIVE_API_HOST = "pve_api_host: \"{{ hostvars[pve_node_host | default(inventory_hostname)].ansible_host }}\""


def concerns(terms):
    """The concerns of group names and concern names (unknown names ignored), in a stable order."""
    out = []
    for t in terms or ():
        for c in GROUP_CONCERNS.get(t, (t,) if t in CONCERNS else ()):
            if c not in out:
                out.append(c)
    return out


def reads(terms):
    """Every variable the concerns of ``terms`` read (what the lookup resolves)."""
    names = list(ALWAYS)
    for c in concerns(terms):
        names.extend(n for n in CONCERNS[c] if n not in names)
    return names


def problem(host, var, what, fix, level="error"):
    return {"host": host, "var": var, "level": level, "what": what, "fix": fix,
            "line": "%s: %s: %s - %s" % (host, var, what, fix)}


def placeholder(value):
    """An example's value standing in for a secret: an all-zero UUID, change-me and the like, hf_xxxx..."""
    text = str(value or "").strip()
    low = text.lower()
    return bool(text) and (low in PLACEHOLDERS or re.match(r"^[0\-]+$", text) is not None
                           or re.match(r"^(hf_)?x{4,}$", low) is not None or (low.startswith("<") and low.endswith(">")))


class Inputs(object):
    """A host's resolved variables, then the roles' defaults for what the inventory does not set."""

    def __init__(self, inputs, defaults=None):
        inputs = inputs or {}
        self.resolved = dict(inputs.get("resolved") or {})
        self.unresolved = dict(inputs.get("unresolved") or {})
        self.concerns = concerns(inputs.get("concerns") or ())
        self.defaults = dict(defaults or {})

    def get(self, name, default=None):
        """The value the run gets: the inventory's, else the role default's (a templated default counts as unknown)."""
        if name in self.resolved:
            value = self.resolved[name]
        else:
            value = self.defaults.get(name, default)
            if isinstance(value, str) and "{{" in value:
                return default
        return default if value is None else value

    def text(self, name):
        return str(self.get(name, "")).strip()

    def given(self, name):
        """Set by the inventory (or an extra var) and resolvable."""
        return name in self.resolved


def vault_file(inputs):
    return os.path.join(inputs.text("inventory_dir") or "<inventory>", "group_vars", "all", "vault.yml")


def unresolved_problems(host, inputs, names):
    """What cannot be resolved, by the variable it lacks: an undefined vault_* once per host, named to add."""
    needs, out = {}, []
    for name in names:
        info = inputs.unresolved.get(name)
        if not info:
            continue
        msg = str(info.get("error", ""))
        if info.get("kind") == "omit":
            out.append(problem(host, name, "resolves to omit (default(omit) outside a module's argument: its readers "
                               "fail on it)", "default it to '' instead of omit"))
            continue
        m = re.search(r"'([A-Za-z_][A-Za-z0-9_]*)' is undefined", msg) if info.get("kind") == "undefined" else None
        if m:
            needs.setdefault(m.group(1), []).append(name)
        else:
            out.append(problem(host, name, "cannot be resolved: %s" % msg.strip().splitlines()[0][:300] if msg else
                               "cannot be resolved", "fix its value or what its template reads"))
    for missing, readers in needs.items():
        if missing in names:
            continue     # a variable the run reads itself: its own check reports it
        what = "undefined (%s %s it)" % (", ".join(readers), "reads" if len(readers) == 1 else "read")
        if missing.startswith("vault_"):
            out.append(problem(host, missing, what, "add it to group_vars/all/vault.yml (ansible-vault edit %s)"
                               % vault_file(inputs)))
        else:
            out.append(problem(host, missing, what, "set %s in the inventory" % missing))
    return out


def secret_problems(host, inputs, name, what_for, required=True):
    """A secret the run sends: present, and not an example's placeholder (its value is never printed)."""
    if name in inputs.unresolved:
        return []
    value = inputs.text(name)
    if not value:
        if required:
            return [problem(host, name, "missing or empty", "put %s in the vault (ansible-vault edit %s)"
                            % (what_for, vault_file(inputs)))]
        return []
    if placeholder(value):
        return [problem(host, name, "is the example's placeholder, not a real value",
                        "put %s in the vault (ansible-vault edit %s)" % (what_for, vault_file(inputs)))]
    return []


def api_problems(host, inputs):
    """The Proxmox API the preflight and the lxc_gpu stage call: address, user, token ID and secret, the CA."""
    out = []
    value = inputs.text("pve_api_host")
    if "pve_api_host" in inputs.unresolved:
        pass
    elif not value:
        out.append(problem(host, "pve_api_host", "missing", "derive it from hosts.yml: " + DERIVE_API_HOST))
    elif "://" in value or "/" in value or " " in value:
        out.append(problem(host, "pve_api_host", "%r is not an address" % value, "give the node's address or name "
                           "only (no scheme, no path): " + DERIVE_API_HOST))
    user = inputs.text("pve_api_user")
    if "pve_api_user" not in inputs.unresolved and not re.match(r"^[^@\s!]+@[^@\s!]+$", user):
        out.append(problem(host, "pve_api_user", "%r is not user@realm" % user if user else "missing",
                           "set the token's user, for example root@pam"))
    token = inputs.text("pve_api_token_id")
    if "pve_api_token_id" not in inputs.unresolved and (not token or "!" in token or "@" in token):
        out.append(problem(host, "pve_api_token_id", "%r is not a token name" % token if token else "missing",
                           "set the token's name only (ansible for root@pam!ansible; `pveum user token list %s`)"
                           % (user or "root@pam")))
    out.extend(secret_problems(host, inputs, "pve_api_token_secret", "the token's secret (vault_pve_api_token_secret; "
                               "`pveum user token add` shows it once)"))
    secret = inputs.text("pve_api_token_secret")
    if secret and not placeholder(secret) and not UUID.match(secret) and "pve_api_token_secret" not in inputs.unresolved:
        out.append(problem(host, "pve_api_token_secret", "is not a UUID (a Proxmox VE token secret is one)",
                           "check that the vault holds the token's secret, not a password", "warning"))
    return out + ca_problems(host, inputs)


def ca_problems(host, inputs):
    """With certificate verification (the default), the CA file the API is verified with is on the controller."""
    if "pve_api_ca_path" in inputs.unresolved or "pve_api_validate_certs" in inputs.unresolved:
        return []
    if not boolean(inputs.get("pve_api_validate_certs", True)):
        return [problem(host, "pve_api_validate_certs", "false: the API's certificate is not verified",
                        "set it to true with pve_api_ca_path (the node's /etc/pve/pve-root-ca.pem)", "warning")]
    path = inputs.text("pve_api_ca_path")
    if not path:
        return [problem(host, "pve_api_ca_path", "not set: the API's certificate must be trusted by the controller's "
                        "own store (a node's self-signed one is not)", "copy the node's /etc/pve/pve-root-ca.pem to the "
                        "controller and point pve_api_ca_path at it", "warning")]
    if not os.path.isfile(path):
        return [problem(host, "pve_api_ca_path", "%s does not exist on the controller" % path,
                        "copy the node's /etc/pve/pve-root-ca.pem there (scp root@<node>:/etc/pve/pve-root-ca.pem %s)"
                        % path)]
    return []


def boolean(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y", "t")


def installer_problems(host, inputs, prefix):
    """The NVIDIA installer of stage 2 (prefix gpu_host) or 4 (gpu_container): a file copied from the controller must
    be there, a download needs its sha256, a checksum given must be one. A file already on the target is the run's
    to verify."""
    names = dict((k, prefix + "_driver_" + k) for k in ("version", "url", "checksum", "path", "src"))
    if any(names[k] in inputs.unresolved for k in ("version", "url", "path", "src")):
        return []
    checksum, src, path, url = (inputs.text(names[k]) for k in ("checksum", "src", "path", "url"))
    if names["checksum"] in inputs.unresolved:
        checksum = "unresolved"    # reported as such; not "missing"
    version = inputs.text(names["version"])
    out = []
    try:
        ni.parse_checksum("" if names["checksum"] in inputs.unresolved else checksum)
    except ni.InstallerError:
        out.append(problem(host, names["checksum"], "%r is not a sha256" % checksum,
                           "give sha256:<64 hex digits> (sha256sum of the installer)"))
    if src:
        if not os.path.isfile(src):
            out.append(problem(host, names["src"], "%s does not exist on the controller" % src,
                               "put the installer there, or point %s at it" % names["src"]))
    elif (url or not path) and not checksum:
        name = os.path.basename(url) or ni.installer_filename(version if re.match(r"^[0-9.]+$", version) else "<version>")
        out.append(problem(host, names["checksum"], "missing, and the installer is downloaded from %s"
                           % (url or installer_url(version)), "set it to \"sha256:<64 hex digits>\" (sha256sum %s), or "
                           "copy the installer from the controller with %s" % (name, names["src"])))
    return out


def installer_url(version):
    """Where the run downloads the installer of ``version`` from (``auto``: the host's version)."""
    try:
        return ni.default_url(version)
    except Exception:    # auto, or a version the role's own check refuses
        which = "the host's driver version" if version == "auto" else "driver " + (version or "?")
        return "NVIDIA's server (the installer of %s)" % which


def container_problems(host, inputs):
    """The container's host, its ID and how it is reached (pct_host against the node: address_problems)."""
    out = []
    if "pve_node_host" not in inputs.unresolved and not inputs.text("pve_node_host"):
        out.append(problem(host, "pve_node_host", "missing", "name the proxmox_hosts host that runs the container "
                           "(hosts.yml)"))
    vmid = inputs.text("pve_vmid")
    if "pve_vmid" not in inputs.unresolved and not (vmid.isdigit() and 100 <= int(vmid) <= 999999999):
        out.append(problem(host, "pve_vmid", "%r is not a container ID" % vmid if vmid else "missing",
                           "set the container's ID (100-999999999) in hosts.yml"))
    return out


def lock_pythons(lock_dir, version, arch="*"):
    """The Pythons (X.Y, in version order) the collection has a lock for, for this SGLang version and architecture
    (roles/sglang_install/files/locks/sglang-<version>-py<X.Y>-<arch>.txt): this check's and the preflight's list."""
    prefix = "sglang-%s-py" % version
    found = glob.glob(os.path.join(lock_dir, "%s*-%s.txt" % (glob.escape(prefix), glob.escape(arch) if arch != "*" else "*")))
    return sorted(set(re.sub(r"-.*$", "", os.path.basename(p)[len(prefix):]) for p in found),
                  key=lambda v: [int(x) if x.isdigit() else x for x in v.split(".")])


def lock_problems(host, inputs, lock_dir):
    """Stage 5's hashed lock: the given file, else the role's lock for the SGLang version and the container's Python
    (when the inventory names it: sglang_install_python ending in pythonX.Y)."""
    if any(n in inputs.unresolved for n in CONCERNS["lock"]):
        return []
    version, given = inputs.text("sglang_install_version"), inputs.text("sglang_install_lock_file")
    if given:
        return [] if os.path.isfile(given) else [problem(
            host, "sglang_install_lock_file", "%s does not exist on the controller" % given,
            "point it at a lock made by roles/sglang_install/files/locks/regenerate.sh")]
    pythons = lock_pythons(lock_dir, version)
    python = inputs.text("sglang_install_python") or "/usr/bin/python3"
    m = re.search(r"python(\d+\.\d+)$", python)
    regen = "make sglang-lock SGLANG_VERSION=%s PYVER=<X.Y>" % version
    if not pythons:
        return [problem(host, "sglang_install_version", "the collection has no lock for SGLang %s (it has locks for "
                        "SGLang %s)" % (version, ", ".join(lock_versions(lock_dir)) or "none"),
                        "pin a version that has one, or " + regen)]
    if m and m.group(1) not in pythons:
        return [problem(host, "sglang_install_python", "the collection has no lock for SGLang %s on Python %s (it has "
                        "%s)" % (version, m.group(1), ", ".join(pythons)), "set sglang_install_python to a Python with a"
                        " lock, or " + regen.replace("<X.Y>", m.group(1)))]
    if not m:
        return [problem(host, "sglang_install_python", "%s: its version is not known offline; SGLang %s has locks for "
                        "Python %s" % (python, version, ", ".join(pythons)), "the preflight reads the container's "
                        "Python; name it (/usr/bin/python3.X) to check it here", "warning")]
    return []


def model_problems(host, inputs):
    """The model's repository and pinned revision; the Hugging Face token is optional (public repositories)."""
    out = []
    repo, revision = inputs.text("model_repo_id"), inputs.text("model_revision")
    if "model_repo_id" not in inputs.unresolved and not REPO_ID.match(repo):
        out.append(problem(host, "model_repo_id", "%r is not a repository id" % repo if repo else "missing",
                           "set the hub's owner/name, for example Qwen/Qwen3.6-27B"))
    if "model_revision" not in inputs.unresolved and not COMMIT.match(revision):
        if not revision or re.search(r"\s", revision):
            out.append(problem(host, "model_revision", "%r is not a revision" % revision if revision else "missing",
                               "pin the commit (40 hex digits)"))
        else:
            out.append(problem(host, "model_revision", "%r is a branch or tag, not a commit" % revision,
                               "pin the commit: curl -s https://huggingface.co/api/models/%s/revision/%s | jq -r .sha "
                               "(the first run reports it too)" % (repo or "<repo>", revision), "warning"))
    name = "model_hf_token" if inputs.given("model_hf_token") else "hf_token"
    if name not in inputs.unresolved and placeholder(inputs.text(name)):
        out.append(problem(host, name, "is the example's placeholder: the hub refuses it (401) even for a public model",
                           "remove vault_hf_token (a token is needed only for gated or private repositories) or put a "
                           "real one in the vault (ansible-vault edit %s)" % vault_file(inputs)))
    return out


def server_problems(host, inputs):
    """The server's API key (an example's placeholder is refused, no key at all is a warning: an open endpoint), and
    its TP size, whose one owner is sglang_install_tp (tp_size_problems)."""
    out = tp_size_problems(host, inputs)
    if "sglang_server_api_key" in inputs.unresolved:
        return out
    if not inputs.text("sglang_server_api_key"):
        return out + [problem(host, "sglang_server_api_key", "empty: the server answers every client without a key",
                              "set it from the vault (vault_sglang_api_key)", "warning")]
    return out + secret_problems(host, inputs, "sglang_server_api_key", "a key of your own (vault_sglang_api_key)")


def tp_size_problems(host, inputs):
    """tp_size in sglang_server_options: the role sets it from sglang_install_tp, which the install stage's
    compatibility table is asked about too; a second value there either repeats it or contradicts the table's answer."""
    options = inputs.get("sglang_server_options") or {}
    if "sglang_server_options" in inputs.unresolved or not isinstance(options, dict) or options.get("tp_size") is None:
        return []
    tp, given = inputs.text("sglang_install_tp"), str(options["tp_size"]).strip()
    if not tp:
        return []
    if given == tp:
        return [problem(host, "sglang_server_options.tp_size", "repeats sglang_install_tp (%s)" % tp,
                        "drop it: the role sets tp_size from sglang_install_tp", "warning")]
    return [problem(host, "sglang_server_options.tp_size", "%s, but sglang_install_tp is %s (the compatibility table "
                    "was asked about %s)" % (given, tp, tp), "set sglang_install_tp: %s and drop tp_size here" % given)]


def host_problems(inputs, host, defaults=None, lock_dir=""):
    """Every problem of one host, for the concerns its inputs were resolved for (the lookup's ``concerns``)."""
    inputs = Inputs(inputs, defaults)
    out = unresolved_problems(host, inputs, reads(inputs.concerns))
    runs = {
        "api": lambda: api_problems(host, inputs),
        "host_installer": lambda: installer_problems(host, inputs, "gpu_host"),
        "container": lambda: container_problems(host, inputs),
        "container_installer": lambda: installer_problems(host, inputs, "gpu_container"),
        "lock": lambda: lock_problems(host, inputs, lock_dir),
        "model": lambda: model_problems(host, inputs),
        "server": lambda: server_problems(host, inputs),
    }
    for c in inputs.concerns:
        out.extend(runs[c]())
    return out


def address_problems(hosts):
    """Across the run's hosts: every host reached over SSH has its own ansible_host, and a container reached through
    its Proxmox host (pct) names that host and its address. ``hosts``: name -> dict(groups, ansible_host (None when
    not set), connection, pve_node_host, pct_host)."""
    out, seen = [], {}
    for name, h in hosts.items():
        addr = h.get("ansible_host") or None
        if addr:
            if addr in seen:
                out.append(problem(name, "ansible_host", "%s is also %s's" % (addr, seen[addr]),
                                   "give each host its own address in hosts.yml"))
            seen.setdefault(addr, name)
        elif "pct" not in str(h.get("connection") or "ssh") and str(h.get("connection")) != "local":
            out.append(problem(name, "ansible_host", "not set (the name %s would be resolved by DNS)" % name,
                               "set the host's address in hosts.yml"))
        if "gpu_containers" in (h.get("groups") or ()) and "pct" in str(h.get("connection") or ""):
            out.extend(pct_problems(name, h, hosts))
    return out


def pct_problems(name, h, hosts):
    """A pct container: its node is a Proxmox host of the run, and pct_host is that node's address."""
    node = h.get("pve_node_host")
    if not node:
        return []        # container_problems reports it
    if node not in hosts or "proxmox_hosts" not in (hosts[node].get("groups") or ()):
        return [problem(name, "pve_node_host", "%s is not a proxmox_hosts host of this run" % node,
                        "name the container's Proxmox host (hosts.yml), and run it with its host")]
    want, got = hosts[node].get("ansible_host"), h.get("pct_host")
    if got is None or not want:
        return []        # unresolved (the host's own check reports it), or the node has no address (reported for it)
    if not got:
        return [problem(name, "pct_host", "missing", "derive it from the node: " + DERIVE_PCT_HOST)]
    if got != want:
        return [problem(name, "pct_host", "%s is not %s's address %s" % (got, node, want),
                        "derive it from the node: " + DERIVE_PCT_HOST)]
    return []
