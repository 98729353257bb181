"""The meta capture's shortcuts (memoised meta kernels, replayed composite ops) log exactly the
events a capture without them logs: same actions, sizes, ops, dtypes, shapes and written bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from memwarden.estimation import measure, resolve
from memwarden.estimation.card import Request
from memwarden.record.meta import memo as meta_memo
from memwarden.record.meta import replay as meta_replay

_COLUMNS = ("action", "nbytes", "op", "dtype", "shape", "written_bytes", "category", "phase", "module")


def _events(model: str, req: Request) -> dict[str, np.ndarray]:
    trace, _ = measure.run_estimate(resolve.resolve_model(model), req)
    return {k: np.asarray(trace.events[k]) for k in _COLUMNS} | {"strings": np.asarray(trace.strings)}


def _without_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_kernel(self: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return func(*args, **kwargs)

    def decompose(self: Any, mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ops: Any) -> Any:
        with mode:
            return func.decompose(*args, **kwargs)

    monkeypatch.setattr(meta_memo.MetaMemo, "run", run_kernel)
    monkeypatch.setattr(meta_replay.Replay, "run", decompose)


@pytest.mark.parametrize(
    ("model", "req"),
    [
        ("llava", Request(images=((32, 32),), prompt_tokens=24, new_tokens=4, dtype="bfloat16")),
        ("qwen2-vl", Request(images=((112, 112),), prompt_tokens=24, new_tokens=4, weights_dtype="int4")),
        ("qwen2-audio", Request(audio_seconds=1.0, prompt_tokens=24, new_tokens=4, kv_dtype="int8")),
    ],
    ids=["llava-bf16", "qwen2-vl-int4", "qwen2-audio-kv-int8"],
)
def test_shortcuts_log_the_same_events(model: str, req: Request, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first run on a freshly built int4 model logs 2 events fewer than later ones, with or
    # without the shortcuts (something the model creates lazily); compare later runs only.
    _events(model, req)
    fast = _events(model, req)
    with monkeypatch.context() as m:
        _without_shortcuts(m)
        slow = _events(model, req)
    for name in fast:
        assert np.array_equal(fast[name], slow[name]), name


def test_memo_rebuilds_fresh_outputs_and_keeps_in_place_ops_aliased() -> None:
    memo = meta_memo.MetaMemo()
    x = torch.empty(2, 3, dtype=torch.bfloat16, device="meta")
    first = memo.run(torch.ops.aten.mul.Tensor, (x, x), {})
    second = memo.run(torch.ops.aten.mul.Tensor, (x, x), {})
    assert memo.hits == 1
    assert second.shape == first.shape and second.stride() == first.stride() and second.dtype == first.dtype
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata
    assert memo.run(torch.ops.aten.mul_.Tensor, (x, x), {}) is x
    assert memo.run(torch.ops.aten.mul_.Tensor, (x, x), {}) is x
    # 1 and 1.0 hash alike but promote differently: an int tensor times 1.0 is float
    i = torch.empty(4, dtype=torch.int64, device="meta")
    assert memo.run(torch.ops.aten.mul.Scalar, (i, 1), {}).dtype == torch.int64
    assert memo.run(torch.ops.aten.mul.Scalar, (i, 1.0), {}).dtype == torch.float32
