# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The import graph of plugins/module_utils: which file imports which, by group (common, host, container, serve,
controller), checked and drawn.

    .venv/bin/python tests/tools/import_graph.py --check     # exit 1: a cycle, an upward import, a file in no group
    .venv/bin/python tests/tools/import_graph.py --markdown  # the group graph and each group's files (DEVELOPING.md)
    (--root DIR: another module_utils tree, for the tool's own test)

The rules: the groups form layers, LAYERS below, and a file imports only from its own group or a lower layer: common
from common alone; no cycle among files. Read from the source with ast (nothing is imported), standard library only.
"""

from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins", "module_utils")
PKG = "ansible_collections.kpro.gpu_serving.plugins.module_utils"
# lowest first: a group may import from its own layer and those before it
LAYERS = ("common", "host", "container", "serve", "controller")
ABOUT = {
    "common": "the failure type, file I/O, names, the run lock, NVML, dpkg, device nodes: what every stage uses",
    "host": "stages 1-3 on the Proxmox host: vfio release, the driver and its kernels, boot config, the API, the container's config and mounts",
    "container": "stages 4-6 in the container: the compatibility table, the runtime toolchain, the model's sources (Hub, peer, mirror) and files",
    "serve": "stage 7: the options, the unit, the memory plan, the launch, the log's diagnosis, the gate, the output's judges, the read-only verify run",
    "controller": "on the controller only: the inventory check, the rollout plan, the API token's privileges, the model's peers",
}


def files(root=ROOT):
    """{(group, name): path} of every module_utils file (a file outside a group has group None)."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for n in names:
            if n.endswith(".py") and n != "__init__.py":
                out[(None if rel == "." else rel, n[:-3])] = os.path.join(dirpath, n)
    return out


def imports(path):
    """The (group, name) pairs a file imports from module_utils."""
    found = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PKG + "."):
            parts = node.module[len(PKG) + 1:].split(".")
            if len(parts) == 1:     # from ...module_utils.<group> import <file>
                found.update((parts[0], a.name) for a in node.names)
            else:                   # from ...module_utils.<group>.<file> import <name>
                found.add((parts[0], parts[1]))
    return found


def graph(root=ROOT):
    nodes = files(root)
    return nodes, dict((key, sorted(i for i in imports(path) if i in nodes)) for key, path in nodes.items())


def problems(nodes, edges):
    out = ["%s.py is in no group: move it under one of %s" % (n, ", ".join(LAYERS)) for g, n in nodes if g is None]
    out += ["%s/%s.py is in an unknown group" % (g, n) for g, n in nodes if g is not None and g not in LAYERS]
    for (g, n), deps in sorted(edges.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        for dg, dn in deps:
            if g in LAYERS and dg in LAYERS and LAYERS.index(dg) > LAYERS.index(g):
                out.append("%s/%s imports %s/%s: %s may import only from %s" % (g, n, dg, dn, g, ", ".join(LAYERS[:LAYERS.index(g) + 1])))
    return out + cycles(edges)


def cycles(edges):
    """Each import cycle among files, once (depth-first search, white/grey/black)."""
    state, out = {}, []

    def visit(node, stack):
        state[node] = "grey"
        for dep in edges.get(node, ()):
            if state.get(dep) == "grey":
                loop = stack[stack.index(dep):] + [dep]
                out.append("import cycle: " + " -> ".join("%s/%s" % k for k in loop))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "black"

    for node in sorted(edges, key=str):
        if node not in state:
            visit(node, [node])
    return out


def markdown(nodes, edges):
    between = {}
    for (g, _n), deps in edges.items():
        for dg, _dn in deps:
            if dg != g:
                between[(g, dg)] = between.get((g, dg), 0) + 1
    lines = ["```mermaid", "graph BT"]
    lines += ["    %s --> %s" % (g, dg) for (g, dg) in sorted(between)]
    lines += ["```", "", "| group | what it serves | files |", "|---|---|---|"]
    for g in LAYERS:
        names = sorted(n for gg, n in nodes if gg == g)
        lines.append("| `%s/` | %s | %s |" % (g, ABOUT[g], ", ".join(names)))
    return "\n".join(lines)


def main(argv):
    root = argv[argv.index("--root") + 1] if "--root" in argv else ROOT
    nodes, edges = graph(root)
    if "--markdown" in argv:
        print(markdown(nodes, edges))
    found = problems(nodes, edges)
    for p in found:
        print(p)
    if "--check" in argv and not found:
        print("%d files in %d groups: no cycle, no upward import" % (len(nodes), len(LAYERS)))
    return 1 if found and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
