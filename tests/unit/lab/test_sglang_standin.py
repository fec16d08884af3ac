"""The SGLang stand-in (tests/lab/sglang_standin): log, memory, HTTP, drills, wheel.

No root and no lab needed: a temporary KPRO_LAB_ROOT holds a state.json with two RTX A6000,
a temporary model directory holds a Qwen3.6-27B-like config and safetensors index. Every
process the stand-in starts is ended by PID at teardown.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
STANDIN = os.path.join(REPO, "tests", "lab", "sglang_standin")
LABLIB = os.path.join(REPO, "tests", "lab", "rootfs", "usr", "lib", "kpro-lab")
UV = os.path.join(REPO, ".venv", "bin", "uv")
BASELINE = 300
TOTAL = 49140
TOTAL_SIZE = 55400000000  # bytes in the real model's index (metadata.total_size)

sys.path.insert(0, STANDIN)
from sglang.srt._kpro_lab import args as sargs  # noqa: E402
from sglang.srt._kpro_lab import memory  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log, sglang_plan, sglang_rules  # noqa: E402

WHEEL = "sglang-0.5.11 wheel (pip download --no-deps sglang==0.5.11)"

SEED = ["--tp-size", "2", "--context-length", "65536", "--mem-fraction-static", "0.85", "--speculative-algorithm", "NEXTN",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
GOOD = SEED + ["--max-running-requests", "8", "--disable-radix-cache"]

QWEN36_TEXT = {
    "model_type": "qwen3_5_text", "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1, "max_position_embeddings": 262144, "hidden_size": 5120, "intermediate_size": 17408,
    "vocab_size": 248320, "torch_dtype": "bfloat16",
}


@pytest.fixture
def lab(tmp_path):
    root = tmp_path / "root"
    (root / "var/lib/kpro-lab").mkdir(parents=True)
    gpus = [{"bdf": "0000:%02x:00.0" % b, "name": "NVIDIA RTX A6000", "uuid": "GPU-%d1f0c0de-0000-0000-0000-00000000000%d" % (i, i),
             "mem_total_mib": TOTAL, "mem_reserved_mib": BASELINE, "mem_used_mib": BASELINE, "processes": []}
            for i, b in enumerate((0x41, 0x61))]
    (root / "var/lib/kpro-lab/state.json").write_text(json.dumps({"gpus": gpus}, indent=1))
    model = tmp_path / "Qwen3.6-27B"
    model.mkdir()
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": QWEN36_TEXT,
           "vision_config": {"depth": 27, "hidden_size": 1152}, "torch_dtype": "bfloat16"}
    (model / "config.json").write_text(json.dumps(cfg))
    wm = dict(("model.language_model.layers.%d.mlp.down_proj.weight" % i, "model-%05d-of-00011.safetensors" % (i % 11 + 1)) for i in range(64))
    wm["mtp.fc.weight"] = "model-00011-of-00011.safetensors"   # the checkpoint carries the MTP head, like the real one
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": TOTAL_SIZE}, "weight_map": wm}))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "nvidia-smi").chmod(0o755)
    lab = Lab(tmp_path, root, model, bindir)
    yield lab
    lab.cleanup()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def descendants(pid):
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    data = f.read()
                kids.setdefault(int(data[data.rindex(")") + 2:].split()[1]), []).append(int(name))
            except (OSError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class Lab(object):
    def __init__(self, tmp, root, model, bindir):
        self.tmp, self.root, self.model, self.bindir = tmp, root, model, bindir
        self.started = []   # every PID we started or that the stand-in started (recorded while alive)
        self.n = 0

    def env(self, drill="", version="0.5.11", extra=None):
        env = dict(os.environ)
        env.update({"PYTHONPATH": STANDIN, "PATH": "%s:%s" % (self.bindir, env.get("PATH", "")), "KPRO_LAB_ROOT": str(self.root),
                    "KPRO_LAB_SGLANG_SPEED": "20", "KPRO_LAB_SGLANG_DRILL": drill, "KPRO_LAB_SGLANG_NO_LABSTATE": "1",
                    "KPRO_LAB_SGLANG_STANDIN_VERSION": version, "PYTHONDONTWRITEBYTECODE": "1"})
        env.pop("CUDA_VISIBLE_DEVICES", None)
        # the first forward's compiles (toolchain.py): caches in the test's directory, the nvcc stand-in as CUDA_HOME/bin/nvcc
        cuda = self.tmp / "cuda"
        if not (cuda / "bin").exists():
            (cuda / "bin").mkdir(parents=True)
            (cuda / "bin" / "nvcc").symlink_to(os.path.join(STANDIN, "nvidia_cuda_nvcc", "nvcc"))
        env.update({"TRITON_CACHE_DIR": str(self.tmp / "cache" / "triton"), "FLASHINFER_WORKSPACE_BASE": str(self.tmp / "cache" / "flashinfer"),
                    "CUDA_HOME": str(cuda)})
        env.update(extra or {})
        return env

    def start(self, argv, **kw):
        self.n += 1
        self.log = self.tmp / ("launch-%d.log" % self.n)
        self.port = free_port()
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(self.model), "--served-model-name", "qwen3.6-27b",
               "--port", str(self.port)] + list(argv)
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env(**kw), cwd=str(self.tmp))
        self.started.append(self.proc.pid)
        return self.proc

    def record_children(self):
        for pid in descendants(self.proc.pid):
            if pid not in self.started:
                self.started.append(pid)

    def text(self):
        return self.log.read_text(errors="replace")

    def state(self):
        return json.loads((self.root / "var/lib/kpro-lab/state.json").read_text())

    def used(self):
        return [g["mem_used_mib"] for g in self.state()["gpus"]]

    def get(self, path, key=None, data=None):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=json.dumps(data).encode() if data is not None else None,
                                     headers=dict([("Content-Type", "application/json")] + ([("Authorization", "Bearer " + key)] if key else [])))
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except (urllib.error.URLError, OSError):
            return None, ""

    def wait(self, timeout=30):
        """Wait for the main process, sampling memory; returns (rc, samples)."""
        samples = []
        deadline = time.time() + timeout
        while self.proc.poll() is None and time.time() < deadline:
            self.record_children()
            samples.append(self.used())
            time.sleep(0.05)
        assert self.proc.poll() is not None, "stand-in did not exit:\n" + self.text()[-3000:]
        return self.proc.returncode, samples

    def wait_for(self, cond, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.record_children()
            if cond():
                return True
            if self.proc.poll() is not None:
                return cond()
            time.sleep(0.05)
        return False

    def wait_baseline(self, timeout=5):
        return self.wait_for_any(lambda: self.used() == [BASELINE, BASELINE], timeout)

    def wait_for_any(self, cond, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond():
                return True
            time.sleep(0.05)
        return cond()

    def cleanup(self):
        for pid in reversed(self.started):
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if getattr(self, "proc", None) is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


def order_ok(text, needles):
    pos = 0
    for n in needles:
        i = text.find(n, pos)
        assert i >= 0, "missing (in order) %r" % n
        pos = i + len(n)


# ---- the formula ----------------------------------------------------------------------

def test_formula_seed_numbers(tmp_path):
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": QWEN36_TEXT, "vision_config": {"hidden_size": 1152}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": TOTAL_SIZE}, "weight_map": {}}))
    f = memory.ModelFacts(str(tmp_path))
    assert len(f.full_layers) == 16 and f.linear_layers == 48
    assert memory.cell_size(f, 2, 2) == 32 * 1024
    per_req = memory.mamba_cache_per_req(f, 2, "float32")
    assert abs(per_req / memory.MIB - 73.41) < 0.01
    assert abs(per_req * 48 * 5 / memory.GIB - 17.2) < 0.05   # 48 x 4 draft tokens + 48 states
    # 0.5.9: no piecewise graphs by default, 2048 MiB for an EAGLE draft (0.5.9 server_args.py:1043-1057)
    assert memory.default_mem_fraction(49140, 2, 4096, 32, None, _NoVlm(), version=(0, 5, 9, 0)) == 0.858
    assert memory.default_mem_fraction(49140, 2, 4096, 32, "EAGLE", _NoVlm(), version=(0, 5, 9, 0)) == 0.816
    # 0.5.11: + 50 piecewise sizes x 8 MiB, 4096 MiB for the draft (server_args.py:1456-1475)
    assert memory.default_mem_fraction(49140, 2, 4096, 32, None, _NoVlm()) == 0.85
    assert memory.default_mem_fraction(49140, 2, 4096, 32, "EAGLE", _NoVlm()) == 0.767
    # the plan computes the same default for the same card and model
    f.is_multimodal = True
    geo = sglang_plan.model_geometry(cfg)
    o = sglang_plan.resolve_options({"tp": 2, "speculative_algorithm": "NEXTN", "disable_radix_cache": True}, geo)
    assert sglang_rules.default_mem_fraction_static(49140, o, geo) == memory.default_mem_fraction(49140, 2, 4096, 32, "EAGLE", f)


class _NoVlm(object):
    is_multimodal = False


def test_one_pre_weights_value_and_the_same_mtp_head():
    """The plan and the stand-in use one value for the memory before weights, and count the mtp.* tensors alike."""
    assert memory.PRE_WEIGHTS_MIB == sglang_rules.PRE_WEIGHTS_MIB == sglang_plan.DEFAULTS["context_overhead_mib"]
    assert memory.context_mib(2) + memory.NCCL_INIT_MIB == memory.context_mib(1) == memory.PRE_WEIGHTS_MIB
    assert set(sargs.MAMBA_RADIX_ARCHS) == set(sglang_rules.MAMBA_RADIX_ARCHS)
    fix = os.path.join(REPO, "tests", "unit", "fixtures", "qwen3.6-27b")
    facts = memory.ModelFacts(fix)
    geo = sglang_plan.model_geometry(sglang_plan.load_json(os.path.join(fix, "config.json")))
    index = sglang_plan.load_json(os.path.join(fix, "model.safetensors.index.json"))
    assert memory.mtp_bytes(facts) == sglang_plan.mtp_checkpoint_bytes(geo, index) > 800 * 2 ** 20
    assert memory.weights_per_rank_bytes(facts, 2) == pytest.approx((facts.total_size - memory.mtp_bytes(facts)) / 2.0)
    assert memory.draft_weights_per_rank_bytes(facts, 2) == pytest.approx(sglang_plan.draft_weights_bytes(geo, 2, 2))


# ---- a good start ---------------------------------------------------------------------------

def test_good_start_log_memory_http(lab):
    lab.start(GOOD + ["--api-key", "sekret"])
    health, samples = [], []
    assert lab.wait_for(lambda: (samples.append(lab.used()), health.append(lab.get("/health")[0]), health[-1] == 200)[-1], 30), lab.text()
    text = lab.text()
    plan = good_plan(lab)
    free_gb = (TOTAL - BASELINE - memory.PRE_WEIGHTS_MIB) / 1024.0
    order_ok(text, ["server_args=ServerArgs(", "TP0] Init torch distributed begin.", "Init torch distributed ends.",
                    "TP0] Load weight begin. avail mem=%.2f GB" % free_gb,
                    "Loading safetensors checkpoint shards: 100% Completed | 11/11", "Load weight end.", "type=Qwen3_5ForConditionalGeneration",
                    "Mamba Cache is allocated. max_mamba_cache_size: 8", "KV Cache is allocated. #tokens: ", "Memory pool end.",
                    "Capture cuda graph begin.", "Capture cuda graph end.", "type=Qwen3_5ForCausalLMMTP", "Capture draft cuda graph end.",
                    "Capture draft extend cuda graph end.", "max_total_num_tokens=", "INFO:     Started server process [%d]" % lab.proc.pid,
                    "Waiting for application startup.", "Application startup complete.", "Uvicorn running on http://127.0.0.1:%d" % lab.port,
                    '"GET /model_info HTTP/1.1" 200 OK', '"POST /v1/chat/completions HTTP/1.1" 200 OK', "The server is fired up and ready to roll!"])
    tokens = plan["per_gpu"]["kv_tokens"]
    for r in (0, 1):
        # the plan's token count for the same inputs (the stand-in's MiB bookkeeping may shift it by a few tokens)
        m = re.search(r"TP%d\] KV Cache is allocated\. #tokens: (\d+), K size: ([\d.]+) GB" % r, text)
        assert "TP%d] Load weight end. elapsed=" % r in text and m, text[-3000:]
        assert abs(int(m.group(1)) - tokens) <= 64 and float(m.group(2)) == pytest.approx((tokens + 1) * 2 * 256 * 16 * 2 / 2.0 ** 30, abs=0.011)
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP1\] Init torch distributed begin\.$", text, re.M)
    # 0.5.11 model_runner.py:1467-1474: no dtype=; the target's weights leave the mtp.* tensors out (qwen3_5.py:1171)
    target_gb = plan["per_gpu"]["weights_mib"] / 1024.0
    assert re.search(r"TP0\] Load weight end\. elapsed=[\d.]+ s, type=Qwen3_5ForConditionalGeneration, avail mem=[\d.]+ GB, mem usage=%.2f GB\."
                     % target_gb, text) or re.search(r"mem usage=%.2f GB\." % (target_gb - 0.01), text), text[-4000:]
    assert "dtype=torch." not in text
    assert re.search(r"type=Qwen3_5ForCausalLMMTP, avail mem=[\d.]+ GB, mem usage=%.2f GB\." % (plan["per_gpu"]["draft_weights_mib"] / 1024.0), text)
    assert plan["max_running_requests"] == 8 and "max_running_requests=8," in text
    # memory rose in steps, per rank, and is held by the titled scheduler processes
    assert len(set(s[0] for s in samples)) > 5 and samples[0] == [BASELINE, BASELINE]
    st = lab.state()
    for r, g in enumerate(st["gpus"]):
        assert g["mem_used_mib"] > BASELINE + 40000
        (p,) = g["processes"]
        assert p["name"] == "sglang::scheduler_TP%d" % r and g["mem_used_mib"] == BASELINE + p["used_mib"]
        with open("/proc/%d/cmdline" % p["pid"], "rb") as f:
            assert f.read().split(b"\0")[0] == p["name"].encode()
        with open("/proc/%d/comm" % p["pid"]) as f:
            assert f.read().strip() == "sglang::schedul"
    titles = []
    for pid in descendants(lab.proc.pid):
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            titles.append(f.read().split(b"\0")[0].decode())
    assert "sglang::detokenizer" in titles
    assert 503 in health or None in health
    # HTTP
    assert lab.get("/v1/models") == (401, '{"error": "Unauthorized"}')
    assert lab.get("/v1/models", key="wrong")[0] == 401
    assert lab.get("/health")[0] == 200 and lab.get("/health")[1] == ""
    code, body = lab.get("/v1/models", key="sekret")
    card = json.loads(body)["data"][0]
    assert code == 200 and card["id"] == "qwen3.6-27b" and card["max_model_len"] == 65536 and card["owned_by"] == "sglang"
    # thinking off (Qwen3.6 thinks otherwise: tests/unit/lab/test_standin_reasoning.py)
    code, body = lab.get("/v1/chat/completions", key="sekret", data={"model": "qwen3.6-27b", "temperature": 0, "messages": [
        {"role": "user", "content": "What is 2+2? Answer with one number."}], "chat_template_kwargs": {"enable_thinking": False}})
    out = json.loads(body)
    assert code == 200 and out["choices"][0]["message"]["content"] == "4" and out["usage"]["completion_tokens"] == 1
    code, body = lab.get("/generate", key="sekret", data={"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 16}})
    gen = json.loads(body)
    assert "Paris" in gen["text"] and gen["meta_info"]["spec_accept_length"] > 2
    code, body = lab.get("/server_info", key="sekret")
    assert abs(json.loads(body)["max_total_num_tokens"] - tokens) <= 64
    # SIGTERM after the first request: sglang's graceful exit ends with kill_process_tree(self) -> SIGKILL
    os.kill(lab.proc.pid, signal.SIGTERM)
    rc = lab.wait()[0]
    assert rc == -9 and "Gracefully exiting..." in lab.text()
    assert lab.wait_baseline()
    assert all(g["processes"] == [] for g in lab.state()["gpus"])


def good_plan(lab):
    """sglang_plan.plan() for GOOD on the lab fixture's model and GPUs."""
    opts = {"tp": 2, "context_length": 65536, "mem_fraction_static": 0.85, "speculative_algorithm": "NEXTN", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "max_running_requests": 8, "disable_radix_cache": True}
    return sglang_plan.plan(str(lab.model / "config.json"), str(lab.model / "model.safetensors.index.json"), opts,
                            gpu_total_mib=[TOTAL, TOTAL], gpu_baseline_mib=[BASELINE, BASELINE])


@pytest.mark.parametrize("argv, opts", [
    # one model over two pipeline stages of one GPU each: each GPU holds its stage (issue 29)
    (["--tp-size", "1", "--pp-size", "2"], {"tp": 1, "pp_size": 2}),
    # the KV pool capped below what the memory holds
    (["--tp-size", "2", "--max-total-tokens", "100000"], {"tp": 2, "max_total_tokens": 100000}),
], ids=["pp_size", "max_total_tokens"])
def test_the_standin_holds_what_the_plan_plans(lab, argv, opts):
    """The stand-in allocates per rank what the memory plan (sglang_plan.plan) plans for the same options: the weights
    of each GPU and the KV pool's tokens."""
    common = ["--context-length", "65536", "--mem-fraction-static", "0.85", "--max-running-requests", "16"]
    lab.start(common + argv)
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200, 30), lab.text()[-3000:]
    text = lab.text()
    plan = sglang_plan.plan(str(lab.model / "config.json"), str(lab.model / "model.safetensors.index.json"),
                            dict(opts, context_length=65536, mem_fraction_static=0.85, max_running_requests=16),
                            gpu_total_mib=[TOTAL, TOTAL], gpu_baseline_mib=[BASELINE, BASELINE])
    assert plan["fits"], plan["reason"]
    prefixes = ["PP0", "PP1"] if opts.get("pp_size") else ["TP0", "TP1"]
    for p in prefixes:
        usage = re.search(r"%s\] Load weight end\. .* mem usage=([\d.]+) GB\." % p, text)
        tokens = re.search(r"%s\] KV Cache is allocated\. #tokens: (\d+)," % p, text)
        assert usage and tokens, text[-3000:]
        assert float(usage.group(1)) == pytest.approx(plan["per_gpu"]["weights_mib"] / 1024.0, abs=0.02)
        assert abs(int(tokens.group(1)) - plan["per_gpu"]["kv_tokens"]) <= 64
    titles = sorted(g["processes"][0]["name"] for g in lab.state()["gpus"])
    assert titles == ["sglang::scheduler_" + p for p in prefixes]
    if opts.get("max_total_tokens"):
        assert plan["per_gpu"]["kv_tokens"] == 100000 < plan["per_gpu"]["kv_capacity_tokens"]
        assert "max_total_num_tokens=100000," in text
    else:
        # half of the layers on each GPU: about half the weights of one GPU holding them all
        whole = sglang_plan.plan(str(lab.model / "config.json"), str(lab.model / "model.safetensors.index.json"), {"tp": 1},
                                 gpu_total_mib=[TOTAL], gpu_baseline_mib=[BASELINE])
        assert plan["per_gpu"]["weights_mib"] < whole["per_gpu"]["weights_mib"] * 0.55
        assert "Pipeline parallelism is incompatible with overlap schedule." in text


# ---- failures -----------------------------------------------------------------------------

# The source text the stand-in follows, quoted from the sglang-0.5.11 wheel:
# sglang/srt/server_args.py:2453-2456
#     raise ValueError(
#         f"Speculative decoding for {model_arch} is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
#         "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
#     )
SPEC_RADIX_SOURCE = ("Speculative decoding for {model_arch} is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
                     "To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.")
# sglang/srt/entrypoints/engine.py:1216-1224 (_scheduler_died_error)
#     return RuntimeError(
#         f"Rank {rank} scheduler died during initialization "
#         f"(exit code: {proc.exitcode}). "
#         f"If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
#         f"Run `dmesg -T | grep -i oom` to check."
#     )
DIED_SOURCE = ("Rank {rank} scheduler died during initialization (exit code: {exitcode}). If exit code is -9 (SIGKILL), a common cause "
               "is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.")
# sglang/srt/model_executor/model_runner.py:1467-1474 (0.5.11; 0.5.9 had dtype={self.dtype}, after type=)
#     f"Load weight end. "
#     f"elapsed={time.perf_counter() - tic_total:.2f} s, "
#     f"type={type(self.model).__name__}, "
#     f"{quant_str + ', ' if quant_str else ''}"
#     f"avail mem={after_avail_memory:.2f} GB, "
#     f"mem usage={self.weight_load_mem_usage:.2f} GB."
WEIGHT_END_SOURCE = re.compile(r"Load weight end\. elapsed=\d+\.\d\d s, type=\w+, avail mem=\d+\.\d\d GB, mem usage=\d+\.\d\d GB\.$")


def test_seed_refused_at_argument_parsing_0511(lab):
    """0.5.10+: NEXTN with the radix cache on a hybrid model stops in ServerArgs.__post_init__, before any GPU use; the plan
    refuses the same configuration with the same text and names the flag."""
    lab.start(SEED)
    rc, samples = lab.wait()
    text = lab.text()
    msg = SPEC_RADIX_SOURCE.format(model_arch="Qwen3_5ForConditionalGeneration")
    assert rc == 1 and "ValueError: " + msg in text.splitlines()
    order_ok(text, ["Traceback (most recent call last):", "sglang/launch_server.py\", line 66, in <module>",
                    "sglang/srt/server_args.py\", line 845, in __post_init__", "line 2453, in _handle_mamba_radix_cache", "ValueError: "])
    assert "Init torch distributed begin" not in text and "Max running requests is reset" not in text
    assert max(max(s) for s in samples) == BASELINE
    p = sglang_plan.plan(str(lab.model / "config.json"), str(lab.model / "model.safetensors.index.json"),
                         {"tp": 2, "context_length": 65536, "mem_fraction_static": 0.85, "speculative_algorithm": "NEXTN"},
                         gpu_total_mib=[TOTAL, TOTAL], gpu_baseline_mib=[BASELINE, BASELINE])
    assert p["fits"] is False and p["phase"] == "init_failed_before_gpu" and msg in p["reason"]
    assert p["suggestions"][0]["flag"] == "--disable-radix-cache" and "--disable-radix-cache" in p["remedy"]
    # with the flag the stand-in starts (GOOD) and 0.5.9 disabled the radix cache by itself (test_seed_kv_cache_oom_natural)


def test_scheduler_died_0511(lab):
    """A rank SIGKILLed while loading (the OOM killer's way): 0.5.10+ raises _scheduler_died_error with the exit code."""
    lab.start(GOOD, drill="slow_load:60")
    assert lab.wait_for(lambda: "Using model weights format" in lab.text())
    lab.record_children()
    tp1 = [p for p in descendants(lab.proc.pid) if _title(p) == "sglang::scheduler_TP1"]
    assert tp1, lab.text()
    os.kill(tp1[0], signal.SIGKILL)
    rc = lab.wait()[0]
    text = lab.text()
    assert rc == 1, text[-3000:]
    assert "RuntimeError: " + DIED_SOURCE.format(rank=1, exitcode=-9) in text.splitlines()
    order_ok(text, ["Traceback (most recent call last):", "entrypoints/engine.py\", line 619, in wait_for_ready", "_wait_for_scheduler_ready",
                    "RuntimeError: Rank 1 scheduler died during initialization (exit code: -9)."])
    assert "scheduler is dead" not in text
    subprocess.run([sys.executable, "-m", "sglang.srt._kpro_lab.gpustate", "reap"], env=lab.env(), capture_output=True, check=True)
    assert lab.wait_baseline()


def _title(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")[0].decode()
    except OSError:
        return ""


def test_weight_end_line_follows_the_0511_source(lab):
    """Every "Load weight end" line of a 0.5.11 start matches the source's f-string (no dtype=); 0.5.9 keeps dtype=."""
    lab.start(GOOD + ["--disable-cuda-graph"])
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200), lab.text()
    lines = [ln.split("] ", 1)[1] for ln in lab.text().splitlines() if "Load weight end." in ln]
    assert len(lines) == 4 and all(WEIGHT_END_SOURCE.match(ln) for ln in lines), lines
    os.kill(lab.proc.pid, signal.SIGTERM)
    lab.wait()
    assert lab.wait_baseline()


def test_seed_kv_cache_oom_natural(lab):
    """65536 ctx + 0.85 + NEXTN (48 requests by default) on 2 x A6000: the seed's failure, by the formula."""
    # Real-time speed: at 20x the weights sit on the GPU for a few ms before the crash frees them,
    # shorter than a loaded CI machine's sampling gap; at 1x loading alone takes 1.6 s.
    lab.start(SEED, version="0.5.9", extra={"KPRO_LAB_SGLANG_SPEED": "1"})
    rc, samples = lab.wait(timeout=60)
    text = lab.text()
    assert rc == -9
    assert "Max running requests is reset to 48 for speculative decoding." in text
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.85" in text
    order_ok(text, ["Load weight end.", "Scheduler hit an exception: Traceback", "Received sigquit from a child process. It usually means the child failed."])
    assert "KV Cache is allocated" not in text
    assert max(s[0] for s in samples) > BASELINE + 20000   # weights were on the GPU
    assert lab.wait_baseline()


DRILLS = [
    ("kv_cache_oom", -9, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.85", True),
    ("weights_oom", -9, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", True),
    ("nccl_error", -9, "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", True),
    ("cuda_graph_failed", -9, "Exception: Capture cuda graph failed: CUDA out of memory.", True),
    ("init_failed_before_gpu", -9, "OSError: Can't load image processor for", False),
    # the OOM killer's SIGKILL of a rank halfway through the shards: 0.5.11's main reports it and exits 1
    ("host_oom_killed", 1, "scheduler died during initialization (exit code: -9)", True),
    ("weights_load_failed", -9, "RuntimeError: Cannot find any model weights with `", True),
    ("port_in_use", 3, "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', %(port)d): address already in use", True),
    ("warmup_failed", -9, "Initialization failed. warmup error: Traceback", True),
]


@pytest.mark.parametrize("drill,rc,needle,touches_gpu", DRILLS, ids=[d[0] for d in DRILLS])
def test_drill(lab, drill, rc, needle, touches_gpu):
    # 4x, not 20x: the memory peak must outlast the 50 ms sampling on a loaded 2-core machine
    lab.start(GOOD, drill=drill, extra={"KPRO_LAB_SGLANG_SPEED": "4"})
    got, samples = lab.wait()
    text = lab.text()
    assert got == rc, text[-3000:]
    assert needle % {"port": lab.port} in text
    # the collection's diagnosis names the drill's phase from what the stand-in wrote
    assert sglang_log.diagnose(text, exit_status=128 - got if got < 0 else got)["phase"] == drill
    peak = max(max(s) for s in samples)
    if touches_gpu:
        assert peak > BASELINE
    else:
        assert peak == BASELINE and len(text.splitlines()) >= 100 and "Init torch distributed begin." not in text
    if drill == "port_in_use":
        order_ok(text, ["Application startup complete.", "[Errno 98]", "Waiting for application shutdown.", "Application shutdown complete."])
        assert "Uvicorn running" not in text
    if drill == "weights_oom":
        order_ok(text, ["Load weight begin.", "Scheduler hit an exception:", "Process "])
        assert "Load weight end." not in text
    if drill == "nccl_error":
        assert "Init torch distributed ends." not in text
    if drill == "host_oom_killed":
        order_ok(text, ["Load weight begin.", "Loading safetensors checkpoint shards:", "Rank 1 scheduler died during initialization"])
        assert "Load weight end." not in text and "Scheduler hit an exception" not in text
        # the killed rank cannot free its memory: the driver does (the lab's reaper)
        subprocess.run([sys.executable, "-m", "sglang.srt._kpro_lab.gpustate", "reap"], env=lab.env(), capture_output=True, check=True)
    if drill == "weights_load_failed":
        order_ok(text, ["Load weight begin.", "Scheduler hit an exception:", "model_loader/loader.py", "Cannot find any model weights"])
        assert "Loading safetensors checkpoint shards" not in text
    if drill == "warmup_failed":
        order_ok(text, ["Uvicorn running on", '"POST /v1/chat/completions HTTP/1.1" 500', "Initialization failed. warmup error:"])
        assert "fired up" not in text
    assert lab.wait_baseline()


def test_port_really_in_use(lab):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        lab.start(GOOD[:0] + ["--tp-size", "2", "--disable-cuda-graph", "--context-length", "32768", "--port", str(s.getsockname()[1])])
        rc = lab.wait()[0]
        assert rc == 3 and "address already in use" in lab.text() and "Capture cuda graph" not in lab.text()
    finally:
        s.close()
    assert lab.wait_baseline()


def test_degenerate_output_drill_and_natural_059(lab):
    lab.start(GOOD, drill="degenerate_output")
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200)
    out = json.loads(lab.get("/v1/chat/completions", data={"messages": [{"role": "user", "content": "What is 2+2? Answer with one number."}]})[1])
    assert out["choices"][0]["message"]["content"].strip() == "" and "\n\n" in out["choices"][0]["message"]["content"]
    os.kill(lab.proc.pid, signal.SIGTERM)
    lab.wait()
    assert lab.wait_baseline()
    # 0.5.9 at TP=2 on the dense Qwen3.5 architecture: degenerate without any drill (sglang PR #19070)
    lab.start(["--tp-size", "2", "--context-length", "32768", "--disable-cuda-graph"], version="0.5.9")
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200), lab.text()
    out = json.loads(lab.get("/v1/chat/completions", data={"messages": [{"role": "user", "content": "What is 2+2?"}]})[1])
    assert out["choices"][0]["message"]["content"] != "4"
    assert "Disabling overlap schedule since mamba no_buffer" in lab.text()


def test_leftover_child_keeps_memory_until_killed(lab):
    lab.start(GOOD, drill="leftover_child")
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200)
    lab.record_children()
    tp1 = [p["pid"] for p in lab.state()["gpus"][1]["processes"]][0]
    os.kill(lab.proc.pid, signal.SIGTERM)
    lab.wait()
    time.sleep(0.3)
    assert alive(tp1)
    used = lab.used()
    assert used[0] == BASELINE and used[1] > BASELINE + 40000
    assert lab.state()["gpus"][1]["processes"][0]["name"] == "sglang::scheduler_TP1"
    os.kill(tp1, signal.SIGTERM)
    assert lab.wait_baseline()


def test_sigkill_everything_then_reap(lab):
    lab.start(GOOD)
    assert lab.wait_for(lambda: lab.get("/health")[0] == 200)
    lab.record_children()
    pids = [lab.proc.pid] + descendants(lab.proc.pid)
    for pid in pids:  # stopped first, so that no handler (parent-death signal, child watcher) frees anything
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    lab.proc.wait(5)
    for pid in pids:
        assert lab.wait_for_any(lambda: not alive(pid), 5)
    assert lab.used()[0] > BASELINE  # nobody left to free it: the lab's reaper does
    out = subprocess.run([sys.executable, "-m", "sglang.srt._kpro_lab.gpustate", "reap"], env=lab.env(), capture_output=True, text=True, check=True)
    assert "sglang::scheduler_TP0" in out.stdout
    assert lab.used() == [BASELINE, BASELINE]


def test_hang_and_slow_load(lab):
    lab.start(GOOD, drill="hang")
    assert lab.wait_for(lambda: "Using model weights format" in lab.text())
    time.sleep(1.0)
    a = (lab.used(), len(lab.text()))
    time.sleep(0.8)
    b = (lab.used(), len(lab.text()))
    assert a == b and lab.proc.poll() is None and a[0][0] > BASELINE
    os.kill(lab.proc.pid, signal.SIGTERM)   # during loading: the default action, children go with it
    rc = lab.wait()[0]
    assert rc == -15
    assert lab.wait_baseline()
    lab.start(GOOD, drill="slow_load:60")  # 60 s at speed 1, 3 s at speed 20
    assert lab.wait_for(lambda: "Using model weights format" in lab.text())
    a = (lab.used()[0], lab.text().count("Loading safetensors"))
    time.sleep(0.8)
    b = (lab.used()[0], lab.text().count("Loading safetensors"))
    assert b[0] > a[0] and b[1] > a[1] and "Load weight end" not in lab.text()
    os.kill(lab.proc.pid, signal.SIGTERM)
    lab.wait()
    assert lab.wait_baseline()


def test_bad_flags_and_drills(lab):
    lab.start(["--no-such-flag"])
    rc = lab.wait()[0]
    assert rc == 2 and "error: unrecognized arguments: --no-such-flag" in lab.text()
    lab.start(["--speculative-algorithm", "MTP"])
    rc = lab.wait()[0]
    assert rc == 2 and "argument --speculative-algorithm: invalid choice: 'MTP'" in lab.text()
    lab.start(GOOD, drill="no_such_drill")
    rc = lab.wait()[0]
    assert rc == 70 and "unknown drill" in lab.text()
    lab.start(SEED + ["--disable-radix-cache", "--mamba-scheduler-strategy", "extra_buffer"])  # server_args.py:2397-2401
    rc = lab.wait()[0]
    assert rc == 1 and "ValueError: mamba extra_buffer is not compatible with --disable-radix-cache Overlap" in lab.text()


def test_drill_file_and_labstate_backend(lab):
    (lab.root / "var/lib/kpro-lab/sglang-drill").write_text("nccl_error\n")
    env = lab.env(extra={"KPRO_LAB_SGLANG_NO_LABSTATE": "0", "KPRO_LAB_LIBDIR": LABLIB})
    del env["KPRO_LAB_SGLANG_DRILL"]
    out = subprocess.run([sys.executable, "-c", "from sglang.srt._kpro_lab import gpustate, util; print(gpustate.backend(), util.read_drills())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "labstate" and "nccl_error" in out.stdout
    # through labstate.modify() the lab's renderers run (nvml.conf for the fake libnvidia-ml)
    code = "from sglang.srt._kpro_lab import gpustate; gpustate.set_usage(0, 1000, 'sglang::scheduler_TP0'); gpustate.release()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert (lab.root / "var/lib/kpro-lab/nvml.conf").exists() and lab.used() == [BASELINE, BASELINE]


@pytest.mark.skipif(not os.path.exists(UV), reason="uv not in .venv")
def test_wheels_install_with_uv(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(STANDIN, "build_wheel.py"), "--out", str(tmp_path / "whl")], capture_output=True, text=True, check=True)
    built = sorted(os.path.basename(x) for x in out.stdout.split())
    assert "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl" in built   # the compiler wheel's stand-in
    names = [n for n in built if n.startswith("sglang-")]
    assert names == ["sglang-0.5.10.post1-py3-none-any.whl", "sglang-0.5.11-py3-none-any.whl", "sglang-0.5.23-py3-none-any.whl",
                     "sglang-0.5.9-py3-none-any.whl"]
    first = (tmp_path / "whl" / names[1]).read_bytes()
    subprocess.run([sys.executable, os.path.join(STANDIN, "build_wheel.py"), "--out", str(tmp_path / "whl"), "--version", "0.5.11"], check=True,
                   capture_output=True)
    assert (tmp_path / "whl" / names[1]).read_bytes() == first  # reproducible: hashes in lock files stay valid
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("PYTHONPATH", None)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([UV, "venv", "-q", "-p", python, str(tmp_path / "venv")], env=env, check=True)
    env["VIRTUAL_ENV"] = str(tmp_path / "venv")
    subprocess.run([UV, "pip", "install", "-q", "--offline", "--no-index", "--find-links", str(tmp_path / "whl"), "sglang==0.5.11"], env=env, check=True)
    out = subprocess.run([str(tmp_path / "venv/bin/python"), "-c", "import sglang, sglang.launch_server; print(sglang.__version__, sglang._kpro_lab_standin)"],
                         env=env, capture_output=True, text=True, check=True, cwd=str(tmp_path))
    assert out.stdout.split() == ["0.5.11", "True"]
    assert shutil.which("sglang", path=str(tmp_path / "venv/bin"))


def test_lab_node_state_with_derived_used_memory(lab):
    """The lab node's state leaves mem_used_mib unset (used = reserved + processes, nvml_render's rule): the
    stand-in allocates against that and leaves it unset, so NVML keeps deriving it (as in container 129)."""
    st = lab.state()
    for g in st["gpus"]:
        g["mem_used_mib"], g["mem_reserved_mib"] = None, 4
    (lab.root / "var/lib/kpro-lab/state.json").write_text(json.dumps(st))
    env = lab.env()
    code = ("from sglang.srt._kpro_lab import gpustate as g; print(g.free_mib(0)); g.set_usage(0, 1000, 'sglang::scheduler_TP0');"
            "print(g.free_mib(0)); g.release(); print(g.free_mib(0))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(TOTAL - 4), str(TOTAL - 1004), str(TOTAL - 4)]
    assert all(g["mem_used_mib"] is None for g in lab.state()["gpus"])
    # too much for what is free: OutOfMemory, state unchanged
    code = "from sglang.srt._kpro_lab import gpustate as g\ntry:\n g.set_usage(1, %d, 'x')\nexcept g.OutOfMemory as e:\n print('oom', e.free_mib)" % TOTAL
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["oom", str(TOTAL - 4)] and lab.state()["gpus"][1]["processes"] == []
