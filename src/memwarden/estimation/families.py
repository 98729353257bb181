"""Which transformers class runs a config: looked up only in transformers' own auto mappings.

A config.json is untrusted input: the class it names in ``architectures`` is used only when it
is one of the classes transformers' auto mappings list for its ``model_type`` and is a
``PreTrainedModel`` subclass; nothing else named by a config is ever looked up or called.
"""

from __future__ import annotations

from typing import Any

from memwarden.errors import InputError

__all__ = ["allowed_classes", "model_class_for"]

# The task mappings a generate() request can run, most specific first: the class picked when
# ``architectures`` names none of a family's classes.
_GENERATE_MAPPINGS = (
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
)


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    return []


def allowed_classes(family: str) -> list[str]:
    """Class names transformers' auto mappings give ``family``, generate-capable ones first."""
    from transformers.models.auto import modeling_auto

    ordered: list[str] = []
    mappings = [m for m in _GENERATE_MAPPINGS if hasattr(modeling_auto, m)]
    mappings += sorted(m for m in dir(modeling_auto) if m.endswith("_MAPPING_NAMES") and m not in mappings)
    for mapping in mappings:
        table = getattr(modeling_auto, mapping)
        if isinstance(table, dict):
            for name in _names(table.get(family)):
                if name not in ordered:
                    ordered.append(name)
    return ordered


def _generate_classes(family: str) -> list[str]:
    from transformers.models.auto import modeling_auto

    out: list[str] = []
    for mapping in _GENERATE_MAPPINGS:
        table = getattr(modeling_auto, mapping, {})
        out += [n for n in _names(table.get(family)) if n not in out]
    return out


def model_class_for(family: str, architectures: Any, where: str) -> str:
    """The class to build: the first of ``architectures`` the mappings list for ``family`` (and that
    generates), else the family's generate class; InputError when transformers has none."""
    import transformers

    allowed = allowed_classes(family)
    generating = _generate_classes(family)
    for name in _names(architectures):
        if name in allowed and name in generating and _is_model_class(transformers, name):
            return name
    for name in generating:
        if _is_model_class(transformers, name):
            return name
    raise InputError(
        f"{where}: transformers {transformers.__version__} has no generating model class for model_type "
        f"{family!r} (its auto mappings list {', '.join(allowed) or 'none'})"
    )


def _is_model_class(transformers: Any, name: str) -> bool:
    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):  # a class whose optional backend is missing
        return False
    return isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
