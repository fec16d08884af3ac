"""Issue 27 in the lab: SGLang's runtime toolchain (what it compiles at its first forward pass) is installed by the
container stage, checked before the model download, and required by the stand-in at the same moment as the real one.

From the converged lab (test_serve_safety's fixture; the converge started from Proxmox's stock template, which has no
compiler): the container has gcc, g++ and the Python headers, <venv>/cuda is the unit's CUDA_HOME, the caches live in
one directory. A cold start compiles (the stand-in's simulated compile time), the next start of the unchanged server
is warm and does not spend it. With gcc removed after stage 5, a start that needs a new kernel fails at its first
forward with phase runtime_toolchain_missing naming the host compiler nvcc lacks, and the rollback brings back the recorded server,
whose kernels are cached; stage 5 alone then refuses before the model stage, and the container stage puts gcc back.
"""

from __future__ import annotations

import json
import re
import time

from test_gpu_host_stage import play, recap
from test_serve_safety import ask, ct, serving  # noqa: F401  pylint: disable=unused-import

SERVE = ("--tags", "serve", "--skip-tags", "preflight")
VENV = "/opt/sglang/venv"
CACHE = "/srv/models/sglang-compile-cache"


def text(r):
    return r.stdout.replace("\\n", "\n")


def summary_line(out, what):
    m = re.findall(r'"%s[^"]*"' % re.escape(what), out)
    assert m, out[-3000:]
    return m[-1]


def ready_s(out):
    return float(re.findall(r"ready in ([0-9.]+) s \(launch", out)[-1])


def test_the_converge_installed_the_toolchain_and_the_unit_uses_it(serving):
    lab = serving
    listing = ct(lab, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\\n", "gcc", "g++", "python3-dev").stdout
    assert sorted(listing.split("\n")[:3]) == ["g++ installed", "gcc installed", "python3-dev installed"], listing
    assert "release 13.0" in ct(lab, VENV + "/cuda/bin/nvcc", "--version").stdout
    unit = ct(lab, "systemctl", "cat", "sglang.service").stdout
    for line in ("Environment=CUDA_HOME=%s/cuda" % VENV, "Environment=TRITON_CACHE_DIR=%s/triton" % CACHE,
                 "Environment=FLASHINFER_WORKSPACE_BASE=%s/flashinfer" % CACHE):
        assert line in unit, unit


def test_a_restart_of_the_unchanged_server_compiles_nothing(serving):
    lab = serving
    ct(lab, "rm", "-rf", CACHE)
    cold = play(*SERVE + ("-e", "sglang_server_force_restart=true"))
    out = text(cold)
    assert recap(cold.stdout, "ct129")["failed"] == 0, out[-4000:]
    assert re.search(r"compile caches: cold: [1-9][0-9]* files compiled into %s" % CACHE, out), summary_line(out, "compile caches")
    warm = play(*SERVE + ("-e", "sglang_server_force_restart=true"))
    out2 = text(warm)
    assert recap(warm.stdout, "ct129")["failed"] == 0, out2[-4000:]
    assert "compile caches: warm: nothing compiled" in out2, summary_line(out2, "compile caches")
    print("ready in %.1f s cold, %.1f s warm" % (ready_s(out), ready_s(out2)))
    assert ready_s(out2) < ready_s(out)


def test_without_gcc_a_new_kernel_fails_at_the_first_forward_and_the_good_server_comes_back(serving, tmp_path):
    lab = serving
    assert recap(play(*SERVE).stdout, "ct129")["failed"] == 0   # the recorded deployment, warm
    ct(lab, "sh", "-c", "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q gcc g++ >/dev/null")
    assert ct(lab, "sh", "-c", "command -v gcc", check=False).returncode != 0
    changed = tmp_path / "changed.json"
    # an fp8 KV cache: FlashInfer attention modules the caches do not hold (their names carry the KV dtype), so this
    # launch compiles, and nvcc finds no host compiler (gcc) for them
    changed.write_text(json.dumps({"sglang_server_options": {"kv_cache_dtype": "fp8_e5m2"}, "sglang_server_gate_timeout": 300}))
    t0 = time.time()
    r = play(*SERVE + ("-e", "@%s" % changed))
    out = text(r)
    print("start without gcc, diagnosed and rolled back in %.1fs" % (time.time() - t0))
    assert recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
    flat = " ".join(out.split())
    assert re.search(r"runtime_toolchain_missing: .*rolled back to SGLang .*, serving again", flat), out[-4000:]
    assert "Failed to preprocess host compiler properties" in flat and "g++" in flat, out[-4000:]
    answered = ask(lab)
    assert answered[:2] == ["200", "200"] and "Paris" in answered[2], answered

    # stage 5 alone (the model stage would come next) refuses before anything downloads
    r = play("--tags", "sglang_install", "--skip-tags", "preflight")
    out = text(r)
    assert recap(r.stdout, "ct129")["failed"] == 1, out[-4000:]
    assert "runtime_toolchain_missing" in out and "c_compiler" in out and "gcc" in out, out[-4000:]
    assert "TASK [kpro.gpu_serving.model" not in out

    # the remedy: the container stage installs gcc again, and the recorded server keeps serving
    r = play("--tags", "container", "--skip-tags", "preflight")
    assert recap(r.stdout, "ct129")["failed"] == 0, text(r)[-4000:]
    assert ct(lab, "sh", "-c", "command -v gcc").returncode == 0
    assert recap(play(*SERVE).stdout, "ct129")["failed"] == 0
