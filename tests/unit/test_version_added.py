# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every option and return value documented since 0.1.0 says when it came (version_added).

What 0.1.0 documented is frozen in fixtures/docs_0.1.0.json (ansible-doc -j of the commit that released 0.1.0, named
in it); the current docs are ansible-doc's, doc fragments included. A plugin new since 0.1.0 carries version_added
itself and its options inherit it; a new suboption or contained value under a new parent inherits the parent's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "tools"))
import plugin_docs  # noqa: E402  pylint: disable=wrong-import-position

FROZEN = os.path.join(os.path.dirname(__file__), "fixtures", "docs_0.1.0.json")
SECTIONS = (("options", "suboptions"), ("return", "contains"))


def paths(specs, child_key, prefix=""):
    """{'parent.child': version_added or None} of a documented options or return tree."""
    found = {}
    for name, spec in (specs or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        found[prefix + name] = spec.get("version_added")
        found.update(paths(spec.get(child_key), child_key, prefix + name + "."))
    return found


def unmarked(frozen, current):
    """What is documented now, absent from the frozen docs and without version_added (its topmost new path only)."""
    problems = []
    for plugin, doc in sorted(current.items()):
        old = frozen.get(plugin)
        if old is None:
            if not doc["version_added"]:
                problems.append("%s: new since 0.1.0, no version_added" % plugin)
            continue
        for section, _child in SECTIONS:
            for path, added in sorted(doc[section].items()):
                parent = path.rpartition(".")[0]
                if path not in old[section] and (not parent or parent in old[section]) and not added:
                    problems.append("%s %s %s: new since 0.1.0, no version_added" % (plugin, section, path))
    return problems


def current_docs():
    """{'kind/name': {version_added, options, return}} from ansible-doc -j, one call per type (per name if it fails)."""
    ansible_doc = os.path.join(os.path.dirname(sys.executable), "ansible-doc")
    docs, broken = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        env = plugin_docs.collection_env(tmp)
        for kind, names in plugin_docs.plugins().items():
            if kind == "role" or not names:
                continue
            for batch in [names] + [[n] for n in names]:
                res = subprocess.run([ansible_doc, "-j", "-t", kind] + [plugin_docs.NS + n for n in batch],
                                     capture_output=True, text=True, env=env, check=False, timeout=300)
                if res.returncode == 0 and "[ERROR]" not in res.stderr:
                    for full, doc in json.loads(res.stdout).items():
                        info = doc.get("doc") or {}
                        docs["%s/%s" % (kind, full.rsplit(".", 1)[1])] = {
                            "version_added": info.get("version_added"),
                            "options": paths(info.get("options"), "suboptions"),
                            "return": paths(doc.get("return"), "contains")}
                    if len(batch) > 1:
                        break
                elif len(batch) == 1:
                    broken.append("%s/%s" % (kind, batch[0]))
    return docs, broken


def released_or_next():
    """The versions a version_added may name: those the changelog released and galaxy.yml's (the next one)."""
    with open(os.path.join(REPO, "changelogs", "changelog.yaml"), encoding="utf-8") as f:
        released = set(yaml.safe_load(f)["releases"])
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as f:
        return released | {str(yaml.safe_load(f)["version"])}


def test_everything_documented_since_0_1_0_has_version_added():
    with open(FROZEN, encoding="utf-8") as f:
        frozen = json.load(f)["plugins"]
    docs, broken = current_docs()
    assert not broken, "ansible-doc cannot render %s (tests/tools/plugin_docs.py says why)" % broken
    assert set(frozen) <= set(docs), "plugins of 0.1.0 gone: %s" % sorted(set(frozen) - set(docs))
    problems = unmarked(frozen, docs)
    assert not problems, "\n".join(problems)
    versions = released_or_next()
    wrong = ["%s %s %s: %s" % (plugin, section, path, added) for plugin, doc in docs.items()
             for section, _child in SECTIONS for path, added in doc[section].items()
             if added and str(added) not in versions]
    assert not wrong, "version_added names no released or next version: %s" % wrong


def test_a_new_option_or_return_value_without_version_added_is_named():
    frozen = {"module/m": {"options": ["a", "b", "b.x"], "return": ["r"]}}
    current = {
        "module/m": {"version_added": "0.1.0",
                     "options": {"a": None, "b": None, "b.x": None, "b.y": None, "c": "0.2.0", "d": None, "d.z": None},
                     "return": {"r": None, "s": None}},
        "module/new": {"version_added": None, "options": {"o": None}, "return": {}},
        "module/newer": {"version_added": "0.3.0", "options": {"o": None}, "return": {}},
    }
    assert unmarked(frozen, current) == [
        "module/m options b.y: new since 0.1.0, no version_added",
        "module/m options d: new since 0.1.0, no version_added",
        "module/m return s: new since 0.1.0, no version_added",
        "module/new: new since 0.1.0, no version_added",
    ]
