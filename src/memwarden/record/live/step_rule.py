"""What a step is: the outermost module calls that the trace counts as a model call.

A step is an outermost call of a model (the root module). With autograd on, an outermost call of a
part the program calls itself is one too (``get_image_features``: tower and projector, a graph
each). Under ``no_grad`` a part that ``generate`` calls is not, but a part the user's own script
calls is (``clip.vision_model(pixels)`` in a loop over video chunks): neither a layer of a
``ModuleList`` nor a leaf (an embedding lookup), nor a call a module's own method makes (a
hand-written decoder's ``step`` calling its layers). ``sites.CallSites.called_from_user`` reads who
called. A part that generates itself (a decoder with its own ``generate``, which the root's
``generate`` calls instead of the root's forward) is a step wherever it is called from.
"""

from __future__ import annotations

import torch

from memwarden.record.live.sites import CallSites

__all__ = ["starts_step"]


_GENERATES: dict[type, bool] = {}  # by class: transformers answers can_generate from the class


def _generates(module: torch.nn.Module) -> bool:
    """A part that is a generating model itself: a VLM whose ``generate`` runs the vision tower and
    then its decoder's own ``generate`` (BLIP, InstructBLIP) never calls the root's forward, so the
    decoder's outermost calls are the run's prefill and decode steps."""
    known = _GENERATES.get(type(module))
    if known is not None:
        return known
    can = getattr(module, "can_generate", None)
    answer = False
    if callable(getattr(module, "generate", None)) and callable(can):
        try:
            answer = bool(can())
        except Exception:  # a model's own can_generate that cannot answer: not a generating part
            answer = False
    _GENERATES[type(module)] = answer
    return answer


def starts_step(module: torch.nn.Module, path: str, callers: CallSites | None) -> bool:
    """Whether an outermost call of ``module`` (at ``path`` in its root; ``""``: the root) is a step."""
    if path == "" or (torch.is_grad_enabled() and not torch.is_inference_mode_enabled()):
        return True
    if _generates(module):  # a language model part with its own generate (BLIP's text decoder)
        return True
    return (
        callers is not None
        and not path.rsplit(".", 1)[-1].isdigit()  # a ModuleList's layer is no model part,
        and next(module.children(), None) is not None  # nor a leaf
        and callers.called_from_user()
    )
