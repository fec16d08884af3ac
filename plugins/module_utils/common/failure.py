# -*- coding: utf-8 -*-
# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's failure contract: a known failure is a ``phase`` with ``msg``, ``evidence`` and ``remedy``.

This file is the one place of the phase vocabulary (docs/troubleshooting.md lists every phase, and a unit test
keeps the two in step). A module raises ``Failure`` (or an error type derived from it) from its module_utils and
catches it once, in ``main``, with ``fail``: the operator then reads what went wrong, what shows it, and what to
do, never a Python traceback nor Ansible's "An exception occurred during task execution".
"""

from __future__ import annotations

# What a launch of the SGLang server came to (sglang_log's diagnosis, the gate, the service), in the order the
# diagnosis reports them. ``PHASES`` keeps its old name: sglang_log imports it from here.
SERVE_PHASES = (
    ("ready", "the server answered and its smoke test passed"),
    ("loading", "the server is still loading (not a failure while the gate waits)"),
    ("not_started", "the server did not start, or its settings were refused before it started"),
    ("init_failed_before_gpu", "the server failed before it touched a GPU (arguments, imports, configuration): no 'Init torch distributed begin.'"),
    ("host_oom_killed", "a process of the server was SIGKILLed while loading, without an error of its own: the host's or the container's OOM killer"),
    ("weights_oom", "the model weights do not fit in GPU memory (CUDA out of memory while loading them)"),
    ("weights_load_failed", "loading the model failed between 'Load weight begin.' and 'Load weight end.', not for lack of memory"),
    ("kv_cache_oom", "the weights fit but too little memory is left for the KV cache"),
    ("kv_pool_init_failed", "building the KV cache pool or the attention backend failed after the weights loaded, not for lack of memory"),
    ("scheduler_init_failed", "the scheduler's set-up failed after the model, its KV pool and CUDA graphs were ready (not memory, NCCL, a port)"),
    ("nccl_error", "the GPUs could not talk to each other (NCCL)"),
    ("gpu_p2p_hang", "the two-GPU check before the launch did not finish within its timeout: NCCL/P2P hang (ACS, IOMMU)"),
    ("gpu_p2p_wrong_result", "the two-GPU check before the launch got wrong data from the NCCL all-reduce or the GPU-to-GPU copy"),
    ("peer_missing", "a node of a multi-node server never arrived at the distributed init address"),
    ("runtime_toolchain_missing", "the first forward died: the container lacks a compiler, header, nvcc or ninja SGLang compiles with"),
    ("cuda_graph_failed", "capturing CUDA graphs failed"),
    ("port_in_use", "the server's port is taken by another process"),
    ("warmup_failed", "the server came up but its first request failed"),
    ("crashed_after_ready", "the server had been ready or had served requests, then a process of it died"),
    ("degenerate_output", "the server answers with degenerate text"),
    ("wrong_answer", "the server answers readable text, but wrong: a known-answer check at temperature 0 failed"),
    ("gpu_memory_held", "GPU memory is held by another process, or was not released by the old server"),
    ("version_mismatch", "the NVIDIA userspace does not match the host's kernel module"),
    ("known_bad_version", "the SGLang version is refused by the compatibility table"),
    ("unresponsive", "the server's process lives and its port accepts connections, but /health answers nothing (stopped, or hung)"),
    ("timeout", "the server did not become ready in time"),
)

# What the host stages (driver, vfio release, container passthrough, packages, model download) fail on.
HOST_PHASES = (
    ("bad_input", "an option's value is invalid (the message names the option)"),
    ("bad_version", "a version string is not valid (driver version, SGLang version)"),
    ("bad_checksum", "installer_checksum is not a sha256 checksum"),
    ("checksum_mismatch", "the installer's sha256 differs from installer_checksum, or no checksum was given for a download"),
    ("installer_missing", "the NVIDIA installer is neither on the host nor downloadable"),
    ("installer_version", "the installer is of another driver version than the one requested"),
    ("installer_failed", "the download, the NVIDIA installer or the DKMS build failed"),
    ("headers_unavailable", "the kernel headers for the running kernel cannot be installed"),
    ("secure_boot_unsigned_module", "Secure Boot is on and the NVIDIA module would not be signed"),
    ("driver_not_loaded", "the NVIDIA kernel module is not loaded, or its service does not start"),
    ("nvml_unavailable", "NVML cannot be used for another reason (permissions, no devices, library missing)"),
    ("gpu_mismatch", "NVML sees other GPUs (count or name) than expected"),
    ("gpu_in_use", "a VM or another vfio user holds the GPUs; nothing was changed"),
    ("host_config_unreadable", "a host configuration file or a guest's status cannot be read"),
    ("host_write_failed", "writing a host configuration file failed"),
    ("boot_refresh_failed", "update-initramfs or the boot-loader refresh failed (the files are changed; re-run)"),
    ("ct_config_refused", "the container's passthrough cannot be applied as asked (the message says why)"),
    ("ct_locked", "the container is locked by a backup, snapshot or another task; nothing was written"),
    ("device_missing", "a device node to pass does not exist, or its kernel module is not loaded"),
    ("pve_api_error", "the Proxmox VE API refused or failed (connection, credentials, task)"),
    ("packages_unavailable", "a required Debian package cannot be installed from the configured repositories"),
    ("apt_failed", "apt-get failed"),
    ("library_missing", "a Python library the module needs is not installed in the target's Python"),
    ("model_input", "a model download option is invalid, or its patterns select no file"),
    ("model_token", "the Hugging Face token file cannot be read"),
    ("model_locked", "another download into the same directory is still running"),
    ("run_locked", "another run holds the container's lock (run_lock) for longer than the run waits; nothing was changed"),
    ("model_unavailable", "the model repository, revision or files cannot be found or read on the hub"),
    ("model_no_space", "the disk has too little free space for the model"),
    ("model_keep_failed", "the previous model revision could not be hard-linked (kept or restored)"),
    ("download_failed", "some model files failed to download (a re-run resumes them)"),
    ("download_died", "the background download ended without a result"),
    ("boot_kernel_headers_missing", "a kernel that can boot has no headers and they cannot be installed: DKMS cannot build for it"),
    ("dkms_build_failed", "DKMS could not build the NVIDIA module for a kernel that can boot (make.log's end is the evidence)"),
    ("module_unsigned", "Secure Boot is on and the NVIDIA module of a kernel that can boot carries no signature"),
    ("module_wrong_key", "Secure Boot is on and the NVIDIA module is (or would be) signed by another key than the enrolled one"),
    ("signing_key_not_enrolled", "the certificate the modules are signed with is not an enrolled MOK (mokutil --test-key)"),
    ("next_boot_module_missing", "the kernel the next boot starts has no NVIDIA module of the requested version"),
    ("device_nodes_unit_not_ready", "the device-node unit is missing, not enabled, or not ordered before pve-guests.service"),
    ("ct_passthrough_unresolvable", "a devN entry of the GPU container names a node nothing creates at boot"),
    ("guest_takes_gpus_at_boot", "a VM with onboot 1 references a GPU function: at boot it takes the GPUs to vfio-pci"),
    # not a launch's diagnosis (sglang_log never gives it): the serve stage's rollback (sglang_deployment)
    ("rollback_failed", "a changed deployment failed its gate and the recorded previous one, restored, failed too"),
)

# What a verify run (gpu_verify) finds beyond the phases above (version_mismatch, gpu_memory_held, unresponsive,
# wrong_answer...): drift from the recorded deployment and silent degradation of the GPUs.
VERIFY_PHASES = (
    ("deployment_drift", "the venv, the unit or the driver differs from the deployment that passed the gate, or none is recorded"),
    ("model_files_changed", "a model file is missing or differs in size (or hash) from the pinned revision's listing"),
    ("gpu_xid_error", "the kernel log has NVRM Xid lines: the driver reported a GPU error"),
    ("gpu_ecc_errors", "NVML counts uncorrected ECC errors on a GPU"),
    ("gpu_throttled", "a GPU is slowed down by heat or power (NVML throttle reasons), or is hotter than the limit"),
    ("slow_response", "one short completion took longer than the limit, or failed"),
    ("kernel_module_missing", "a kernel that can boot (not the next boot's: next_boot_module_missing) has no NVIDIA module"),
    ("nvidia_apt_userspace", "apt packages of NVIDIA userspace are installed where the .run installer put it: an upgrade replaces it"),
)

# Named differently since 0.1.0: failures the old names also covered, now named by where the start stopped and what
# the evidence shows. For one release a renamed failure's ``former_phase`` (in the result and in facts) still carries
# its 0.1.0 name, an alias that stays in the vocabulary with its own narrower meaning (docs/troubleshooting.md,
# "Renamed phases").
FORMER_PHASES = {
    "host_oom_killed": "weights_oom",
    "weights_load_failed": "init_failed_before_gpu",   # weights_oom when it died without an error and without a SIGKILL
    "kv_pool_init_failed": "init_failed_before_gpu",
    "scheduler_init_failed": "init_failed_before_gpu",
    "crashed_after_ready": "warmup_failed",
}

PHASES = tuple(name for name, _meaning in SERVE_PHASES)
# Phases after which nothing more will happen for this launch.
TERMINAL_PHASES = frozenset(p for p in PHASES if p not in ("loading",))
# The whole vocabulary: phase -> its one-line meaning.
VOCABULARY = dict(SERVE_PHASES + HOST_PHASES + VERIFY_PHASES)
ALL_PHASES = PHASES + tuple(name for name, _meaning in HOST_PHASES + VERIFY_PHASES)


class Failure(Exception):
    """A known failure. ``phase``: a name from VOCABULARY; ``evidence``: what shows it; ``remedy``: what to do.

    ``details``: more return values of the failed module (``rc``, ``refusals``...)."""

    def __init__(self, phase, msg, remedy="", evidence=None, **details):
        # a phase outside VOCABULARY is not refused here (that would be a traceback): test_failure.py finds every
        # phase named in plugins/ and requires it in VOCABULARY and docs/troubleshooting.md
        super().__init__(msg)
        self.phase, self.msg, self.remedy = phase, msg, remedy
        self.evidence = evidence if evidence is not None else []
        self.details = details

    def data(self):
        """The failure as data: what a module result carries in ``known_failure`` and ``from_result`` reads back."""
        return {"phase": self.phase, "msg": self.msg, "evidence": list(self.evidence), "remedy": self.remedy}

    def result(self):
        out = dict(self.details)
        out.update(phase=self.phase, msg="%s: %s" % (self.phase, self.msg), evidence=self.evidence, remedy=self.remedy,
                   known_failure=self.data())
        return out

    @classmethod
    def from_result(cls, result, **details):
        """The Failure a failed module's result carries (its ``known_failure``), never parsed back out of its ``msg``; a
        result without one (a task that failed some other way) keeps its msg as it is."""
        data = result.get("known_failure") if isinstance(result.get("known_failure"), dict) else {}
        return cls(data.get("phase") or result.get("phase") or "not_started", data.get("msg") or result.get("msg") or "failed",
                   remedy=data.get("remedy", result.get("remedy")) or "", evidence=list(data.get("evidence", result.get("evidence")) or []),
                   **details)

    def message(self):
        """The failed task's msg, as fail() reports it: the phase, the message, then the remedy."""
        return "%s: %s%s" % (self.phase, self.msg, " Remedy: " + self.remedy if self.remedy else "")


class PhasedError(Failure):
    """Base of the module_utils error types that carry a message first (``raise XError(msg)``) and a default phase."""

    PHASE = "bad_input"

    def __init__(self, msg, phase=None, remedy="", evidence=None, **details):
        super().__init__(phase or self.PHASE, msg, remedy, evidence, **details)


def fail(module, failure, **result):
    """Fail the module with ``failure`` (plus whatever the module had to report)."""
    result.update(failure.result(), msg=failure.message())
    module.fail_json(**result)
