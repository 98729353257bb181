"""What a campaign worker serves: a built-in scenario and a serving mode (plain or governed).

Runs in the worker child only (it imports torch). A serving mode is a factory named in the
campaign config, imported lazily when the worker starts, so the plain mode works without
the runtime and any ``package.module:factory`` can be plugged in::

    factory(model, *, budget_bytes, options, gen_kwargs) -> server

where ``server.generate(inputs, max_new_tokens)`` returns the new token ids (a list of int)
and may have ``set_budget(budget_bytes)`` (called on squeezes), ``on_telemetry(sample)``
(called with each simulated :class:`~memwarden.resilience.inject.TelemetrySample`) and
``stats()`` (a JSON-able dict kept in the campaign record).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memwarden.errors import InputError

__all__ = ["MODES", "SCENARIOS", "DemoChat", "governed_server", "load_scenario", "make_server", "plain_server"]

MODES = {
    "plain": "memwarden.resilience.serving:plain_server",
    "governed": "memwarden.resilience.serving:governed_server",
}


# -- scenarios ------------------------------------------------------------------------


@dataclass
class DemoChat:
    """The chat deployment of ``memwarden.models.chat``: a small VLM answering turns about one image.

    Request ``i`` is turn ``i % turns`` of conversation ``i // turns``; the conversation grows
    each turn and the same image is sent again (build_deployment's chat loop), so a
    session that reuses the image prefix has something to win. Inputs are drawn from the
    request's conversation seed; the weights from the workload's ``seed``.
    """

    model: Any
    gen_kwargs: dict[str, Any]
    config: Any  # memwarden.models.chat.DemoConfig

    @classmethod
    def build(cls, workload: dict[str, Any]) -> DemoChat:
        from memwarden.models.chat import DemoConfig, build_deployment

        fields = {k: workload[k] for k in DemoConfig.__dataclass_fields__ if k in workload}
        config = DemoConfig(**fields)
        model, _turn_inputs, gen_kwargs = build_deployment(config)
        model.eval()
        return cls(model=model, gen_kwargs=gen_kwargs, config=config)

    @property
    def max_new_tokens(self) -> int:
        return int(self.config.new_tokens)

    def inputs(self, index: int, conversation_seed: int) -> dict[str, Any]:
        from memwarden.models.chat import conversation_inputs

        return conversation_inputs(self.model, self.config, index % self.config.turns, seed=conversation_seed)


SCENARIOS: dict[str, Callable[[dict[str, Any]], Any]] = {"demo-chat": DemoChat.build}


def load_scenario(workload: dict[str, Any]) -> Any:
    name = workload.get("scenario")
    if name not in SCENARIOS:
        raise InputError(f"unknown scenario {name!r}; built-in: {', '.join(SCENARIOS)} (or give script = PATH)")
    return SCENARIOS[name](workload)


# -- serving modes ---------------------------------------------------------------------


class PlainServer:
    """transformers' own ``model.generate``: what a deployment does without memwarden."""

    def __init__(self, model: Any, gen_kwargs: dict[str, Any]) -> None:
        self.model, self.gen_kwargs = model, gen_kwargs

    def generate(self, inputs: dict[str, Any], max_new_tokens: int) -> list[int]:
        import torch

        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, **self.gen_kwargs)
        return [int(t) for t in out[0, inputs["input_ids"].shape[1] :].tolist()]


def plain_server(model: Any, *, budget_bytes: int | None, options: dict[str, Any], gen_kwargs: dict[str, Any]) -> Any:
    if options:
        raise InputError(f"serving mode 'plain' takes no options; got {', '.join(sorted(options))}")
    return PlainServer(model, gen_kwargs)


class GovernedServer:
    """``memwarden.GovernedSession`` behind the server interface."""

    def __init__(self, session: Any, gen_kwargs: dict[str, Any]) -> None:
        self.session = session
        # Pass the greedy settings the plain mode uses, but only those the session's generate() names
        # (or all of them if it takes **kwargs), so both modes answer the same question.
        params = inspect.signature(session.generate).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            self.gen_kwargs = dict(gen_kwargs)
        else:
            names = {p.name for p in params}
            self.gen_kwargs = {k: v for k, v in gen_kwargs.items() if k in names}

    def generate(self, inputs: dict[str, Any], max_new_tokens: int) -> list[int]:
        out = self.session.generate(**inputs, max_new_tokens=max_new_tokens, **self.gen_kwargs)
        ids = out.sequences if hasattr(out, "sequences") else out
        return [int(t) for t in ids[0, inputs["input_ids"].shape[1] :].tolist()]

    def set_budget(self, budget_bytes: int) -> None:
        if hasattr(self.session, "set_budget"):
            try:  # a squeeze ends: the session may wait it out instead of resizing under it
                self.session.set_budget(budget_bytes, temporary=True)
            except TypeError:  # a session without the notion
                self.session.set_budget(budget_bytes)

    def on_telemetry(self, sample: Any) -> None:
        if hasattr(self.session, "on_telemetry"):
            self.session.on_telemetry(sample)

    def stats(self) -> dict[str, Any]:
        stats = self.session.stats() if hasattr(self.session, "stats") else {}
        return stats.to_json() if hasattr(stats, "to_json") else dict(stats)


def governed_server(
    model: Any, *, budget_bytes: int | None, options: dict[str, Any], gen_kwargs: dict[str, Any]
) -> Any:
    try:
        from memwarden.runtime.session import GovernedSession
    except ImportError as exc:
        raise InputError(
            f"serving mode 'governed' needs memwarden.runtime.session.GovernedSession, which is not available ({exc})"
        ) from None
    from memwarden.runtime.session_config import SessionConfig

    budget = budget_bytes if budget_bytes is not None else "6GiB"  # none in the campaign: the session's old default
    return GovernedServer(GovernedSession(model, budget, config=SessionConfig(**options)), gen_kwargs)


def make_server(
    mode: str, model: Any, *, budget_bytes: int | None, options: dict[str, Any], gen_kwargs: dict[str, Any]
) -> Any:
    """The server of a mode name (``plain``, ``governed``) or of ``package.module:factory``."""
    target = MODES.get(mode, mode)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"unknown serving mode {mode!r}; use {', '.join(MODES)} or package.module:factory")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"serving mode {mode!r}: cannot import {target} ({exc})") from None
    return factory(model, budget_bytes=budget_bytes, options=options, gen_kwargs=gen_kwargs)
