"""GovernedSession's signature: a model, a budget, and a few objects; the knobs are one SessionConfig and
the caller's code one SessionHooks. Every keyword of the old 25-parameter signature still works for one
release, mapped onto the config or the hooks with a DeprecationWarning naming the new spelling."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from memwarden.models import zoo
from memwarden.runtime.degrade import LadderConfig
from memwarden.runtime.encoders import LRUStore
from memwarden.runtime.session import GovernedSession
from memwarden.runtime.session_config import SessionConfig
from memwarden.runtime.session_hooks import SessionHooks

# The parameters of GovernedSession.__init__ before the config/hooks split (git show of its last version).
FORMER = (
    "model processor budget device_profile block_size config num_kv_blocks kv_fraction prefix_reuse "
    "encoder_cache encoder_cache_bytes max_wait_s swap_dir stream offload_dir activation_reserve_bytes "
    "min_kv_tokens safety_fraction quantize group_size example_inputs ladder lower_resolution fallback "
    "on_decision heap_mmap_threshold take_over"
).split()


def _lower(inputs: dict[str, Any], scale: float) -> dict[str, Any]:
    return inputs


STORE = LRUStore(2**20)
# A value for each keyword that moved, other than its default, and where the session keeps it now.
MOVED: dict[str, tuple[Any, str]] = {
    "block_size": (8, "config"),
    "num_kv_blocks": (64, "config"),
    "kv_fraction": (0.25, "config"),
    "prefix_reuse": (False, "config"),
    "encoder_cache": (False, "config"),
    "encoder_cache_bytes": (2**20, "config"),
    "max_wait_s": (1.0, "config"),
    "swap_dir": ("{tmp}", "config"),
    "stream": (False, "config"),
    "offload_dir": ("{tmp}", "config"),
    "activation_reserve_bytes": (2**24, "config"),
    "min_kv_tokens": (256, "config"),
    "safety_fraction": (0.05, "config"),
    "quantize": (None, "config"),  # the default: quantizing would change the shared model in place
    "group_size": (64, "config"),
    "ladder": (LadderConfig(prune_keep_ratios=()), "config"),
    "heap_mmap_threshold": (None, "config"),
    "take_over": (False, "config"),
    "on_decision": (print, "hooks"),
    "lower_resolution": (_lower, "hooks"),
    "device_profile": ("jetson-orin-nano-8gb", "dropped"),
}


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return zoo.build_model("llava", "tiny")


def test_the_signature_has_at_most_eight_parameters():
    params = inspect.signature(GovernedSession).parameters
    assert len(params) <= 8, list(params)
    assert list(params)[:2] == ["model", "budget"]
    assert all(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in list(params.values())[2:])


def test_every_former_keyword_is_still_a_parameter_or_moved():
    kept = set(inspect.signature(GovernedSession).parameters)
    assert set(FORMER) - kept == set(MOVED)


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_former_keyword_still_works_and_warns(model, name, tmp_path: Path):
    value, home = MOVED[name]
    if value == "{tmp}":
        value = str(tmp_path)
    with pytest.warns(DeprecationWarning, match=rf"GovernedSession\({name}=\.\.\.\) is deprecated") as caught:
        session = GovernedSession(model, "1GiB", **{name: value})
    with session:
        if home == "config":
            assert getattr(session.config, name) == value
            assert "dataclasses.replace(config" in str(caught[0].message)
        elif home == "hooks":
            assert getattr(session.hooks, name) is value
            assert f"hooks=SessionHooks({name}=" in str(caught[0].message)
        else:
            assert "drop it" in str(caught[0].message)
    assert caught[0].filename == __file__  # the warning points at the caller's line


def test_an_encoder_store_keyword_becomes_the_hooks_store(model):
    with pytest.warns(DeprecationWarning, match=r"hooks=SessionHooks\(encoder_store=\.\.\.\)"):
        session = GovernedSession(model, "1GiB", encoder_cache=STORE)
    with session:
        assert session.hooks.encoder_store is STORE and session.config.encoder_cache
        assert session.encoder_cache is not None and session.encoder_cache.store is STORE


def test_the_new_spelling_raises_no_deprecation_warning_and_a_typo_is_refused(model):
    config = dataclasses.replace(SessionConfig(), kv_fraction=0.25, prefix_reuse=False)
    hooks = SessionHooks(on_decision=print, encoder_store=STORE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with GovernedSession(model, "1GiB", config=config, hooks=hooks) as session:
            assert session.config == dataclasses.replace(config, budget=2**30) and session.hooks is hooks
    with pytest.raises(TypeError, match="unexpected keyword arguments: kv_fractoin"):
        GovernedSession(model, "1GiB", kv_fractoin=0.25)
