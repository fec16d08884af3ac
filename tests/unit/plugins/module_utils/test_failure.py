# Copyright: kpro.gpu_serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The failure contract: one vocabulary (failure.py), listed in docs/troubleshooting.md, each phase produced by a test."""

from __future__ import annotations

import os
import re

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import failure
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import sglang_log

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
UNIT = os.path.join(REPO, "tests", "unit")
SGLANG_LOGS = os.path.join(UNIT, "fixtures", "sglang_logs")
M, U = "plugins/modules/", "plugins/module_utils/"

# phase -> the test that produces it (tests/unit/<file>::<function>)
PHASE_TESTS = {
    "ready": U + "test_sglang_log.py::test_ready_needs_the_weights_on_every_gpu",
    "loading": U + "test_sglang_log.py::test_not_started_and_just_started",
    "not_started": U + "test_sglang_log.py::test_not_started_and_just_started",
    "init_failed_before_gpu": U + "test_sglang_log.py::test_init_failed_before_gpu_gives_this_launchs_exception",
    "weights_oom": U + "test_sglang_log.py::test_weights_oom_names_other_processes",
    "host_oom_killed": U + "test_sglang_log.py::test_scheduler_killed_names_the_host_oom_killer",
    "weights_load_failed": U + "test_sglang_log.py::test_a_traceback_in_model_loading_is_weights_oom_only_with_oom_evidence",
    "kv_pool_init_failed": U + "test_sglang_log.py::test_an_assertion_while_building_the_kv_pool_is_not_an_oom",
    "scheduler_init_failed": U + "test_sglang_log.py::test_a_failure_is_named_by_where_the_start_stopped",
    "kv_cache_oom": U + "test_sglang_log.py::test_seed_kv_cache_oom_remedy_has_numbers_and_flags",
    "nccl_error": U + "test_sglang_log.py::test_nccl_remedy_and_p2p",
    "gpu_p2p_hang": U + "test_gpu_p2p.py::test_a_check_cut_off_by_its_timeout_is_gpu_p2p_hang_with_how_far_it_got",
    "gpu_p2p_wrong_result": U + "test_gpu_p2p.py::test_wrong_sums_and_zeros_copied_are_gpu_p2p_wrong_result",
    "peer_missing": U + "test_sglang_log.py::test_peer_missing_on_rank0_and_on_a_follower",
    "cuda_graph_failed": U + "test_sglang_log.py::test_any_failure_after_graph_capture_began_is_cuda_graph_failed",
    "runtime_toolchain_missing": U + "test_sglang_log_toolchain.py::test_capture_wrapper_is_not_cuda_graph_failed",
    "port_in_use": U + "test_sglang_log.py::test_port_in_use_after_full_load_in_sglang_format",
    "warmup_failed": U + "test_sglang_log.py::test_fixture_gets_its_expected_phase",
    "crashed_after_ready": U + "test_sglang_log_crashes.py::test_a_crash_after_serving_began",
    "degenerate_output": U + "test_sglang_log.py::test_degenerate_smoke_output_names_speculative_decoding",
    "wrong_answer": U + "test_known_answer.py::test_failure_names_phase_prompt_expected_received_and_suspects",
    "gpu_memory_held": U + "test_sglang_log.py::test_pre_launch_phases",
    "version_mismatch": U + "test_nvidia_host.py::test_verify_names_why_nvml_is_not_right",
    "known_bad_version": M + "test_sglang_compat.py::test_failures_name_their_phase",
    "unresponsive": U + "test_sglang_ready_unresponsive.py::test_a_stopped_server_is_unresponsive_with_its_process_state",
    "timeout": U + "test_sglang_log.py::test_timeout_slow_load_vs_hang",
    "rollback_failed": U + "test_deployment.py::test_rolled_back_names_the_new_diagnosis_and_what_serves_again",
    "bad_input": M + "test_vfio_release.py::test_phase_bad_input_for_ids_that_are_not_pci_ids",
    "bad_version": M + "test_sglang_compat.py::test_failures_name_their_phase",
    "bad_checksum": M + "test_nvidia_driver.py::test_phase_of_an_installer_failure",
    "checksum_mismatch": M + "test_nvidia_driver.py::test_phase_of_an_installer_failure",
    "installer_missing": M + "test_nvidia_driver.py::test_phase_of_an_installer_failure",
    "installer_version": M + "test_nvidia_driver.py::test_phase_of_an_installer_failure",
    "installer_failed": U + "test_nvidia_host.py::test_phase_installer_failed",
    "headers_unavailable": U + "test_nvidia_host.py::test_phase_headers_unavailable_without_install_headers",
    "secure_boot_unsigned_module": U + "test_nvidia_host.py::test_phase_secure_boot_unsigned_module",
    "driver_not_loaded": U + "test_nvidia_host.py::test_verify_names_why_nvml_is_not_right",
    "nvml_unavailable": U + "test_nvidia_host.py::test_verify_names_why_nvml_is_not_right",
    "gpu_mismatch": U + "test_nvidia_host.py::test_phase_gpu_mismatch",
    "gpu_in_use": M + "test_vfio_release.py::test_phase_gpu_in_use_lists_each_refusal_as_evidence",
    "host_config_unreadable": M + "test_vfio_release.py::test_phase_host_config_unreadable_when_the_pci_mappings_cannot_be_read",
    "host_write_failed": M + "test_vfio_release.py::test_phase_host_write_failed",
    "boot_refresh_failed": M + "test_vfio_release.py::test_phase_boot_refresh_failed_keeps_rc_and_output",
    "ct_config_refused": M + "test_lxc_gpu_passthrough.py::test_each_known_failure_names_its_phase",
    "ct_locked": M + "test_lxc_gpu_passthrough.py::test_each_known_failure_names_its_phase",
    "device_missing": M + "test_lxc_gpu_passthrough.py::test_each_known_failure_names_its_phase",
    "pve_api_error": M + "test_lxc_gpu_passthrough.py::test_each_known_failure_names_its_phase",
    "packages_unavailable": M + "test_deb_packages.py::test_unavailable_after_refresh_fails_before_installing_with_the_repository",
    "apt_failed": U + "test_debpkg.py::test_apt_failed_keeps_the_end_of_apts_output",
    "library_missing": M + "test_hf_model.py::test_phases_of_a_download",
    "model_input": M + "test_hf_model.py::test_token_file_consumed_and_bad_local_dir_refused",
    "model_token": U + "test_hf.py::test_token_file_read_and_removed",
    "model_locked": U + "test_hf.py::test_dir_lock_one_holder_named_and_released",
    "run_locked": U + "test_run_lock.py::test_a_second_run_waits_then_fails_naming_the_holder",
    "model_unavailable": M + "test_hf_model.py::test_phases_of_a_download",
    "model_no_space": M + "test_hf_model.py::test_phases_of_a_download",
    "model_keep_failed": U + "test_model_revisions.py::test_a_refused_hard_link_is_a_named_failure_and_leaves_no_partial_kept_dir",
    "download_failed": M + "test_hf_model.py::test_phases_of_a_download",
    "download_died": M + "test_hf_model.py::test_watch_mode_result_running_and_died",
    "boot_kernel_headers_missing": U + "test_driver_kernels.py::test_phase_boot_kernel_headers_missing_names_kernel_and_package",
    "dkms_build_failed": U + "test_driver_kernels.py::test_phase_dkms_build_failed_keeps_the_make_log_tail",
    "module_unsigned": U + "test_module_signing.py::test_phases_module_unsigned_and_module_wrong_key",
    "module_wrong_key": U + "test_module_signing.py::test_phases_module_unsigned_and_module_wrong_key",
    "signing_key_not_enrolled": U + "test_reboot_check.py::test_phase_signing_key_not_enrolled_and_dkms_own_key_named",
    "next_boot_module_missing": U + "test_reboot_check.py::test_phase_next_boot_module_missing_names_kernel_and_headers_package",
    "device_nodes_unit_not_ready": U + "test_reboot_check.py::test_phase_device_nodes_unit_not_ready",
    "ct_passthrough_unresolvable": U + "test_reboot_check.py::test_phase_ct_passthrough_unresolvable",
    "guest_takes_gpus_at_boot": U + "test_reboot_check.py::test_phase_guest_takes_gpus_at_boot",
    "deployment_drift": U + "test_verify.py::test_phase_deployment_drift_of_the_venv_and_the_unit",
    "model_files_changed": U + "test_verify.py::test_phase_model_files_changed_by_size_and_by_hash",
    "gpu_xid_error": U + "test_verify.py::test_phase_gpu_xid_error_from_the_kernel_log",
    "gpu_ecc_errors": U + "test_verify.py::test_phase_gpu_ecc_errors_and_gpu_throttled",
    "gpu_throttled": U + "test_verify.py::test_phase_gpu_ecc_errors_and_gpu_throttled",
    "slow_response": U + "test_verify.py::test_phase_slow_response_and_the_live_server",
    "kernel_module_missing": U + "test_verify_upgrade.py::test_phase_kernel_module_missing_and_next_boot_module_missing",
    "nvidia_apt_userspace": U + "test_verify_upgrade.py::test_phase_nvidia_apt_userspace_only_where_the_installer_put_it",
}


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_the_vocabulary_has_one_meaning_per_phase_and_no_duplicates():
    assert len(failure.ALL_PHASES) == len(set(failure.ALL_PHASES)) == len(failure.VOCABULARY)
    assert all(meaning and "\n" not in meaning for meaning in failure.VOCABULARY.values())
    assert sglang_log.PHASES is failure.PHASES and sglang_log.TERMINAL_PHASES is failure.TERMINAL_PHASES


def test_every_phase_is_in_the_troubleshooting_guide():
    doc = _read(os.path.join(REPO, "docs", "troubleshooting.md"))
    missing = [p for p in failure.ALL_PHASES if not re.search(r"`%s`" % re.escape(p), doc)]
    assert missing == [], "add these phases to docs/troubleshooting.md: %s" % missing


def test_every_phase_has_a_test_that_produces_it():
    assert sorted(PHASE_TESTS) == sorted(failure.ALL_PHASES)
    fixtures = "".join(_read(os.path.join(SGLANG_LOGS, f)) for f in os.listdir(SGLANG_LOGS) if f.endswith(".log"))
    for phase, test_id in sorted(PHASE_TESTS.items()):
        path, func = test_id.split("::")
        text = _read(os.path.join(UNIT, path))
        assert re.search(r"^def %s\(" % func, text, re.M), "%s: no test %s" % (phase, test_id)
        # the test file asserts this phase by name (or, for the log fixtures, a fixture expects it)
        assert '"%s"' % phase in text or "# expected_phase: %s" % phase in fixtures, "%s: %s never names it" % (phase, test_id)


# Failure("<phase>", ...), XError(..., phase="<phase>"), kind/phase literals handed to a failure
_PHASE_LITERALS = (re.compile(r'\bFailure\(\s*"([a-z_]+)"'), re.compile(r'\bphase="([a-z_]+)"'), re.compile(r'self\.fail\(\s*"([a-z_]+)"'),
                   re.compile(r'PHASE = "([a-z_]+)"'), re.compile(r'InstallerError\(\s*"([a-z_]+)"'), re.compile(r'phase = "([a-z_]+)"'))


def _py_files(base):
    """(path relative to ``base``, path) of every .py file under ``base``, its groups' folders included."""
    out = []
    for dirpath, _dirs, names in os.walk(base):
        out += [(os.path.relpath(os.path.join(dirpath, n), base), os.path.join(dirpath, n)) for n in names if n.endswith(".py")]
    return sorted(out)


def test_every_phase_named_in_the_plugins_is_in_the_vocabulary():
    found = {}
    for folder in ("modules", "module_utils"):
        for name, path in _py_files(os.path.join(REPO, "plugins", folder)):
            text = _read(path)
            for rx in _PHASE_LITERALS:
                for phase in rx.findall(text):
                    found.setdefault(phase, "%s/%s" % (folder, name))
    unknown = dict((p, where) for p, where in found.items() if p not in failure.VOCABULARY)
    assert len(found) > 30 and unknown == {}, "add these phases to failure.py: %s" % unknown


def test_fail_gives_phase_msg_evidence_remedy_and_details():
    seen = {}

    class Module(object):
        def fail_json(self, **kw):
            seen.update(kw)
    failure.fail(Module(), failure.Failure("gpu_in_use", "held", remedy="stop it", evidence=["VM 1"], refusals=["VM 1"]), changed=False)
    assert seen == {"changed": False, "phase": "gpu_in_use", "msg": "gpu_in_use: held Remedy: stop it", "evidence": ["VM 1"],
                    "remedy": "stop it", "refusals": ["VM 1"],
                    "known_failure": {"phase": "gpu_in_use", "msg": "held", "evidence": ["VM 1"], "remedy": "stop it"}}


def test_a_failure_read_back_from_a_result_is_its_data_not_its_text():
    f = failure.Failure("weights_load_failed", "launch x: failed. Remedy: not this", remedy="check the checkpoint", evidence=["KeyError: w"])
    back = failure.Failure.from_result(f.result(), rolled_back=False)
    # the msg is the one it was raised with, even when it holds the words the text form joins with
    assert back.data() == f.data() and back.details == {"rolled_back": False}
    assert back.message() == f.message()
    # a task that failed without one: its phase and msg as they are, never parsed
    other = failure.Failure.from_result({"msg": "weights_oom: x Remedy: y", "phase": "weights_oom"})
    assert (other.phase, other.msg, other.remedy, other.evidence) == ("weights_oom", "weights_oom: x Remedy: y", "", [])


def test_renamed_phases_keep_their_former_name_for_one_release():
    doc = _read(os.path.join(REPO, "docs", "troubleshooting.md"))
    renamed = doc.split("## Renamed phases", 1)[1].split("\n## ", 1)[0]
    for new, old in failure.FORMER_PHASES.items():
        # both names stay in the vocabulary; the guide's table names the pair
        assert new in failure.PHASES and old in failure.PHASES
        assert re.search(r"`%s`.*`%s`" % (old, new), renamed), (old, new)


def _calls(path, names):
    """(function, callee) of every call to ``names`` (module.exit_json, fail(...), sys.exit) in a file; strings (a script
    run in a child process) are not calls."""
    import ast
    found = []
    for fn in [n for n in ast.walk(ast.parse(_read(path))) if isinstance(n, ast.FunctionDef)]:
        for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
            callee = getattr(call.func, "attr", None) or getattr(call.func, "id", None)
            if callee in names and not (callee == "exit" and getattr(call.func.value, "id", None) != "sys"):
                found.append((fn.name, callee))
    return found


def test_only_a_modules_main_ends_the_module_and_fails_once():
    utils = os.path.join(REPO, "plugins", "module_utils")
    ending = dict((name, _calls(path, ("exit_json", "fail_json", "exit"))) for name, path in _py_files(utils))
    # failure.fail is how a main fails (it calls fail_json); nothing else in module_utils ends the module
    assert dict((k, v) for k, v in ending.items() if v) == {"common/failure.py": [("fail", "fail_json")]}
    modules = os.path.join(REPO, "plugins", "modules")
    for name in sorted(os.listdir(modules)):
        if name.endswith(".py"):
            fails = _calls(os.path.join(modules, name), ("fail_json", "fail", "failure_fail"))
            assert [f for f, _c in fails] in ([], ["main"]), (name, fails)


def test_error_types_of_module_utils_are_failures_with_a_phase():
    from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import lxc_config, nvidia_installer, proxmox_api, pve_guests
    assert lxc_config.LxcConfigError("x").phase == "ct_config_refused"
    assert lxc_config.LxcConfigError("x", phase="ct_locked").phase == "ct_locked"
    assert proxmox_api.ProxmoxTaskError("x", status="stopped").phase == "pve_api_error"
    assert pve_guests.GuestError("x").phase == "host_config_unreadable"
    assert nvidia_installer.InstallerError("bad_version", "x").phase == "bad_version"
