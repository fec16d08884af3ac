"""Bad model-stage inputs (issue 12; docs/bad-inputs/model.md): each is refused with its message, and nothing in
the container's model directory changes (every file's hash before and after; one shard is missing, so a run that
got past the checks would download)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from test_container_model_stage import MODEL, ct
from test_gpu_host_stage import play, recap
from test_model_download_safety import CT_DISK, ctl, model_stage_ready  # noqa: F401 pylint: disable=unused-import

SHARD = "model-00002-of-00015.safetensors"

# (extra vars, what the output must say) - one row per line of docs/bad-inputs/model.md
ROWS = [
    ({"model_dir": "srv/models/Qwen3.6-27B"}, "is not an absolute path"),
    ({"model_dir": "/srv/models/Qwen 3.6"}, "contains whitespace"),
    ({"model_revision": "0" * 40}, "does not exist in Qwen/Qwen3.6-27B: pin a commit sha the hub lists"),
    ({"model_repo_id": "Qwen/Nope-1B"}, "repository Qwen/Nope-1B not found (or not visible with this token)"),
    ({"model_hf_token": "hf_wrongTokenForTheLab000"}, "the hub refused the token: check model_hf_token"),
    ({"model_allow_patterns": ["*.gguf"]}, "matches allow_patterns ['*.gguf']"),
    ({"model_min_free_bytes_margin": 10 ** 18}, "not enough disk space for the model"),
    ({"model_hub_endpoint": "http://10.213.5.1:9"}, "the hub cannot be reached: check model_hub_endpoint"),
    ({"model_max_workers": 0}, "max_workers must be at least 1"),
    ({"model_verify_full": "maybe"}, "The value 'maybe' is not a valid boolean"),
]


def tree_digest(top):
    out = {}
    for d, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(d, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, top)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def one_shard_missing(model_stage_ready):  # noqa: F811
    ctl("reset=true")
    r = play("--tags", "model")
    assert recap(r.stdout, "ct129")["failed"] == 0, r.stdout[-3000:]
    ct(model_stage_ready, "rm", "-f", MODEL + "/" + SHARD)
    return model_stage_ready


@pytest.mark.parametrize("extra, words", ROWS, ids=[next(iter(r[0])) + "=" + str(next(iter(r[0].values())))[:20] for r in ROWS])
def test_bad_input_refused_and_nothing_changed(one_shard_missing, extra, words):
    before = tree_digest(CT_DISK + "/srv")
    r = play("--tags", "model", "-e", json.dumps(extra))
    assert recap(r.stdout, "ct129")["failed"] == 1, r.stdout[-3000:]
    assert words in " ".join(r.stdout.replace("''", "'").split()), r.stdout[-3000:]  # YAML output wraps and doubles quotes
    assert tree_digest(CT_DISK + "/srv") == before
    assert ct(one_shard_missing, "test", "-e", "/root/srv", check=False).returncode != 0
    assert ct(one_shard_missing, "sh", "-c", "ls -A /run/kpro-hf 2>/dev/null; true").stdout.strip() == ""
