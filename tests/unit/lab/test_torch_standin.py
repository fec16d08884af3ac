"""The PyTorch stand-in (tests/lab/torch_standin): the API the two-GPU check uses, the lab's GPUs, the drills, the wheel.

No root and no lab needed: a temporary KPRO_LAB_ROOT holds a state.json with two RTX A6000 (the SGLang stand-in's
state, read through the SGLang stand-in as the server stand-in reads it). The check's own script
(module_utils/serve/gpu_p2p.py SCRIPT) runs against it in a child process, as the module runs it in the SGLang venv.
"""

import hashlib
import json
import os
import sys
import zipfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
STANDIN = os.path.join(REPO, "tests", "lab", "torch_standin")
SGLANG_STANDIN = os.path.join(REPO, "tests", "lab", "sglang_standin")
UUIDS = ["GPU-5c1b9f2e-7d3a-4e61-9a0b-2f4c8d1e6a01", "GPU-8e2d4a6c-1b3f-4c5d-8e7f-9a0b1c2d3e02"]

for _d in (SGLANG_STANDIN, STANDIN):
    if _d not in sys.path:
        sys.path.insert(0, _d)

import torch  # noqa: E402
import torch.cuda.nccl  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.serve import gpu_p2p as gp  # noqa: E402
from ansible_collections.kpro.gpu_serving.plugins.module_utils.common.failure import Failure  # noqa: E402


@pytest.fixture
def lab(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "var/lib/kpro-lab").mkdir(parents=True)
    gpus = [{"bdf": "0000:%02x:00.0" % b, "name": "NVIDIA RTX A6000", "uuid": UUIDS[i], "mem_total_mib": 49140,
             "mem_reserved_mib": 300, "mem_used_mib": 300, "processes": []} for i, b in enumerate((0x41, 0x61))]
    (root / "var/lib/kpro-lab/state.json").write_text(json.dumps({"gpus": gpus}))
    monkeypatch.setenv("KPRO_LAB_ROOT", str(root))
    for var in ("CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE", "KPRO_LAB_SGLANG_DRILL"):
        monkeypatch.delenv(var, raising=False)
    return root


def _state(root, **extra):
    path = root / "var/lib/kpro-lab/state.json"
    st = json.loads(path.read_text())
    st.update(extra)
    path.write_text(json.dumps(st))


def test_the_gpus_are_the_labs_as_cuda_sees_them(lab, monkeypatch):
    assert torch.__version__ == "2.11.0" and torch._kpro_lab_standin
    assert torch.cuda.is_available() and torch.cuda.device_count() == 2
    assert torch.cuda.get_device_name(1) == "NVIDIA RTX A6000"
    assert torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)
    assert not torch.cuda.can_device_access_peer(1, 1)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.can_device_access_peer(0, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert torch.cuda.device_count() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", UUIDS[1][:12] + "," + UUIDS[0])
    assert torch.cuda.device_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert torch.cuda.device_count() == 0 and not torch.cuda.is_available()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # as the SGLang stand-in: only GPUs bound to nvidia with its module loaded
    _state(lab, modules={"loaded": ["nvidia"]}, pci={"devices": {"0000:41:00.0": {"driver": "nvidia"}, "0000:61:00.0": {"driver": "vfio-pci"}}})
    assert torch.cuda.device_count() == 1
    _state(lab, modules={"loaded": []})
    assert torch.cuda.device_count() == 0


def test_tensors_copy_and_all_reduce(lab):
    a = torch.full((4,), 1.0, dtype=torch.float32, device="cuda:0")
    b = torch.full((4,), 2.0, dtype=torch.float32, device="cuda:1")
    assert a.is_cuda and a.get_device() == 0 and a.to("cuda:1").get_device() == 1 and a.cpu().get_device() == -1
    assert a.to("cuda:1").cpu().tolist() == [1.0] * 4 and a.cpu().to("cuda:1").tolist() == [1.0] * 4
    torch.cuda.nccl.all_reduce([a, b])
    assert a.cpu().tolist() == b.cpu().tolist() == [3.0] * 4
    with pytest.raises(TypeError, match="collection of tensors"):
        torch.cuda.nccl.all_reduce(a)
    with pytest.raises(RuntimeError, match="one tensor of the same size per GPU"):
        torch.cuda.nccl.all_reduce([a, torch.full((4,), 1.0, device="cuda:0")])
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.full((4,), 1.0, device="cuda:2")
    torch.cuda.synchronize(1)


def test_p2p_wrong_sum_loses_the_peers_writes_unless_nccl_goes_through_host_memory(lab, monkeypatch):
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "p2p_wrong_sum")
    a = torch.full((4,), 1.0, device="cuda:0")
    b = torch.full((4,), 2.0, device="cuda:1")
    assert a.to("cuda:1").tolist() == [0.0] * 4          # the direct copy (CUDA P2P) reads zeros
    assert a.cpu().to("cuda:1").tolist() == [1.0] * 4    # through host memory it arrives
    torch.cuda.nccl.all_reduce([a, b])
    assert a.tolist() == [1.0] * 4 and b.tolist() == [2.0] * 4   # each GPU its own part only
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    torch.cuda.nccl.all_reduce([a, b])
    assert a.tolist() == b.tolist() == [3.0] * 4
    assert a.to("cuda:1").tolist() == [0.0] * 4          # NCCL's variable does not reach CUDA's own P2P copy


def test_the_drill_file_is_read_like_the_sglang_standins(lab):
    (lab / "var/lib/kpro-lab/sglang-drill").write_text("p2p_wrong_sum\n")
    assert torch.full((2,), 5.0, device="cuda:1").to("cuda:0").tolist() == [0.0, 0.0]
    from sglang.srt._kpro_lab import util
    assert util.read_drills() == ({"p2p_wrong_sum": None}, [])   # a known drill: the server stand-in starts with it


def _check(env):
    base = dict(os.environ, PYTHONPATH=os.pathsep.join([STANDIN, SGLANG_STANDIN]))
    return gp.check(sys.executable, env, 5, base)


def test_the_checks_own_script_against_the_standin(lab, monkeypatch):
    check = _check({})
    assert check["device_count"] == 2 and check["torch"] == "2.11.0" and check["copy_path"] == "direct"
    assert [s["first"] for s in check["all_reduce"]] == [3.0, 3.0] and check["peer_access"] == {"0->1": True, "1->0": True}
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "p2p_wrong_sum")
    with pytest.raises(Failure) as e:
        _check({})
    assert e.value.phase == "gpu_p2p_wrong_result" and "all-reduce on GPU 0" in e.value.msg and "copy 0->1 (direct)" in e.value.msg
    cured = _check({"NCCL_P2P_DISABLE": "1"})
    assert cured["copy_path"] == "host" and [s["wrong"] for s in cured["all_reduce"]] == [0, 0]
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "p2p_hang")
    with pytest.raises(Failure) as e:
        _check({})
    assert e.value.phase == "gpu_p2p_hang" and "hung in the NCCL all-reduce" in e.value.msg
    monkeypatch.setenv("KPRO_LAB_SGLANG_DRILL", "p2p_hang,p2p_wrong_sum")
    assert _check({"NCCL_P2P_DISABLE": "1"})["device_count"] == 2
    monkeypatch.delenv("KPRO_LAB_SGLANG_DRILL")
    assert _check({"CUDA_VISIBLE_DEVICES": "0"})["device_count"] == 1


def test_the_wheel_is_reproducible(tmp_path):
    sys.path.insert(0, STANDIN)
    try:
        import build_wheel
    finally:
        sys.path.remove(STANDIN)
    one = build_wheel.build("2.11.0", str(tmp_path / "a"))
    two = build_wheel.build("2.11.0", str(tmp_path / "b"))
    digest = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (one, two)]
    assert os.path.basename(one) == "torch-2.11.0-py3-none-any.whl" and digest[0] == digest[1]
    with zipfile.ZipFile(one) as z:
        names = z.namelist()
        assert {"torch/__init__.py", "torch/cuda/__init__.py", "torch/cuda/nccl.py", "torch-2.11.0.dist-info/RECORD"} <= set(names)
        # as the real CUDA build's: the version and its CUDA release (the runtime toolchain check reads cuda)
        assert z.read("torch/version.py") == b'__version__ = "2.11.0"\ncuda = "13.0"\ngit_version = "kpro-lab-stand-in"\nhip = None\n'
        assert "Version: 2.11.0" in z.read("torch-2.11.0.dist-info/METADATA").decode()
