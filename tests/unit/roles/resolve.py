# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the role tests that resolve the roles' conditions with Ansible itself share: run a small playbook on local
hosts (one per scenario) and read back what its debug tasks printed as ``MARKER <json>``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def resolve(tmp, hosts, plays, markers, *args):
    """{host: {marker: the JSON its debug task printed}} of a run of ``plays`` over ``hosts`` ({name: vars}), each host
    asserted to have printed every marker."""
    inv = {"all": {"vars": {"ansible_connection": "local"}, "hosts": hosts}}
    (tmp / "inventory.json").write_text(json.dumps(inv))
    (tmp / "play.json").write_text(json.dumps(plays))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(TOP, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"))
    p = subprocess.run([PLAYBOOK, "-i", str(tmp / "inventory.json"), str(tmp / "play.json")] + list(args),
                       cwd=TOP, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    out = dict((h, {}) for h in hosts)
    for m in re.finditer(r'^ok: \[(\w+)\] => \{\s*"msg": "(%s) (.*)"$' % "|".join(markers), p.stdout, re.M):
        out[m.group(1)][m.group(2)] = json.loads(json.loads('"%s"' % m.group(3)))
    assert all(len(got) == len(markers) for got in out.values()), p.stdout[-4000:]
    return out
