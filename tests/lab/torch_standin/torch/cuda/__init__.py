"""``torch.cuda`` of the stand-in: the lab's GPUs (the SGLang stand-in's state, CUDA_VISIBLE_DEVICES honoured)."""

import os
import sys

_warned = []


def _lab():
    """The SGLang stand-in's lab modules (the same state and drills the server stand-in reads), or None."""
    try:
        from sglang.srt._kpro_lab import args, gpustate, util
    except ImportError as e:
        if not _warned:
            _warned.append(1)
            sys.stderr.write("torch stand-in: no lab GPUs (the SGLang stand-in, sglang.srt._kpro_lab, is not importable: %s)\n" % e)
        return None
    return args, gpustate, util


def _usable(state):
    """The GPUs bound to the nvidia driver with its module loaded (as the SGLang stand-in's server sees them)."""
    if "modules" in state and "nvidia" not in (state.get("modules") or {}).get("loaded", []):
        return []
    devs = (state.get("pci") or {}).get("devices") if "pci" in state else None
    return [g for g in state.get("gpus", []) if devs is None or (devs.get(g.get("bdf")) or {}).get("driver") == "nvidia"]


def _gpus():
    lab = _lab()
    if lab is None:
        return []
    args, gpustate, _util = lab
    return [g for _i, g in args.visible_gpus(_usable(gpustate.load_or_empty()))]


def _drills():
    """The lab's drills in effect for GPU-to-GPU traffic: {name: arg} (p2p_hang, p2p_wrong_sum)."""
    lab = _lab()
    if lab is None:
        return {}
    return dict((k, v) for k, v in lab[2].read_drills()[0].items() if k.startswith("p2p_"))


def _nccl_p2p_disabled():
    return os.environ.get("NCCL_P2P_DISABLE", "") == "1"


def is_available():
    return device_count() > 0


def device_count():
    return len(_gpus())


def _check(index):
    if index is None or not 0 <= int(index) < device_count():
        raise RuntimeError("CUDA error: invalid device ordinal")


def can_device_access_peer(device, peer_device):
    """The driver's answer (cudaDeviceCanAccessPeer): yes between two lab GPUs, also where ACS breaks it (the drills)."""
    d, p = int(getattr(device, "index", device)), int(getattr(peer_device, "index", peer_device))
    _check(d)
    _check(p)
    return d != p


def synchronize(device=None):
    if device is not None:
        _check(int(getattr(device, "index", device)))


def get_device_name(device=None):
    gpus = _gpus()
    i = int(getattr(device, "index", device) or 0)
    _check(i)
    return gpus[i].get("name") or "NVIDIA GPU"


def _peer_copy(data, src, dst):
    """A direct GPU-to-GPU copy (CUDA P2P, which NCCL_P2P_DISABLE does not reach): with p2p_wrong_sum the peer write
    is lost, as under ACS with the IOMMU on, and the destination reads zeros."""
    if "p2p_wrong_sum" in _drills():
        return data.__class__(data.typecode, [0.0]) * len(data)
    return data


from torch.cuda import nccl  # noqa: E402,F401  pylint: disable=wrong-import-position
