# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Report how thin the modules are: lines per module, the longest functions, what each module imports.

Usage: python tests/tools/plugin_sizes.py [--top N] [--check]
The targets (docs/DEVELOPING.md): no module function over MODULE_MAX lines, no module_utils function over
UTILS_MAX lines. ``--check`` exits 1 when a function is over its target (a method counts on its own;
a class is not a function).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_MAX = 60
UTILS_MAX = 80
UTILS_PREFIX = "ansible_collections.kpro.gpu_serving.plugins.module_utils."


def _functions(tree):
    """(qualified name, lines) of every function and method, nested ones included, docstring lines counted."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((name, child.end_lineno - child.lineno + 1))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _doc_lines(tree):
    """Lines of the DOCUMENTATION, EXAMPLES and RETURN strings."""
    n = 0
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN") for t in node.targets):
            n += node.end_lineno - node.lineno + 1
    return n


def _imports(tree):
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        parts = node.module[len(UTILS_PREFIX):].split(".") if node.module.startswith(UTILS_PREFIX) else []
        if len(parts) >= 2:     # from ...module_utils.host.pci import x
            found.add("/".join(parts[:2]))
        elif len(parts) == 1:   # from ...module_utils.host import pci as p
            found.update("%s/%s" % (parts[0], a.name) for a in node.names)
    return sorted(found)


def scan(kind):
    folder = os.path.join(ROOT, "plugins", kind)
    rows = []
    for dirpath, _dirs, names in sorted(os.walk(folder)):
        for name in sorted(n for n in names if n.endswith(".py") and n != "__init__.py"):
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                text = f.read()
            tree = ast.parse(text)
            rel = os.path.relpath(os.path.join(dirpath, name[:-3]), folder)   # module_utils: <group>/<file>
            rows.append({"file": rel, "lines": text.count("\n"), "doc": _doc_lines(tree), "functions": _functions(tree),
                         "imports": _imports(tree)})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10, help="how many of the longest functions to list per kind")
    ap.add_argument("--check", action="store_true", help="exit 1 when a function is over its target")
    args = ap.parse_args(argv)
    over = []
    modules, utils = scan("modules"), scan("module_utils")
    print("## modules: lines (all, of which code outside DOCUMENTATION/EXAMPLES/RETURN), the module_utils each imports")
    for r in modules:
        print("%-22s %5d %5d  %s" % (r["file"], r["lines"], r["lines"] - r["doc"], ", ".join(r["imports"]) or "-"))
    for label, rows, limit in (("module", modules, MODULE_MAX), ("module_utils", utils, UTILS_MAX)):
        funcs = sorted(((n, "%s.%s" % (r["file"], f)) for r in rows for f, n in r["functions"]), reverse=True)
        print("\n## longest %s functions (target: at most %d lines)" % (label, limit))
        for n, name in funcs[:args.top]:
            print("%5d  %s%s" % (n, name, "  OVER" if n > limit else ""))
        over += [name for n, name in funcs if n > limit]
    print("\n%d function(s) over target%s" % (len(over), (": " + ", ".join(over)) if over else ""))
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
