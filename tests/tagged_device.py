"""A GPU stand-in for tests on a CPU: tensors whose values live in CPU memory but that say they are on
:data:`DEVICE` and, as CUDA does, refuse to meet a CPU tensor in one operation.

A route is device-clean when nothing inside it builds a tensor on the CPU and hands it to an operation on the
model's device. PyTorch's meta and fake tensors cannot run a whole route (they stop at the first ``.item()``),
so this runs the real values with a tag instead::

    with on_device():                         # factories given device=DEVICE tag what they build
        model = move_module(model)            # parameters and buffers tagged, in place
        batch = {k: v.to(DEVICE) for k, v in batch.items()}
        ...                                   # one step of the route: a CPU tensor meeting a tagged one raises

============================== =======================================================================
operation                      what it does here (and on CUDA)
============================== =======================================================================
tagged ⊕ tagged                computes on the CPU values; the result is tagged
tagged ⊕ CPU tensor            RuntimeError "Expected all tensors to be on the same device" when the
                               CPU tensor has one or more dimensions; a 0-dim CPU tensor or a Python
                               number is allowed (CUDA takes them as scalars)
``t[i]``, ``t[i] = v``         a tagged ``t`` takes CPU indices (CUDA does); where ``i`` holds a
                               tensor, ``v`` must be tagged or a scalar (CUDA's index_put)
``.copy_(src)``                across the tag, as CUDA copies across devices; so does ``t[i] = v``
                               with a plain index (slices, integers)
``.to(DEVICE)``, ``.cuda()``   a tagged copy; ``.to("cpu")``, ``.cpu()``: an untagged copy; a move to
                               any other device raises
``.item()``, ``.tolist()``     Python values, as on CUDA; ``.numpy()`` raises TypeError, as on CUDA
``.device``, ``.is_cuda``      :data:`DEVICE`, True (``.is_cpu`` False)
factories with ``device=``     under :func:`on_device`, ``torch.zeros(…, device=DEVICE)`` and the like
                               build on the CPU and tag; without ``device=`` they build CPU tensors
============================== =======================================================================

Limits. Only calls that pass through ``__torch_function__`` are checked: the autograd engine's backward and a
C++ kernel's own inner calls are not (they receive the CPU values). Gradients are plain CPU tensors inside, and
reading ``.grad`` tags them, as a CUDA parameter's gradient is a CUDA tensor. ``torch.cuda.*`` still answers for
this machine, which has no CUDA: code that asks it directly, rather than a tensor's ``device``, takes its CPU
branch or fails (a model on ``cuda`` that uses transformers' hub kernels, as TRL's models here do, asks for the
card's capability when it switches between training and eval mode), and ``torch.autocast("cuda")`` is off, so a
mixed-precision forward computes in its weights' dtype here.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map_only

DEVICE = torch.device("cuda", 0)
"""The device a tagged tensor says it is on."""

MISMATCH = "Expected all tensors to be on the same device, but found at least two devices, {} and cpu! ({})"
"""CUDA's message when an operation meets tensors of two devices."""

_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu}
_GETTERS = {torch.Tensor.device.__get__: DEVICE, torch.Tensor.is_cuda.__get__: True,
            torch.Tensor.is_cpu.__get__: False}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}


class OnDevice(torch.Tensor):
    """A CPU tensor tagged as living on :data:`DEVICE` (module docstring)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _GETTERS:
            return _GETTERS[func]
        if func is torch.Tensor.get_device:
            return DEVICE.index
        if func is torch.Tensor.numpy:
            raise TypeError(f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the "
                            "tensor to host memory first.")
        if func in _MOVES:
            return _move(func, args, kwargs)
        if func is torch.Tensor.__deepcopy__:
            return _deepcopy(args[0], args[1])
        _refuse_mixing(func, args, kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        inputs = {id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        return tree_map_only(torch.Tensor, lambda t: t if isinstance(t, OnDevice) or id(t) in inputs else tag(t), out)


def tag(tensor: torch.Tensor) -> OnDevice:
    """``tensor``'s values (shared, not copied) as a tagged tensor; autograd history kept."""
    return torch.Tensor.as_subclass(tensor, OnDevice)


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A tagged tensor's values as a plain CPU tensor (shared)."""
    return torch.Tensor.as_subclass(tensor, torch.Tensor)


def _refuse_mixing(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise as CUDA does when ``func`` meets a tagged tensor and a CPU tensor of one or more dimensions."""
    if func is torch.Tensor.copy_ or (func is torch.Tensor.__setitem__ and not _holds_tensor(args[1])):
        return                                                   # a copy: across devices, as CUDA copies
    checked: list[Any] = [args, kwargs]
    if func in _INDEXING and isinstance(args[0], OnDevice):
        checked = [args[0], *args[2:]]                           # CPU indices are taken, as CUDA takes them
    tensors = [t for t in tree_leaves(checked) if isinstance(t, torch.Tensor)]
    cpu = [t for t in tensors if not isinstance(t, OnDevice) and t.dim() > 0]
    if cpu and any(isinstance(t, OnDevice) for t in tensors):
        raise RuntimeError(MISMATCH.format(DEVICE, f"{getattr(func, '__name__', func)} got a CPU tensor of shape "
                                                   f"{tuple(cpu[0].shape)}"))


def _holds_tensor(index: Any) -> bool:
    return any(isinstance(t, torch.Tensor) for t in tree_leaves(index))


def _names_device(device: Any) -> bool:
    """Whether ``device`` (a ``torch.device``, string or index) is :data:`DEVICE` (False: the CPU); any other
    device raises, as this stands in for one device only."""
    device = torch.device(device)
    if device.type == "cpu" or (device.type == DEVICE.type and device.index in (None, DEVICE.index)):
        return device.type == DEVICE.type
    raise RuntimeError(f"tagged_device stands in for {DEVICE} only, got {device}")


def _move(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """``.to`` / ``.cuda()`` / ``.cpu()``: the dtype as asked, tagged when the target is :data:`DEVICE`, untagged
    when it is the CPU, unchanged when none is named; a copy whenever the tag changes (as a device change copies)."""
    self, rest = args[0], args[1:]
    if func is torch.Tensor.cuda:
        device, dtype, memory_format = DEVICE, None, torch.preserve_format
    elif func is torch.Tensor.cpu:
        device, dtype, memory_format = torch.device("cpu"), None, torch.preserve_format
    else:
        if rest and isinstance(rest[0], torch.Tensor):                       # .to(other): its device and dtype
            rest = (rest[0].device, rest[0].dtype, *rest[1:])
        device, dtype, _, memory_format = torch._C._nn._parse_to(*rest, **{k: v for k, v in kwargs.items()
                                                                           if k != "copy"})
    was_tagged = isinstance(self, OnDevice)
    to_tagged = was_tagged if device is None else _names_device(device)
    plain = _plain(self) if was_tagged else self
    with torch._C.DisableTorchFunctionSubclass():
        out = plain.to(dtype=dtype or self.dtype, memory_format=memory_format,
                       copy=to_tagged != was_tagged or bool(kwargs.get("copy")))
    if out is plain:                                                  # nothing to change: .to returns self
        return self
    return tag(out) if to_tagged else out


def _deepcopy(tensor: OnDevice, memo: dict) -> OnDevice:
    """A tagged copy of a tagged leaf (its attributes, a parameter's mark included, copied too)."""
    with torch.no_grad():
        out = tag(_plain(tensor).clone())
    out.requires_grad_(tensor.requires_grad)
    out.__dict__ = copy.deepcopy(tensor.__dict__, memo)
    return out


class _OnDeviceMode(TorchFunctionMode):
    """Routes every call naming :data:`DEVICE` (a factory's ``device=``, a move) to CPU values that are tagged."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _MOVES:
            return _move(func, args, kwargs)
        if kwargs.get("device") is not None and _names_device(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
            return tree_map_only(torch.Tensor, lambda t: t if isinstance(t, OnDevice) else tag(t),
                                 func(*args, **kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_device() -> Iterator[None]:
    """Inside the block, calls that name :data:`DEVICE` build or move to tagged tensors."""
    with _OnDeviceMode():
        yield


def move_module(module: torch.nn.Module) -> torch.nn.Module:
    """``module.to(DEVICE)`` for the tag: every parameter and buffer replaced in place by a tagged one (a parameter
    stays a ``Parameter`` with its ``requires_grad``; a tensor shared by two names, a tied LM head, stays shared).
    Returns ``module``."""
    moved: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for members, make in ((sub._parameters, lambda p: torch.nn.Parameter(tag(p.detach()), p.requires_grad)),
                              (sub._buffers, lambda b: tag(b))):
            for name, value in members.items():
                if value is not None and not isinstance(value, OnDevice):
                    if id(value) not in moved:
                        moved[id(value)] = make(value)
                    members[name] = moved[id(value)]
    return module


def is_on_device(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` carries the tag."""
    return isinstance(tensor, OnDevice)
