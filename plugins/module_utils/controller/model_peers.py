# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model stage's sources, resolved on the controller from the inventory (filter kpro.gpu_serving.model_sources).

A peer may be named by its inventory host (``{type: peer, host: ct131}``) or by a whole group (``{type: peer, group:
gpu_containers}``, every member but the host itself, in inventory order): the inventory already says where each
container lives (``pve_node_host``, ``pve_vmid``), how its Proxmox host is reached (``ansible_host``, ``ansible_user``,
``ansible_port``) and where its model is (``model_dir``), so the role hands hf_model the SSH destination, the vmid and
the path, computed once here. A peer given by address (``ssh``, ``path``, optional ``vmid``) passes as it is.
"""

from __future__ import annotations

from ansible_collections.kpro.gpu_serving.plugins.module_utils.container import model_sources

# hf_model's keys per source type (one table), and a peer may be named by inventory host or group here
KEYS = dict((t, (keys - {"type"}) | ({"host", "group"} if t == "peer" else set())) for t, keys in model_sources.KEYS.items())


def resolve(sources, hostvars, groups, me, bwlimit=0):
    """The list hf_model's ``sources`` option takes; ValueError names the item and the fix."""
    if not isinstance(sources, list) or not sources:
        raise ValueError("model_sources must be a non-empty list, e.g. [{type: hub}]")
    out = []
    for i, src in enumerate(sources):
        where = "model_sources[%d]" % i
        if not isinstance(src, dict) or src.get("type") not in KEYS:
            raise ValueError("%s: %r is not {type: hub|mirror|peer, ...}" % (where, src))
        extra = set(src) - KEYS[src["type"]] - {"type"}
        if extra:
            raise ValueError("%s: unknown key(s) %s for type %s (known: %s)" % (
                where, ", ".join(sorted(extra)), src["type"], ", ".join(sorted(KEYS[src["type"]])) or "none"))
        if src["type"] != "peer":
            out.append(dict(src))
        elif "group" in src or "host" in src:
            out.extend(_by_inventory(src, where, hostvars, groups, me, bwlimit))
        else:
            out.append(_by_address(src, where, bwlimit))
    return out


def _by_inventory(src, where, hostvars, groups, me, bwlimit):
    if "ssh" in src or "path" in src or ("host" in src and "group" in src):
        raise ValueError("%s: name a peer by host, by group or by ssh and path, one of them" % where)
    if "group" in src:
        if src["group"] not in groups:
            raise ValueError("%s: group %r is not in the inventory" % (where, src["group"]))
        names = [h for h in groups[src["group"]] if h != me]
    else:
        if src["host"] == me:
            raise ValueError("%s: host %r is this host itself; name another one" % (where, me))
        names = [src["host"]]
    return [_peer_of(name, where, hostvars, src.get("bwlimit", bwlimit)) for name in names]


def _peer_of(name, where, hostvars, bwlimit):
    hv = hostvars.get(name)
    if hv is None:
        raise ValueError("%s: host %r is not in the inventory" % (where, name))
    node = hv.get("pve_node_host")
    if node is None:  # a Proxmox host or a plain machine holding the model itself
        target, vmid = hv, None
    elif node not in hostvars:
        raise ValueError("%s: %s's pve_node_host %r is not in the inventory" % (where, name, node))
    else:
        target, vmid = hostvars[node], hv.get("pve_vmid")
    if not hv.get("model_dir"):
        raise ValueError("%s: host %r has no model_dir" % (where, name))
    peer = {"type": "peer", "ssh": "%s@%s" % (target.get("ansible_user") or "root", target.get("ansible_host") or node or name),
            "port": int(target.get("ansible_port") or 22), "path": hv["model_dir"], "bwlimit": int(bwlimit or 0)}
    if vmid is not None:
        peer["vmid"] = int(vmid)
    return peer


def _by_address(src, where, bwlimit):
    if not src.get("ssh") or not str(src.get("path", "")).startswith("/"):
        raise ValueError("%s: a peer by address needs ssh (user@host) and an absolute path" % where)
    peer = dict(src, port=int(src.get("port", 22)), bwlimit=int(src.get("bwlimit", bwlimit) or 0))
    if "vmid" in peer:
        peer["vmid"] = int(peer["vmid"])
    return peer
