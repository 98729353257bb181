"""Storages PyTorch's CPU allocator did not make, found where they enter module calls.

``torch.from_numpy``, ``torch.frombuffer``, ``torch.from_dlpack`` and tensors memory-mapped from a
file (safetensors, ``torch.load(mmap=True)``) wrap memory someone else allocated, so the native
allocator recorder never sees them: a processor's numpy ``pixel_values`` or the fp32 weights that
``from_pretrained(path).half()`` maps and then drops would be missing from the trace. Such a
storage is not resizable (PyTorch only resizes memory its own allocator owns), which tells it
apart at the cost of one call per tensor the capture already looks at.

Where they are found: every tensor the capture tags (a root call's inputs, a model's parameters
and buffers, the KV cache, gradients, optimizer state), and every parameter or buffer registered
on any module while the capture runs (``from_pretrained`` assigns the mapped tensors that way).
Each one is recorded once, from the moment it is first seen, with a finalizer on its storage that
stamps its end. A foreign storage in a file-backed mapping becomes MAP/UNMAP rows; any other
becomes ALLOC/FREE rows with the op ``(external storage)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import torch

from memwarden.record.live.procmaps import FileMappings

__all__ = ["EXTERNAL_OP", "ForeignFinder", "ForeignLog", "is_foreign", "registration_hooks", "state_dict_hook"]

EXTERNAL_OP = "(external storage)"  # the op column of a foreign storage's rows


class ForeignLog(Protocol):
    """Where a foreign storage is recorded (``attribution.log.CaptureLog``)."""

    def foreign(self, t_ns: int, tensor: Any, kind: str) -> None: ...


def is_foreign(tensor: Any) -> bool:
    """True for a CPU tensor whose storage PyTorch's allocator did not allocate."""
    try:
        storage = tensor.untyped_storage()
        return bool(storage.data_ptr()) and not storage.resizable()
    except (NotImplementedError, RuntimeError, TypeError, AttributeError):
        return False


class ForeignFinder:
    """Which file a foreign storage lies in. /proc/self/maps is re-read only when an address is in
    no known file mapping, so a run of numpy inputs costs one read each, mapped weights one read
    per newly mapped file."""

    def __init__(self) -> None:
        self.maps = FileMappings()
        self._read = False

    def file_of(self, ptr: int) -> str | None:
        found = self.maps.file_of(ptr) if self._read else None
        if found is None:
            self.maps.refresh()
            self._read = True
            found = self.maps.file_of(ptr)
        return found


def registration_hooks(log: ForeignLog, clock: Callable[[], int]) -> list[Any]:
    """Global hooks that record a foreign parameter or buffer when it is registered on a module
    (the handles, to remove when the capture stops). Allocator-made ones cost one check each and
    leave no record: the capture tags those when it first sees their model."""

    def on_parameter(module: torch.nn.Module, name: str, param: Any) -> None:
        if param is not None and is_foreign(param):
            log.foreign(clock(), param, "weight")

    def on_buffer(module: torch.nn.Module, name: str, buffer: Any) -> None:
        if buffer is not None and is_foreign(buffer):
            log.foreign(clock(), buffer, "buffer")

    return [
        torch.nn.modules.module.register_module_parameter_registration_hook(on_parameter),
        torch.nn.modules.module.register_module_buffer_registration_hook(on_buffer),
    ]


class _Restore:
    """A patched attribute, put back by ``remove()`` (the shape of a hook handle)."""

    def __init__(self, owner: type, name: str, replacement: Any) -> None:
        self.owner, self.name, self.original = owner, name, owner.__dict__[name]
        setattr(owner, name, replacement)

    def remove(self) -> None:
        setattr(self.owner, self.name, self.original)


def state_dict_hook(log: ForeignLog, clock: Callable[[], int]) -> _Restore:
    """``Module.load_state_dict`` records the foreign tensors of the state dict it is given (a
    safetensors ``load_file``'s mapped tensors copied into a model already materialised: a second
    copy of every weight, resident while it is copied), as kind ``state``; not with ``assign=True``
    (no copy: they become the weights). PyTorch has no global
    hook for it, so the method is wrapped while the capture runs."""
    original = torch.nn.Module.load_state_dict

    @functools.wraps(original)
    def load_state_dict(module: torch.nn.Module, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        # assign=True makes the mapped tensors the parameters (their pages are read when used, and
        # the registration hooks record them as weights then); a copy reads every page now
        assign = kwargs.get("assign", args[1] if len(args) > 1 else False)
        values = state_dict.values() if hasattr(state_dict, "values") and not assign else ()
        t = clock()
        for value in values:
            if isinstance(value, torch.Tensor) and is_foreign(value):
                log.foreign(t, value, "state")
        return original(module, state_dict, *args, **kwargs)

    return _Restore(torch.nn.Module, "load_state_dict", load_state_dict)
