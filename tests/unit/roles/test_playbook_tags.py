# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names (issue 13): each role of the migration playbook can be selected by a tag that is its own name, and the
README's tag table names every tag the playbook has."""

from __future__ import annotations

import os

import yaml

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLAYBOOK = os.path.join(TOP, "playbooks", "deploy.yml")  # the migration imports it


def _roles_and_tags():
    with open(PLAYBOOK) as f:
        plays = yaml.safe_load(f)
    for play in plays:
        play_tags = list(play.get("tags", []))
        for entry in play.get("roles", []):
            yield entry["role"].rsplit(".", 1)[1], play_tags + list(entry.get("tags", []))
        tasks = list(play.get("tasks", []))
        while tasks:
            task = tasks.pop(0)
            tasks[:0] = task.get("block", [])      # the rollout play imports the stages' roles inside a block
            inc = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role")
            if inc:
                yield inc["name"].rsplit(".", 1)[1], play_tags + list(task.get("tags", []))


def test_every_role_has_its_name_as_a_tag():
    seen = set()
    for role, tags in _roles_and_tags():
        assert role in tags, "role %s runs with tags %s" % (role, tags)
        seen.add(role)
    stages = set(d for d in os.listdir(os.path.join(TOP, "roles")) if os.path.isfile(os.path.join(TOP, "roles", d, "tasks", "main.yml")))
    assert stages <= seen, "roles not in the playbook: %s" % sorted(stages - seen)


def test_readme_names_every_tag():
    with open(os.path.join(TOP, "README.md")) as f:
        readme = f.read()
    tags = set(t for _role, ts in _roles_and_tags() for t in ts) - {"always"}
    missing = [t for t in sorted(tags) if "`%s`" % t not in readme]
    assert not missing, "tags the README does not name: %s" % missing


def test_a_dynamic_stage_applies_its_tags_to_its_tasks():
    """A stage of the rollout is included (include_role, so the other host evaluates one task, not the whole role): the
    include's own tags select the include only; `apply` gives them to every task of the role, so that --tags serve or
    --tags container still run the stage's tasks, as the import did. The include is also tagged always (its role's
    argument check runs under any tag, as with the import). `public` exposes its defaults to the later stages."""
    with open(PLAYBOOK) as f:
        plays = yaml.safe_load(f)
    rollout = [p for p in plays if p["hosts"] == "kpro_rollout"]
    assert len(rollout) == 1
    stages = [t for t in rollout[0]["tasks"][0]["block"] if "ansible.builtin.include_role" in t]
    assert [s["ansible.builtin.include_role"]["name"].rsplit(".", 1)[1] for s in stages] == [
        "gpu_host", "lxc_gpu", "gpu_container", "sglang_install", "model", "sglang_server"]
    for stage in stages:
        inc = stage["ansible.builtin.include_role"]
        # the include is also tagged always, so every stage's argument check runs under any tag, as with the import
        assert inc.get("apply", {}).get("tags") == [t for t in stage["tags"] if t != "always"] and "always" in stage["tags"], inc["name"]
        assert inc.get("public") is True, inc["name"]
        assert "when" in stage, inc["name"]
    assert not [t for t in rollout[0]["tasks"][0]["block"] if "ansible.builtin.import_role" in t]
