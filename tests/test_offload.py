"""Weight streaming (runtime/offload.py) on real zoo models: greedy outputs equal the resident
model's, PyTorch's memory profiler stays under the budget, the files are plain safetensors,
detach restores the model, and the placement's device_map drives accelerate."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from torch.profiler import profile

from memwarden.models import zoo
from memwarden.plan.placement import PlacementError
from memwarden.record.live.reference import profiler_peak_bytes, state_bytes
from memwarden.runtime.offload import stream_weights
from memwarden.runtime.offload_plan import plan_streaming, weight_groups

NEW_TOKENS = 4


def _generate(model: torch.nn.Module, inputs: dict[str, torch.Tensor], name: str, new_tokens: int = NEW_TOKENS):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=new_tokens, **zoo.generate_kwargs(name))


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", ["llava", "qwen2-vl"])
def test_greedy_tokens_equal_while_streaming(name: str, tmp_path) -> None:
    model = zoo.build_model(name, size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    before = _state(model)
    expected = _generate(model, inputs, name)

    budget_bytes = int(state_bytes(model) * 0.8)
    with stream_weights(model, budget_bytes, tmp_path) as streamer:
        streamed = streamer.placement.streamed_names()
        assert len(streamed) >= 2
        assert any("language_model" in n or n == "lm_head" for n in streamed)  # decode steps stream too
        assert torch.equal(_generate(model, inputs, name), expected)
        with pytest.raises(ValueError, match="already streamed"):
            stream_weights(model, budget_bytes, tmp_path / "again")
        # after the first step, the next group is already in its slot (or still there)
        stats = streamer.stats
        assert stats.prefetch_hits + stats.reuses > stats.sync_loads
        assert stats.extra_slots == 0
        # between uses a streamed weight holds no memory of its own
        assert all(p.untyped_storage().nbytes() <= 8 for n, p in model.named_parameters() if n.startswith(streamed[0]))
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert all(p.requires_grad for p in model.parameters())
    assert not list(tmp_path.iterdir())  # detach deletes the files it wrote
    assert torch.equal(_generate(model, inputs, name), expected)


@pytest.mark.parametrize("name", zoo.NAMES)
def test_every_zoo_model_streams_exactly_at_its_smallest_budget(name: str, tmp_path) -> None:
    # The smallest budget streams every group that can stream: a weight read outside its own
    # module's forward (a parent reading `.weight`) would be a NaN placeholder and change the tokens.
    model = zoo.build_model(name, size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=8)
    expected = _generate(model, inputs, name, new_tokens=3)
    with pytest.raises(PlacementError) as err:
        plan_streaming(model, 1, offload_dir=tmp_path)
    with stream_weights(model, err.value.min_budget_bytes, tmp_path) as streamer:
        assert streamer.placement.streamed_weight_bytes > state_bytes(model) // 2
        assert torch.equal(_generate(model, inputs, name, new_tokens=3), expected)


def test_files_are_safetensors_of_the_original_weights(tmp_path) -> None:
    model = zoo.build_model("llava", size="tiny")
    before = _state(model)
    streamer = stream_weights(model, int(state_bytes(model) * 0.8), tmp_path)
    try:
        files = sorted(tmp_path.glob("*.safetensors"))
        assert [f.stem for f in files] == sorted(streamer.placement.streamed_names())
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    assert torch.equal(st.get_tensor(key), before[f"{f.stem}.{key}"])
    finally:
        streamer.detach(delete_files=False)
    assert len(list(tmp_path.glob("*.safetensors"))) == len(files)


def _deep_llava(text_layers: int) -> torch.nn.Module:
    """Tiny LLaVA with more decoder layers, so that layers (not the embedding and LM head) are most
    of the weights and half of them is a budget streaming can meet."""
    cfg = zoo.build_config("llava", "tiny")
    cfg.text_config.num_hidden_layers = text_layers
    return zoo.build_from_config("llava", cfg)


def _profiled_peak_bytes(fn) -> tuple[int, torch.Tensor]:
    with profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        out = fn()
    return profiler_peak_bytes(prof), out


def test_profiler_peak_stays_under_a_budget_of_half_the_weights(tmp_path) -> None:
    model = _deep_llava(text_layers=10)
    inputs = zoo.make_inputs(model, prompt_tokens=8)
    new_tokens = 2
    weight_bytes = state_bytes(model)
    budget_bytes = weight_bytes // 2
    assert weight_bytes >= 2 * budget_bytes

    # What the request needs besides weights, from one resident run: the KV cache by arithmetic,
    # the rest (activations, inputs, logits) as measured.
    plain_peak, expected = _profiled_peak_bytes(lambda: _generate(model, inputs, "llava", new_tokens))
    text = model.config.text_config
    tokens = inputs["input_ids"].shape[1] + new_tokens
    head_dim = text.hidden_size // text.num_attention_heads
    kv_cache_bytes = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * tokens * 4  # K and V, fp32
    activation_bytes = plain_peak - weight_bytes - kv_cache_bytes
    assert activation_bytes > 0

    with stream_weights(
        model, budget_bytes, tmp_path, kv_cache_bytes=kv_cache_bytes, activation_bytes=activation_bytes
    ) as streamer:
        assert streamer.placement.predicted_peak_bytes <= budget_bytes
        assert streamer.staging_bytes <= streamer.placement.staging_bytes
        streamed_peak, out = _profiled_peak_bytes(lambda: _generate(model, inputs, "llava", new_tokens))
    assert torch.equal(out, expected)
    assert streamed_peak <= budget_bytes, (streamed_peak, budget_bytes)
    assert streamed_peak < plain_peak - weight_bytes // 3  # the streamed layers really left memory


def test_budget_below_two_staging_slots_is_refused(tmp_path) -> None:
    model = zoo.build_model("llava", size="tiny")
    with pytest.raises(PlacementError) as err:
        stream_weights(model, 100_000, tmp_path)
    assert err.value.min_budget_bytes > 100_000
    assert not list(tmp_path.iterdir())
    assert all(p.untyped_storage().nbytes() == p.nbytes for p in model.parameters())


def test_weight_groups_cover_every_tensor_once() -> None:
    model = zoo.build_model("qwen2-audio", size="tiny")
    groups = weight_groups(model)
    names = [n for n, _ in groups]
    assert not any(a != b and b.startswith(a + ".") for a in names for b in names)  # disjoint subtrees
    covered = {f"{n}.{k}" if n else k for n, m in groups for k in m.state_dict()}
    assert covered == set(model.state_dict())


def test_device_map_dispatches_with_accelerate(tmp_path) -> None:
    accelerate = pytest.importorskip("accelerate")
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    expected = _generate(model, inputs, "llava")
    placement = plan_streaming(model, int(state_bytes(model) * 0.8), offload_dir=tmp_path)
    device_map = placement.to_device_map("cpu")
    assert "disk" in device_map.values() and "cpu" in device_map.values()
    dispatched = accelerate.dispatch_model(model, device_map, main_device="cpu", offload_dir=str(tmp_path / "acc"))
    # accelerate really offloaded what the placement streams
    assert all(
        p.device.type == "meta" for n, p in dispatched.named_parameters() if n.startswith(placement.streamed_names()[0])
    )
    assert torch.equal(_generate(dispatched, inputs, "llava"), expected)


_UNDER_A_REAL_LIMIT = """
import gc, os, sys, tempfile, torch
from memwarden.models import zoo
from memwarden.resilience.inject import apply_address_space_limit
from memwarden.runtime.offload import stream_weights
from memwarden.runtime.host_memory import return_freed_memory
from memwarden.runtime.host_memory import state_bytes
torch.set_num_threads(1)  # no thread (and stack) created after the limit
torch.manual_seed(0)
model = zoo.build_model('llava', 'small').eval()
ids = torch.randint(5, 100, (1, 16))
with torch.no_grad():
    want = model(input_ids=ids).logits
weights = state_bytes(model)
gc.collect(); return_freed_memory()
mapped = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')
apply_address_space_limit(mapped + weights // 4)  # room for a quarter of the weights more, not for a copy of them
with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
    streamer = stream_weights(model, weights // 2, tmp)
    got = model(input_ids=ids).logits
    print(torch.equal(got, want), streamer.stats.loads > 0, sum(1 for _ in os.scandir(tmp)))
"""


def test_streaming_fits_an_address_space_limit_below_twice_the_weights() -> None:
    # Streaming is what a process turns to when memory is short: writing the groups out may not need
    # a second copy of the weights at once (a memory map of every file did, and ENOMEM'd under RLIMIT_AS).
    import os
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    out = subprocess.run(
        [sys.executable, "-c", _UNDER_A_REAL_LIMIT], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    equal, loaded, files = out.stdout.split()
    assert (equal, loaded) == ("True", "True") and int(files) > 0


@pytest.mark.parametrize("fraction", [0.9, 0.97])
def test_a_running_streamer_streams_more_for_a_lower_budget_and_stays_exact(fraction: float, tmp_path) -> None:
    # What a GovernedSession does when a real limit refuses an allocation mid-conversation: stream more
    # groups without bringing the streamed ones back. At 97% of the weights the first plan streams only
    # small groups, so the larger ones need the staging slots to grow (_resize_slots).
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=12)
    before = _state(model)
    expected = _generate(model, inputs, "llava")
    total = state_bytes(model)
    with stream_weights(model, int(total * fraction), tmp_path) as streamer:
        first = set(streamer.placement.streamed_names())
        resident = state_bytes(model)
        slot_bytes = streamer.slot_bytes
        lower = plan_streaming(model, int(total * 0.6), offload_dir=tmp_path)
        released = streamer.stream_more(lower)
        assert released > 0
        assert 0 <= state_bytes(model) - (resident - released) <= 1024  # a placeholder keeps one element
        assert {f.stem for f in tmp_path.glob("*.safetensors")} >= first | set(lower.streamed_names()) - {""}
        if fraction > 0.95:
            assert streamer.slot_bytes > slot_bytes  # the slots grew for a larger group
        assert torch.equal(_generate(model, inputs, "llava"), expected)
        assert streamer.stream_more(lower) == 0  # nothing left to add for the same plan
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert not list(tmp_path.iterdir())
