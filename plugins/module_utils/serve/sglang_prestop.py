# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the serve stage checks in the container before it stops the running server, beyond the option table
(sglang_options.problems): the model directory, the listening address, the environment over the unit's own, and
SGLang's own parse of the whole argument vector. Each returns problems (strings naming the setting), which
sglang_restart.setting_problems reports together with the others.

Standard library only; runs on the target's Python 3.9+.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket

# RFC 1123 host names: letters, digits and '-' in dot-separated labels. Anything else is refused before it is looked
# up, so that a value such as "0.0.0.0; rm -rf /" never reaches the resolver (and a DNS server).
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}\.?$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
# Set by nothing the collection writes, but each one, set wrong, breaks the start: the venv's interpreter
# (PYTHONHOME moves its standard library away) or the venv itself.
_NEVER = ("PYTHONHOME",)


def model_dir_problems(model_dir, model_path):
    """The model directory must exist and hold config.json (SGLang reads it first, hf_transformers_utils get_config);
    ``model_dir`` (the plan's) and a local ``model_path`` (the server's) must be the same directory. A model_path that
    is not a local path (a Hugging Face repo id, SGLang downloads it) is not checked."""
    local = model_path if isinstance(model_path, str) and (model_path.startswith("/") or os.path.isdir(model_path)) else None
    named = [("model_dir", model_dir)] if model_dir else []
    if local and (not model_dir or os.path.realpath(local) != os.path.realpath(model_dir)):
        named.append(("options.model_path", local))
    out = []
    for what, where in named:
        if not os.path.isdir(where):
            out.append("%s %s: no such directory, so the server would not find its model; run the model stage (--tags "
                       "model) or set sglang_server_model_dir to the downloaded model" % (what, where))
        elif not os.path.isfile(os.path.join(where, "config.json")):
            out.append("%s %s holds no config.json: not a downloaded model (run the model stage, --tags model)" % (what, where))
    if not out and len(named) == 2:
        out.append("model_dir %s is not options.model_path %s: the memory plan would read another model than the server "
                   "loads; give both the same directory" % (model_dir, local))
    return out


def bind_port0(host):
    """Bind an ephemeral port on ``host`` and close it at once, as uvicorn binds (socket family by ':' in the host,
    uvicorn config.py bind_socket): no listen, nothing else sees it. Raises OSError (socket.gaierror) like uvicorn would."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    finally:
        sock.close()


def host_problems(host, bind=bind_port0):
    """``host`` must be an IP address or an RFC 1123 host name that this container resolves and can bind (checked by
    binding port 0 of it: safe, the port is the kernel's choice and closed at once)."""
    if host is None or host is False:
        return []
    host = str(host)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME_RE.match(host):
            return ["option host=%r is neither an IP address nor a host name (letters, digits, '-' and '.'); give an "
                    "address of the container, e.g. 0.0.0.0 (all) or 127.0.0.1" % host]
    try:
        bind(host)
    except OSError as e:
        return ["option host=%r cannot be bound in the container (%s); give an address of one of its interfaces, e.g. "
                "0.0.0.0" % (host, e)]
    return []


def environment_problems(env, unit_env, venv, gpus_needed):
    """Variables of the inventory's environment that replace what the unit needs: PATH without the unit's own
    directories that exist, a variable the unit sets itself (CUDA_HOME, the compile caches) set to a directory that does
    not exist, VIRTUAL_ENV other than the venv, PYTHONHOME, CUDA_VISIBLE_DEVICES with fewer GPUs than the server needs."""
    out = []
    for key in sorted(env or {}):
        value = str(env[key])
        if key == "PATH":
            missing = [d for d in unit_env.get("PATH", "").split(":") if d and d not in value.split(":") and os.path.isdir(d)]
            if missing:
                out.append("environment variable PATH=%r drops the unit's own %s (the venv's tools and CUDA compiler, the "
                           "launcher's commands): leave PATH out, or keep those directories in it" % (value, ":".join(missing)))
        elif key in unit_env and value != unit_env[key] and not os.path.isdir(value):
            out.append("environment variable %s=%r replaces the unit's own %s=%s with a directory that does not exist: leave "
                       "it out (the compile caches follow sglang_server_compile_cache_dir)" % (key, value, key, unit_env[key]))
        elif key == "VIRTUAL_ENV" and os.path.normpath(value) != os.path.normpath(venv):
            out.append("environment variable VIRTUAL_ENV=%r is not the server's venv %s: leave it out" % (value, venv))
        elif key in _NEVER:
            out.append("environment variable %s=%r moves the venv's Python away from its standard library: leave it out" % (key, value))
        elif key == "CUDA_VISIBLE_DEVICES" and len([d for d in value.split(",") if d.strip()]) < gpus_needed:
            out.append("environment variable CUDA_VISIBLE_DEVICES=%r shows fewer GPUs than the server needs (%d, tp_size x "
                       "pp_size x dp_size from base_gpu_id): leave it out and choose the GPUs with base_gpu_id" % (value, gpus_needed))
    return out


def argv_problems(parse_error):
    """SGLang's own parser's refusal of the argument vector (``sglang serve: error: ...``), as one problem."""
    if not parse_error:
        return []
    return ["the installed SGLang's own parser refuses the arguments (options and extra): %s" % parse_error]
