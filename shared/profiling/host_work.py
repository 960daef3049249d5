"""Host work of an engine step, counted on any machine: torch ops, host syncs and Python calls.

On a GPU a step is fast when the host does little besides launching one captured
graph: few ops dispatched outside it, one device-to-host read, few Python calls.
These counts do not need a GPU, so they are the CPU proxy that tests and
``bench/host_overhead.py`` hold::

    graph_body()      marks the region a CUDA graph captures (static_step.StaticStep.body);
                      on CPU it runs eagerly, and nothing inside it is counted
    HostWorkCounter   outside that region counts
                        ops      aten ops dispatched (TorchDispatchMode)
                        syncs    reads of device tensors by the host (item, tolist, cpu, numpy,
                                 bool/int/float, nonzero) and blocking host-to-device copies,
                                 by file:line (TorchFunctionMode)
                        calls    Python function calls (sys.setprofile)

On CPU every tensor lives on the host, so "device tensor" is tracked by taint: the
model's parameters and KV cache are device tensors, so is anything computed from one,
made with an explicit ``device=`` or moved with ``.to(device)``/``copy_``. Plain host
tensors (``torch.tensor(list)`` without a device) can be read for free, as on a GPU.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

BODY_LABEL = "tandem.graph_body"
_depth = [0]  # > 0 while inside graph_body(): counters ignore what runs there

_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"}
_COPIES = {"to", "cuda"}
# the counters' own machinery (the modes' hooks and what they call): not the engine's calls
_COUNTER_FILES = ("host_work.py", "torch/utils/weak.py", "torch/overrides.py", "torch/utils/_python_dispatch.py",
                  "torch/_ops.py", "weakref.py", "contextlib.py", "torch/_C/_functorch.py")  # fmt: skip


@contextlib.contextmanager
def graph_body():
    """The region a CUDA graph replays (a profiler range on CPU); host-work counters skip it."""
    _depth[0] += 1
    try:
        with torch.profiler.record_function(BODY_LABEL):
            yield
    finally:
        _depth[0] -= 1


def inside_body() -> bool:
    return _depth[0] > 0


def _tensors(obj) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _caller() -> str:
    """file:line of the first frame outside torch and this module (where the sync is written)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and not name.endswith("host_work.py"):
            parts = name.split("/")
            return f"{'/'.join(parts[-3:])}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class _Syncs(TorchFunctionMode):
    def __init__(self, counter: "HostWorkCounter"):
        super().__init__()
        self.counter = counter
        self.device = WeakIdKeyDictionary()  # tensors that live on the (real or proxied) device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        on_device = any(t in self.device for t in inputs)
        if not inside_body():
            blocking = not kwargs.get("non_blocking", False)
            if name in _READS and on_device:
                self.counter.syncs[_caller()] += 1
            elif name == "copy_" and blocking and args[0] in self.device and args[1] not in self.device:
                self.counter.syncs[_caller()] += 1  # a blocking host-to-device copy into a device tensor
            elif name in ("to", "cuda") and blocking and not on_device and _targets_device(name, args, kwargs):
                self.counter.syncs[_caller()] += 1  # a blocking host-to-device copy
            elif name == "tensor" and kwargs.get("device") is not None:
                self.counter.syncs[_caller()] += 1  # torch.tensor(host data, device=...) copies synchronously
        out = func(*args, **kwargs)
        moved = name in _COPIES and _targets_device(name, args, kwargs)
        if on_device or kwargs.get("device") is not None or moved:
            for t in _tensors(out):
                self.device[t] = True
        return out


def _targets_device(name: str, args, kwargs) -> bool:
    """Does this to()/copy_()/cuda() move data onto the device? (On CPU: any explicit device argument.)"""
    if name == "cuda":
        return True
    rest = list(args[1:]) + [kwargs.get("device")]
    return any(isinstance(a, (torch.device, str)) for a in rest if a is not None)


class _Ops(TorchDispatchMode):
    def __init__(self, counter: "HostWorkCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not inside_body():
            self.counter.ops += 1
        return func(*args, **(kwargs or {}))


class HostWorkCounter:
    """Count the host work of whatever runs inside ``with counter:`` (outside ``graph_body()`` regions)."""

    def __init__(self, device_tensors: Iterable[torch.Tensor] = ()):
        self.ops = 0
        self.calls = 0
        self.syncs: Counter[str] = Counter()
        self._device_tensors = list(device_tensors)
        self._modes: list = []

    @property
    def num_syncs(self) -> int:
        return sum(self.syncs.values())

    def _profile(self, frame, event, arg):
        if event == "call" and not inside_body() and not frame.f_code.co_filename.endswith(_COUNTER_FILES):
            self.calls += 1

    def __enter__(self):
        syncs = _Syncs(self)
        for t in self._device_tensors:
            syncs.device[t] = True
        self._modes = [syncs, _Ops(self)]
        for m in self._modes:
            m.__enter__()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        for m in reversed(self._modes):
            m.__exit__(*exc)
        self._modes = []
        return False


def engine_device_tensors(runner) -> list[torch.Tensor]:
    """What lives on the device for a runner: its parameters, buffers and KV pool."""
    modules = getattr(runner, "weight_modules", (runner.model,))  # the fused decoder's merged weights too
    return [t for m in modules for t in (*m.parameters(), *m.buffers())] + [runner.cache.kv]
