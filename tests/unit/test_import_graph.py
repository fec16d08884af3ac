# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module_utils layout (tests/tools/import_graph.py): the real tree passes; a tree with an upward import, a
cycle or a file outside a group fails, each named."""

from __future__ import annotations

import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "import_graph.py")
PKG = "ansible_collections.kpro.gpu_serving.plugins.module_utils"


def run(*args):
    return subprocess.run([sys.executable, TOOL] + list(args), capture_output=True, text=True, check=False)


def test_the_collections_module_utils_have_groups_no_cycle_and_no_upward_import():
    r = run("--check")
    assert r.returncode == 0, r.stdout
    assert "no cycle, no upward import" in r.stdout


def write(root, rel, text=""):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_an_upward_import_a_cycle_and_a_loose_file_are_each_named(tmp_path):
    write(tmp_path, "common/a.py", "from %s.serve import b\n" % PKG)
    write(tmp_path, "serve/b.py", "from %s.serve.c import x\n" % PKG)
    write(tmp_path, "serve/c.py", "from %s.serve import b\nx = 1\n" % PKG)
    write(tmp_path, "loose.py")
    r = run("--check", "--root", str(tmp_path))
    assert r.returncode == 1
    assert "loose.py is in no group" in r.stdout
    assert "common/a imports serve/b: common may import only from common" in r.stdout
    assert "import cycle: serve/b -> serve/c -> serve/b" in r.stdout or "import cycle: serve/c -> serve/b -> serve/c" in r.stdout


def test_the_markdown_draws_the_groups():
    r = run("--markdown")
    assert "graph BT" in r.stdout and "    serve --> common" in r.stdout and "| `host/` |" in r.stdout
