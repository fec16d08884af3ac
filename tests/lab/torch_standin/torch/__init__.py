"""Lab stand-in for PyTorch (kpro.gpu_serving tests). Not the real PyTorch.

Exactly the API the collection's two-GPU check (plugins/module_utils/serve/gpu_p2p.py SCRIPT) uses: ``torch.full``,
``Tensor.to`` / ``.cpu`` / ``.tolist``, ``torch.cuda.device_count``, ``can_device_access_peer``, ``synchronize`` and
``torch.cuda.nccl.all_reduce``. The GPUs are the lab's (the SGLang stand-in's state), the failures its drills. See
tests/lab/torch_standin/README.md in the kpro.gpu_serving repository.
"""

from array import array

from torch.version import __version__  # noqa: F401

_kpro_lab_standin = True


class dtype(object):
    def __init__(self, name, code):
        self.name, self.code = name, code

    def __repr__(self):
        return "torch." + self.name


float32 = dtype("float32", "f")


class device(object):
    """``torch.device("cuda:1")``: ``type`` and ``index``."""

    def __init__(self, spec):
        spec = str(spec)
        self.type, _sep, idx = spec.partition(":")
        if self.type not in ("cpu", "cuda"):
            raise RuntimeError("Expected one of cpu, cuda device type at start of device string: %s" % spec)
        self.index = int(idx) if idx else (0 if self.type == "cuda" else None)

    def __str__(self):
        return self.type if self.type == "cpu" else "cuda:%d" % self.index

    def __eq__(self, other):
        return str(self) == str(other)

    def __hash__(self):
        return hash(str(self))


class Tensor(object):
    """A one-dimensional float tensor on ``cpu`` or one lab GPU."""

    def __init__(self, data, dev, dt=float32):
        self._data, self.device, self.dtype = data, dev, dt

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    is_sparse = False

    def is_contiguous(self):
        return True

    def get_device(self):
        return self.device.index if self.is_cuda else -1

    def numel(self):
        return len(self._data)

    @property
    def shape(self):
        return (len(self._data),)

    def to(self, dev):
        """A copy to ``dev``; GPU to GPU is a direct peer copy (cudaMemcpyPeer), which the lab's drills can break."""
        from torch import cuda
        dev = device(dev)
        if dev == self.device:
            return self
        if dev.type == "cuda":
            cuda._check(dev.index)
        data = array(self.dtype.code, self._data)
        if self.is_cuda and dev.type == "cuda":
            data = cuda._peer_copy(data, self.device.index, dev.index)
        return Tensor(data, dev, self.dtype)

    def cpu(self):
        return self.to("cpu")

    def tolist(self):
        return list(self._data)

    def __repr__(self):
        head = ", ".join("%.4f" % v for v in list(self._data[:3]))
        return "tensor([%s%s], device='%s')" % (head, ", ..." if len(self._data) > 3 else "", self.device)


def full(size, fill_value, dtype=None, device=None):  # noqa: A002 - torch's own names
    from torch import cuda
    dt = dtype or float32
    dev = globals()["device"](device or "cpu")
    if dev.type == "cuda":
        cuda._check(dev.index)
    dims = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    if len(dims) != 1:
        raise RuntimeError("the torch stand-in has one-dimensional tensors only")
    return Tensor(array(dt.code, [float(fill_value)]) * int(dims[0]), dev, dt)


from torch import cuda  # noqa: E402,F401  pylint: disable=wrong-import-position
