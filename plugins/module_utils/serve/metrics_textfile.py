# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify run's result as a node_exporter textfile (the Prometheus text exposition format 0.0.4).

One ``# HELP`` and ``# TYPE`` per metric, one sample per line, label values escaped as the format says (backslash,
double quote and line feed as ``\\\\``, ``\\"`` and ``\\n``). The file is replaced atomically (a temporary file in the same
directory, then a rename): the textfile collector never reads half a file. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import os

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.fileio import MODE_DEFAULT, atomic_write

PREFIX = "kpro_gpu_serving_"
GAUGES = (
    ("verify_ok", "1 when the verify run found no error, else 0"),
    ("verify_timestamp_seconds", "when the verify run ended (seconds since the epoch)"),
    ("verify_findings", "how many findings the verify run reported"),
    ("known_answer_ok", "1 when the server passed its known-answer checks, 0 when not (absent: not asked)"),
    ("request_latency_seconds", "time of one short completion request (absent: it failed or was not asked)"),
)
FINDING = ("verify_finding", "a finding of the verify run: 1 per check, phase and severity found")


def escape(value):
    """A label value as the exposition format writes it."""
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels):
    return "{%s}" % ",".join('%s="%s"' % (k, escape(v)) for k, v in sorted(labels.items()))


def _value(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def render(host, findings, gauges):
    """The textfile's text: the findings (one sample per distinct check, phase, severity) and ``gauges`` ({name: value},
    names of :data:`GAUGES`; None values are left out), every sample labelled with ``host``."""
    lines = []
    for name, help_text in GAUGES:
        if gauges.get(name) is None:
            continue
        lines += ["# HELP %s%s %s" % (PREFIX, name, help_text), "# TYPE %s%s gauge" % (PREFIX, name),
                  "%s%s%s %s" % (PREFIX, name, _labels({"host": host}), _value(gauges[name]))]
    seen = sorted(set((f["check"], f["phase"], f["severity"]) for f in findings))
    if seen:
        lines += ["# HELP %s%s %s" % (PREFIX, FINDING[0], FINDING[1]), "# TYPE %s%s gauge" % (PREFIX, FINDING[0])]
        lines += ["%s%s%s 1" % (PREFIX, FINDING[0], _labels({"host": host, "check": c, "phase": p, "severity": s})) for c, p, s in seen]
    return "\n".join(lines) + "\n"


def write(path, text):
    """Replace ``path`` atomically (0644: node_exporter runs as its own user), its directory made when missing."""
    d = os.path.dirname(path)
    if d and not os.path.isdir(d):
        os.makedirs(d, 0o755)
    atomic_write(path, text.encode("utf-8"), mode=MODE_DEFAULT, default_mode=0o644, unique_tmp=True)
