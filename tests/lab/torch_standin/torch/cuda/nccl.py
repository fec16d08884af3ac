"""``torch.cuda.nccl`` of the stand-in: single-process multi-GPU collectives, as torch/cuda/nccl.py
(``all_reduce(inputs, outputs=None, op=SUM, streams=None, comms=None)``, in place when ``outputs`` is None).

The lab's drills act here unless NCCL_P2P_DISABLE=1 (NCCL then goes through host memory, as on a real ACS host):
``p2p_hang`` blocks the all-reduce forever; ``p2p_wrong_sum`` leaves each GPU its own contribution only (its peers'
arrive as zeros).
"""

import collections.abc
import time
from array import array

import torch

__all__ = ["all_reduce"]

SUM = 0  # ncclRedOp_t


def version():
    return (2, 27, 3)


def is_available(tensors):
    devices = set()
    for t in tensors:
        if not t.is_cuda or t.get_device() in devices:
            return False
        devices.add(t.get_device())
    return True


def _check_sequence_type(inputs):
    if not isinstance(inputs, collections.abc.Container) or isinstance(inputs, torch.Tensor):
        raise TypeError("Inputs should be a collection of tensors")


def all_reduce(inputs, outputs=None, op=SUM, streams=None, comms=None):
    _check_sequence_type(inputs)
    if outputs is None:
        outputs = inputs
    _check_sequence_type(outputs)
    if op != SUM:
        raise RuntimeError("the torch stand-in sums only")
    if not is_available(inputs) or len(set(t.numel() for t in inputs)) != 1 or len(outputs) != len(inputs):
        raise RuntimeError("NCCL Error 4: invalid argument (one tensor of the same size per GPU)")
    drills = {} if torch.cuda._nccl_p2p_disabled() or len(inputs) < 2 else torch.cuda._drills()
    if "p2p_hang" in drills:
        while True:           # a kernel that waits for a peer write that never lands
            time.sleep(3600)
    sums = None if "p2p_wrong_sum" in drills else _sum([t._data for t in inputs])
    for t_in, t_out in zip(inputs, outputs):
        t_out._data = array(t_in._data.typecode, t_in._data if sums is None else sums)


def _sum(arrays):
    """The element-wise sum (constant tensors, the check's, at C speed)."""
    if all(a.count(a[0]) == len(a) for a in arrays if len(a)):
        return array(arrays[0].typecode, [float(sum(a[0] for a in arrays))]) * len(arrays[0]) if len(arrays[0]) else arrays[0]
    return array(arrays[0].typecode, [sum(vals) for vals in zip(*arrays)])
