# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify run's checks (verify.py, verify_state.py) and its textfile (metrics_textfile.py), parsed back with the
Prometheus client library's own parser."""

from __future__ import annotations

import json
import os

from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import metrics_textfile as mt
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify as v
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_gather as g
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import verify_state as vs

KM = "580.126.09"


def phases(findings):
    return [(f["check"], f["phase"], f["severity"]) for f in findings]


def test_driver_matching_userspace_and_module_finds_nothing():
    assert v.driver(KM, KM, None, KM) == []


def test_phase_version_mismatch_and_deployment_drift_of_the_driver():
    out = v.driver(KM, "580.142", "version_mismatch", "580.142")
    assert phases(out) == [("driver", "version_mismatch", "error"), ("driver", "deployment_drift", "error")]
    assert "kernel module: 580.126.09 (/proc/driver/nvidia/version)" in out[0]["evidence"]
    assert "userspace: libnvidia-ml 580.142" in out[0]["evidence"] and "580.126.09" in out[0]["remedy"]


def test_no_module_is_driver_not_loaded():
    assert phases(v.driver(None, KM)) == [("driver", "driver_not_loaded", "error")]


def holder(pid, ours=False, used=1024, gpu=0):
    return {"gpu": gpu, "pid": pid, "name": "python3", "used_mib": used, "ours": ours, "visible": True, "cmdline": "python3 -c x"}


def test_memory_of_a_stranger_is_gpu_memory_held_and_the_units_own_is_not():
    assert v.memory([holder(10, ours=True)], [10]) == []
    out = v.memory([holder(10, ours=True), holder(99)], [10], [23000, 22000])
    assert phases(out) == [("memory", "gpu_memory_held", "error")]
    assert "PID 99 python3 holds 1024 MiB on GPU 0" in out[0]["evidence"] and "PID 99 python3" in out[0]["remedy"]


def test_memory_that_nvml_cannot_show_is_a_warning_not_silence():
    out = v.memory([], [], None, "the Python NVML bindings (nvidia-ml-py, module pynvml) are not installed")
    assert phases(out) == [("memory", "nvml_unavailable", "warning")] and "nvidia-ml-py" in out[0]["evidence"][0]


def test_phase_gpu_xid_error_from_the_kernel_log():
    log = ["2026-12-05T10:00:00 kpro5 kernel: NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
           "2026-12-05T10:00:01 kpro5 kernel: nvidia 0000:17:00.0: something else"]
    out = v.health([], log)
    assert phases(out) == [("health", "gpu_xid_error", "error")]
    assert out[0]["evidence"] == ["Xid 79 on 0000:17:00: pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]


def test_phase_gpu_ecc_errors_and_gpu_throttled():
    gpus = [{"index": 0, "temperature_c": 46, "throttle_reasons": 0x1, "ecc_uncorrected": 0},   # idle: no finding
            {"index": 1, "temperature_c": 91, "throttle_reasons": 0x40 | 0x4, "ecc_uncorrected": 2}]
    out = v.health(gpus, [])
    assert phases(out) == [("health", "gpu_ecc_errors", "error"), ("health", "gpu_throttled", "warning")]
    assert out[1]["evidence"] == ["GPU 1: 91 C (limit 85 C)", "GPU 1: clocks throttled by HwThermalSlowdown (reasons 0x44)"]
    assert v.health([{"index": 0, "temperature_c": None, "throttle_reasons": None, "ecc_uncorrected": None}]) == []


GOOD = {"lock_sha256": "a" * 64, "sglang_version": "0.5.11", "model_revision": "c" * 40, "service": {"venv": "/opt/sglang"}}


def test_phase_deployment_drift_of_the_venv_and_the_unit():
    same = {"venv": "/opt/sglang", "lock_sha256": "a" * 64, "sglang_version": "0.5.11"}
    assert vs.deployment(GOOD, same, {"fingerprint": "f1"}, "f1") == []
    out = vs.deployment(GOOD, dict(same, lock_sha256="b" * 64), {"fingerprint": "f1"}, "f2")
    assert phases(out) == [("deployment", "deployment_drift", "error")]
    assert out[0]["evidence"][0] == "venv /opt/sglang: lock bbbbbbbbbbbb, the record's aaaaaaaaaaaa"
    assert "changed since the server was launched" in out[0]["evidence"][1]
    assert phases(vs.deployment(None, {}, None, "f")) == [("deployment", "deployment_drift", "warning")]


def test_phase_model_files_changed_by_size_and_by_hash(tmp_path):
    listing = [{"path": "model-00001.safetensors", "size": 8, "sha256": "d" * 64}, {"path": "config.json", "size": 2, "oid": "e" * 40}]
    assert vs.model(listing, {"model-00001.safetensors": 8, "config.json": 2}) == []
    out = vs.model(listing, {"model-00001.safetensors": 5, "config.json": None})
    assert phases(out) == [("model", "model_files_changed", "error")]
    assert out[0]["evidence"] == ["model-00001.safetensors: 5 bytes, the revision's 8 bytes", "config.json: missing, the revision's 2 bytes"]
    out = vs.model(listing, {"model-00001.safetensors": 8, "config.json": 2}, {"model-00001.safetensors": ("sha256", "0" * 64)})
    assert out[0]["evidence"] == ["model-00001.safetensors: sha256 000000000000, the revision's dddddddddddd"]


def test_model_files_are_read_against_the_kept_listing(tmp_path):
    rev = "6f3a9c1e2b7d4085a1c9e3f7b2d6a4c8e0f1b3d5"
    trees = tmp_path / ".cache" / "kpro-hf" / "trees"
    trees.mkdir(parents=True)
    data = b"12345678"
    import hashlib
    files = [{"path": "w.safetensors", "size": 8, "sha256": hashlib.sha256(data).hexdigest()}]
    (trees / ("org--m--%s.json" % rev)).write_text(json.dumps({"repo_id": "org/m", "commit": rev, "files": files}))
    (tmp_path / "w.safetensors").write_bytes(data)
    listing, sizes, hashes = g.model_files(str(tmp_path), rev, True)
    assert vs.model(listing, sizes, hashes) == [] and hashes["w.safetensors"][0] == "sha256"
    (tmp_path / "w.safetensors").write_bytes(b"1234567X")   # same size, other content: only the hash sees it
    assert phases(vs.model(*g.model_files(str(tmp_path), rev, True))) == [("model", "model_files_changed", "error")]
    assert vs.model(*g.model_files(str(tmp_path), rev, False)) == []
    assert phases(vs.model(*g.model_files(str(tmp_path), "f" * 40, False))) == [("model", "model_files_changed", "warning")]


def test_phase_slow_response_and_the_live_server():
    passed = {"passed": True, "checks": []}
    assert vs.live(200, passed, 0.2, 10) == []
    assert phases(vs.live(None, None, None, 10)) == [("live", "unresponsive", "error")]
    assert phases(vs.live(200, passed, 12.5, 10)) == [("live", "slow_response", "warning")]
    wrong = {"passed": False, "checks": [{"name": "arithmetic", "ok": False, "kind": "wrong", "endpoint": "/v1/completions", "why": "12441",
                                          "prompt": "4823 + 7619", "expected": "12442", "received": "12441", "mean_logprob": None}]}
    out = vs.live(200, wrong, 0.2, 10)
    assert phases(out) == [("live", "wrong_answer", "error")] and "known-answer check 'arithmetic' failed" in out[0]["evidence"][0]


def test_ok_is_false_only_for_errors():
    warn = v.finding("live", "slow_response", ["x"], "r", "warning")
    assert v.ok([warn]) and not v.ok([warn, v.finding("memory", "gpu_memory_held", ["y"], "r")])


def families(text):
    return dict((f.name, f) for f in text_string_to_metric_families(text))


def test_the_textfile_parses_with_names_labels_and_values():
    findings = v.memory([holder(99)], []) + v.health([{"index": 1, "temperature_c": 91, "throttle_reasons": 0, "ecc_uncorrected": 0}])
    text = mt.render("ct129", findings, {"verify_ok": False, "verify_timestamp_seconds": 1764930000.25, "verify_findings": 2,
                                         "known_answer_ok": True, "request_latency_seconds": 0.412})
    fams = families(text)
    assert sorted(fams) == sorted("kpro_gpu_serving_" + n for n in ("verify_ok", "verify_timestamp_seconds", "verify_findings",
                                                                    "known_answer_ok", "request_latency_seconds", "verify_finding"))
    assert fams["kpro_gpu_serving_verify_ok"].samples[0].value == 0 and fams["kpro_gpu_serving_verify_ok"].type == "gauge"
    assert fams["kpro_gpu_serving_verify_timestamp_seconds"].samples[0].value == 1764930000.25
    assert fams["kpro_gpu_serving_request_latency_seconds"].samples[0].labels == {"host": "ct129"}
    found = [(s.labels, s.value) for s in fams["kpro_gpu_serving_verify_finding"].samples]
    assert found == [({"host": "ct129", "check": "health", "phase": "gpu_throttled", "severity": "warning"}, 1.0),
                     ({"host": "ct129", "check": "memory", "phase": "gpu_memory_held", "severity": "error"}, 1.0)]


def test_a_clean_run_has_no_finding_samples_and_unasked_gauges_are_left_out():
    fams = families(mt.render("kpro5", [], {"verify_ok": True, "verify_timestamp_seconds": 1.0, "verify_findings": 0,
                                            "known_answer_ok": None, "request_latency_seconds": None}))
    assert sorted(fams) == ["kpro_gpu_serving_verify_findings", "kpro_gpu_serving_verify_ok", "kpro_gpu_serving_verify_timestamp_seconds"]
    assert fams["kpro_gpu_serving_verify_ok"].samples[0].value == 1


def test_a_label_value_with_quote_backslash_and_newline_survives():
    odd = 'ct"1\\2\nx'
    fams = families(mt.render(odd, [v.finding("model", "model_files_changed", ["e"], "r")], {"verify_ok": False}))
    assert fams["kpro_gpu_serving_verify_ok"].samples[0].labels["host"] == odd
    assert fams["kpro_gpu_serving_verify_finding"].samples[0].labels["host"] == odd


def test_the_textfile_is_replaced_whole_in_its_own_directory(tmp_path):
    path = str(tmp_path / "node-exporter" / "kpro_gpu_serving.prom")
    mt.write(path, "a 1\n")
    mt.write(path, "b 2\n")
    assert open(path).read() == "b 2\n" and os.listdir(os.path.dirname(path)) == ["kpro_gpu_serving.prom"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_health_without_pynvml_reads_nvidia_smi():
    # nvidia-smi --query-gpu=index,temperature.gpu,clocks_throttle_reasons.active,ecc.errors.uncorrected.volatile.total
    # --format=csv,noheader,nounits: the mask in hex, "[N/A]" where ECC is off (a consumer GPU)
    ran = []

    def run(argv):
        ran.append(argv)
        return 0, "0, 46, 0x0000000000000001, [N/A]\n1, 91, 0x0000000000000040, 2\n", ""
    gpus = g.smi_health(run, "/usr/bin/nvidia-smi")
    assert ran == [["/usr/bin/nvidia-smi"] + g.SMI_HEALTH_ARGS]
    assert gpus == [{"index": 0, "temperature_c": 46, "throttle_reasons": 1, "ecc_uncorrected": None},
                    {"index": 1, "temperature_c": 91, "throttle_reasons": 0x40, "ecc_uncorrected": 2}]
    assert [(f["phase"], f["evidence"][0]) for f in v.health(gpus)] == [
        ("gpu_ecc_errors", "GPU 1: 2 uncorrected ECC errors (volatile, since the driver loaded)"), ("gpu_throttled", "GPU 1: 91 C (limit 85 C)")]
    assert g.smi_health(lambda argv: (9, "", "NVIDIA-SMI has failed"), "/usr/bin/nvidia-smi") == []
    assert g.smi_health(run, None) == []
