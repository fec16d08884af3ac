"""Names and paths that become files (issue 30): systemd unit names, the model directory."""

from __future__ import annotations

import os

import pytest

from ansible_collections.kpro.gpu_serving.plugins.module_utils.common import names
from ansible_collections.kpro.gpu_serving.plugins.module_utils.host import pci


@pytest.mark.parametrize("unit", ["sglang.service", "sglang", "sglang-2.service", "a:b_c.d.service", "x" * 247 + ".service"])
def test_plain_service_names_pass(unit):
    assert names.unit_name_problem(unit) is None


@pytest.mark.parametrize("unit", ["../../../tmp/x.service", "a/b.service", "sglang@1.service", "sglang.socket", "",
                                  ".service", "sgl ang.service", "x" * 248 + ".service", "s\nx.service"])
def test_other_unit_names_are_refused_with_phase_and_remedy(unit):
    f = names.unit_name_problem(unit, "sglang_server_unit")
    assert f.phase == "bad_input" and f.msg.startswith("sglang_server_unit %r is not a plain systemd service name" % unit)
    assert "nothing was read or changed" in f.remedy


def test_model_dir_through_a_symlink_or_dotdot_is_refused(tmp_path):
    root = tmp_path / "srv" / "models"
    root.mkdir(parents=True)
    (root / "ok").mkdir()
    os.symlink("/etc", str(root / "etc-link"))
    os.symlink(str(tmp_path), str(root / "out-link"))
    assert names.model_dir_problem(str(root / "ok"), str(root)) is None
    assert names.model_dir_problem(str(root / "new" / "dir"), str(root)) is None  # not there yet: made by the download
    f = names.model_dir_problem(str(root / "etc-link"), str(root))
    assert f.phase == "model_input" and "resolves to /etc, which is the system directory /etc" in f.msg
    assert "point model_dir at a directory under the models' root %s" % root in f.remedy
    f = names.model_dir_problem(str(root / "etc-link" / "kpro"), "")
    assert "resolves to /etc/kpro, under the system directory /etc" in f.msg
    f = names.model_dir_problem(str(root / "out-link" / "m"), str(root))
    assert "outside the models' root %s" % root in f.msg
    f = names.model_dir_problem(str(root) + "/../../etc", str(root))
    assert "contains '..'" in f.msg and f.remedy


@pytest.mark.parametrize("real, sysdir", [("/usr/local/m", "/usr"), ("/lib64/m", "/lib64"), ("/run/m", "/run"),
                                          ("/var/lib/dpkg/x", "/var/lib/dpkg"), ("/", "/"), ("/srv/m", None),
                                          ("/etcetera/m", None), ("/var/lib/models/m", None)])
def test_system_dirs(real, sysdir):
    assert names.system_dir(real) == sysdir


def dev(bdf, pid, cls):
    return {"bdf": bdf, "id": pid, "vendor": pid.split(":")[0], "class": cls, "class_name": pci.class_name(cls)}


def test_gpu_ids_must_name_nvidia_display_or_3d_controllers():
    devices = [dev("0000:01:00.0", "10de:2230", "0x030000"), dev("0000:01:00.1", "10de:1aef", "0x040300"),
               dev("0000:02:00.0", "10de:20b0", "0x030200"), dev("0000:05:00.0", "8086:1533", "0x020000")]
    assert pci.gpu_id_problems(["10de:2230", "10de:20b0"], devices) == []
    out = pci.gpu_id_problems(["8086:1533", "10de:9999", "10de:1aef"], devices)
    assert out[0] == ("8086:1533: vendor 8086 is not NVIDIA's (10de); it is 8086:1533 at 0000:05:00.0 "
                      "(Ethernet controller, class 0200)")
    assert out[1] == "10de:9999: no PCI function of this host has this id (an unknown NVIDIA id)"
    assert out[2].startswith("10de:1aef: it is 10de:1aef at 0000:01:00.1 (Audio device, class 0403), not a display/3D")
    assert out[3] == ("the host's NVIDIA GPUs: 10de:2230 at 0000:01:00.0 (VGA compatible controller, class 0300), "
                      "10de:20b0 at 0000:02:00.0 (3D controller, class 0302)")


def _hf_model(args):
    from ansible_collections.kpro.gpu_serving.plugins.modules import hf_model
    from ansible_collections.kpro.gpu_serving.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module
    try:
        run_module(hf_model, args)
    except (AnsibleExitJson, AnsibleFailJson) as e:
        return e.result
    raise AssertionError("no exit")


def test_hf_model_refuses_before_writing_and_removes_the_token_file(tmp_path):
    root = tmp_path / "models"
    target = tmp_path / "elsewhere"
    root.mkdir()
    target.mkdir()
    os.symlink(str(target), str(root / "link"))
    for extra, words in (({"local_dir": str(root / "link")}, "outside the models' root"),
                         ({"local_dir": str(root / "m"), "deployment_unit": "../../x.service"},
                          "deployment_unit '../../x.service' is not a plain systemd service name")):
        token = tmp_path / "token"
        token.write_text("hf_secret")
        r = _hf_model(dict(dict(repo_id="Qwen/X", revision="0" * 40, root=str(root), token_file=str(token)), **extra))
        assert r["failed"] and words in r["msg"] and "Remedy:" in r["msg"] and r["phase"] in ("model_input", "bad_input")
        assert not token.exists() and os.listdir(str(target)) == [] and sorted(os.listdir(str(root))) == ["link"]
