"""ansible-doc renders every plugin and documented role of the collection, or this fails.

The plugins are listed from the tree (not from ansible-doc -l, which would skip what it cannot load); each type is
rendered in one ansible-doc call as text, since -j skips the RETURN rendering that fails on an older ansible-core.
ansible-doc says "not found" as a warning with exit 0, so every name must also appear in its output.
Usage: python tests/tools/plugin_docs.py [ANSIBLE_DOC] (default: the ansible-doc beside this Python, i.e. the venv's).
"""
from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NS = "kpro.gpu_serving."


def _stems(folder, ext=".py"):
    return sorted(os.path.basename(p)[:-len(ext)] for p in glob.glob(os.path.join(REPO, folder, "*" + ext))
                  if not os.path.basename(p).startswith("__"))


def _filter_names():
    """The keys of each FilterModule.filters() dict literal: a filter without docs is listed too."""
    names = []
    for path in sorted(glob.glob(os.path.join(REPO, "plugins", "filter", "*.py"))):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "filters":
                names += [k.value for ret in ast.walk(node) if isinstance(ret, ast.Return)
                          and isinstance(ret.value, ast.Dict) for k in ret.value.keys]
    return sorted(names)


def plugins():
    """{ansible-doc type: names}. An action plugin is documented by the module of its name."""
    found = {"module": _stems("plugins/modules"), "lookup": _stems("plugins/lookup"),
             "connection": _stems("plugins/connection"), "callback": _stems("plugins/callback"),
             "filter": _filter_names(),
             "role": sorted(os.path.basename(os.path.dirname(os.path.dirname(p)))
                            for p in glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml")))}
    orphans = sorted(set(_stems("plugins/action")) - set(found["module"]))
    if orphans:
        raise SystemExit("action plugins without a module of the same name to document them: %s" % orphans)
    return found


def _missing(ansible_doc, kind, names, env):
    """The names of one call that did not render, and ansible-doc's stderr."""
    res = subprocess.run([ansible_doc, "-t", kind] + [NS + n for n in names], capture_output=True, text=True,
                         env=env, check=False, timeout=300)
    header = "> %s%s " % (kind.upper(), ":" if kind == "role" else "")
    shown = {line[len(header):].split(" ", 1)[0].strip("*") for line in res.stdout.splitlines()
             if line.startswith(header)}
    failed = res.returncode or "[ERROR]" in res.stderr
    return [n for n in names if failed or NS + n not in shown], res.stderr.strip()


def render(ansible_doc, kind, names, env):
    """One call per type; when it fails, one call per name to say which (ansible-doc may stop at the first)."""
    if not _missing(ansible_doc, kind, names, env)[0]:
        return None
    bad = {n: err for n in names for missing, err in [_missing(ansible_doc, kind, [n], env)] if missing}
    return "%s: not rendered: %s\n%s" % (kind, sorted(bad), "\n".join(bad.values()))


def collection_env(tmp):
    """The environment in which ansible-doc finds this checkout, alone, as kpro.gpu_serving (links it under tmp)."""
    link = os.path.join(tmp, "ansible_collections", "kpro", "gpu_serving")
    os.makedirs(os.path.dirname(link))
    os.symlink(REPO, link)
    open(os.path.join(tmp, "empty.cfg"), "w", encoding="utf-8").close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=os.path.join(tmp, "empty.cfg"), ANSIBLE_COLLECTIONS_PATH=tmp, ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False", ANSIBLE_LOCAL_TEMP=os.path.join(tmp, "ansible-tmp"))
    return env


def main():
    ansible_doc = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(sys.executable), "ansible-doc")
    with tempfile.TemporaryDirectory() as tmp:
        env = collection_env(tmp)
        found = plugins()
        errors = [e for e in (render(ansible_doc, k, v, env) for k, v in found.items() if v) if e]
    version = subprocess.run([ansible_doc, "--version"], capture_output=True, text=True, check=False).stdout
    print("%s: %d plugins and roles, %s" % (version.split("\n", 1)[0], sum(map(len, found.values())),
                                            "%d types failed" % len(errors) if errors else "all rendered"))
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
