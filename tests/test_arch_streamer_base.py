"""Both weight streamers are one kind of object to a session (runtime/streaming.py): a CPU streamer
asked to stream more within a lower budget plans and streams exactly what its own plan would, and a
budget no plan fits releases nothing instead of raising."""

from __future__ import annotations

import torch

from memwarden.models import zoo
from memwarden.record.live.reference import state_bytes
from memwarden.runtime.offload import WeightStreamer, stream_weights
from memwarden.runtime.offload_cuda import CudaWeightStreamer
from memwarden.runtime.offload_plan import plan_streaming
from memwarden.runtime.streaming import Streamer


def test_both_streamers_share_the_base() -> None:
    assert issubclass(WeightStreamer, Streamer) and issubclass(CudaWeightStreamer, Streamer)


def test_stream_more_within_streams_what_the_lower_plan_streams(tmp_path) -> None:
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=2, **zoo.generate_kwargs("llava"))
    total = state_bytes(model)
    with stream_weights(model, int(total * 0.9), tmp_path) as streamer:
        assert streamer.stream_more_within(1, kv_cache_bytes=0, activation_bytes=0) == 0  # no plan fits
        lower = plan_streaming(model, int(total * 0.6), offload_dir=tmp_path)
        resident = state_bytes(model)
        released = streamer.stream_more_within(int(total * 0.6), kv_cache_bytes=0, activation_bytes=0)
        assert released > 0
        assert 0 <= state_bytes(model) - (resident - released) <= 1024  # a placeholder keeps one element
        assert {f.stem for f in tmp_path.glob("*.safetensors")} >= set(lower.streamed_names()) - {""}
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=2, **zoo.generate_kwargs("llava"))
        assert torch.equal(out, expected)
    assert not list(tmp_path.iterdir())
