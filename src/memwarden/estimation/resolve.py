"""Resolving MODEL: a zoo name (``llava``, ``qwen2-vl:small``), a named real model (a
config.json shipped in ``memwarden/models/configs``, by its name or by the Hub id its model card
shows, ``Qwen/Qwen2-VL-2B-Instruct``, in any case) or the path of a config.json or of a folder
holding one, into a transformers config and the model class that runs it.

A named model takes the image processor settings its published checkpoint ships
(``configs/processors/NAME.json``: its preprocessor_config.json, kept as data), as
``from_pretrained`` of its Hub id would; a name that is none of these gets the nearest names
(difflib) in its error."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from pathlib import Path
from typing import Any

from memwarden.errors import InputError
from memwarden.estimation.checkpoint import CheckpointTensors, read_checkpoint
from memwarden.estimation.processor_file import read_json, read_processor_file, read_processor_settings
from memwarden.estimation.quantized import Scheme, parse_scheme
from memwarden.untrusted import terminal_safe

__all__ = ["CONFIG_DIR", "ResolvedModel", "hub_ids", "model_names", "resolve_model", "shipped_name"]

CONFIG_DIR = Path(__file__).parent.parent / "models" / "configs"
PROCESSOR_DIR = CONFIG_DIR / "processors"  # NAME.json: the published preprocessor_config.json's settings
HUB_IDS_FILE = CONFIG_DIR / "hub_ids.toml"


# -- model names ------------------------------------------------------------------------------


def model_names() -> dict[str, list[str]]:
    """Valid MODEL names: zoo models and the named real models shipped with memwarden."""
    from memwarden.models import zoo

    return {"zoo": list(zoo.NAMES), "real": _shipped_names()}


def _shipped_names() -> list[str]:
    """The shipped configs' names (without importing the zoo, and so torch: a kept estimate is
    looked up by name before anything is built)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


@functools.lru_cache(maxsize=1)
def hub_ids() -> dict[str, str]:
    """Hub id (as the model card spells it) -> shipped config name (``configs/hub_ids.toml``)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    data = tomllib.loads(HUB_IDS_FILE.read_text())
    return {str(k): str(v) for k, v in data.items()}


def shipped_name(model: str) -> str | None:
    """The shipped config ``model`` names: its own name, its Hub id (``org/name``) or the name part of
    one, in any case (the Hub's ids are case-insensitive); None when it names none."""
    names = {n.lower(): n for n in _shipped_names()}
    key = model.strip().lower()
    if key in names:
        return names[key]
    ids = {hub.lower(): name for hub, name in hub_ids().items()}
    if key in ids:
        return ids[key]
    if "/" not in key:  # "Qwen2-VL-2B-Instruct": a Hub id without its org, when only one id ends so
        found = {name for hub, name in ids.items() if hub.rpartition("/")[2] == key}
        if len(found) == 1:
            return found.pop()
    return None


def _near_misses(model: str) -> list[str]:
    """The names closest to ``model`` (difflib), spelled as a user types them: Hub ids, shipped and zoo names."""
    from memwarden.models import zoo

    spelled = {hub.lower(): hub for hub in hub_ids()}
    spelled |= {n.lower(): n for n in (*model_names()["real"], *zoo.NAMES)}
    key = model.strip().lower()
    found = difflib.get_close_matches(key, list(spelled), n=3, cutoff=0.75)
    if not found and "/" in key:  # the org mistyped or another one's: match the name part
        tails = {k.rpartition("/")[2]: k for k in spelled if "/" in k}
        found = [tails[t] for t in difflib.get_close_matches(key.rpartition("/")[2], list(tails), n=3, cutoff=0.75)]
    return [spelled[k] for k in found]


class ResolvedModel:
    """A config ready to build: its name, family (transformers model_type) and model class."""

    def __init__(
        self,
        name: str,
        config: Any,
        model_class: str,
        source: str,
        checkpoint_dtype: str | None = None,
        scheme: Scheme | None = None,
        checkpoint: CheckpointTensors | None = None,
        processor_settings: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.model_class = model_class
        self.source = source
        self.checkpoint_dtype = checkpoint_dtype  # torch_dtype / dtype of config.json; None: not stated
        self.scheme = scheme  # the quantization_config's layout; None: not quantized
        self.checkpoint = checkpoint  # a local folder's safetensors tensors (headers only); None: config only
        # the image processor settings beside config.json (preprocessor_config.json); None: the class's
        self.processor_settings = processor_settings

    @property
    def default_dtype(self) -> str:
        """The dtype an estimate runs in unless told: the checkpoint's, float32 when it states none."""
        return self.checkpoint_dtype or "float32"

    @property
    def family(self) -> str:
        return str(self.config.model_type)


def resolve_model(model: str) -> ResolvedModel:
    """Zoo name (``NAME`` or ``NAME:SIZE``) | named real model | config.json path | folder; else InputError."""
    from memwarden.models import zoo

    if not isinstance(model, str) or not model.strip():
        raise InputError(f"MODEL must be a name or a path; got {model!r}")
    name, _, size = model.partition(":")
    if name in zoo.NAMES:
        size = size or "tiny"
        if size not in zoo.SIZES:
            raise InputError(f"unknown zoo size {size!r} for {name}; valid sizes: {', '.join(zoo.SIZES)}")
        return ResolvedModel(
            model, zoo.build_config(name, size), zoo.spec(name, size).model_class, f"zoo:{name}:{size}"
        )
    named = CONFIG_DIR / f"{model}.json"
    if "/" not in model and "\\" not in model and named.is_file():  # a name, never a path into the folder
        return _shipped(model)
    path = Path(model).expanduser()
    if path.is_dir():
        folder = path
        path = path / "config.json"
        if not path.is_file():
            raise InputError(f"{model}: the folder holds no config.json")
        resolved = _from_file(path, folder.resolve().name)
        resolved.checkpoint = read_checkpoint(folder)  # safetensors headers only; None when the folder has none
        resolved.processor_settings = read_processor_settings(folder)
        return resolved
    if path.is_file():
        resolved = _from_file(path, path.parent.name if path.name == "config.json" else path.stem)
        if path.name == "config.json":  # a checkpoint's config.json: its processor settings beside it
            resolved.processor_settings = read_processor_settings(path.parent)
        return resolved
    # a local folder named like a Hub id (a download's --local-dir) is the user's and came first
    shipped = shipped_name(model)
    if shipped is not None:
        return _shipped(shipped)
    names = model_names()
    near = _near_misses(model)
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    raise InputError(
        f"unknown model {model!r}{hint}; valid names: zoo {', '.join(names['zoo'])}; real {', '.join(names['real'])} "
        "(or their Hub ids, e.g. Qwen/Qwen2-VL-2B-Instruct); or the path of a config.json (or of a folder holding one)"
    )


def _shipped(name: str) -> ResolvedModel:
    """A shipped config, with the image processor settings of its published checkpoint where it ships them."""
    resolved = _from_file(CONFIG_DIR / f"{name}.json", name)
    published = PROCESSOR_DIR / f"{name}.json"
    if published.is_file():
        resolved.processor_settings = read_processor_file(published)
    return resolved


_MAX_CONFIG_BYTES = 4 * 1024**2  # real config.json files are a few KiB
# Sizes beyond any real model: a config declaring them would make the meta run take hours, or the
# image processor allocate gigabytes (an image is resized to the tower's image_size before it is
# measured; the largest real one is 1540, Mistral 3's).
_SIZE_LIMITS = {
    "num_hidden_layers": 1024,
    "num_layers": 1024,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 19,
    "vocab_size": 1 << 24,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "image_size": 1 << 11,
    "head_dim": 1 << 14,
    "num_mel_bins": 1 << 12,
    "mm_tokens_per_image": 1 << 16,
    "max_position_embeddings": 1 << 23,
}
_SIZE_FLOORS = {"patch_size": 2}  # a 1-pixel patch makes an image hundreds of thousands of tokens
# Integer fields the table does not name, by what their names say they count (checked when they are
# integers; other types are transformers' to judge). Layers and depths are loops the meta run goes
# through (a 2**64-deep vision tower never ends); sizes and dims become tensor shapes and token counts.
_NAMED_LIMITS = (
    (("layers", "depth", "depths"), 1024),
    (("heads",), 4096),
    (("_size", "_dim", "d_model", "_tokens", "_length", "_latents", "_frames", "_positions"), 1 << 24),
    (("_pinpoints",), 1 << 12),
)
# Any other integer: token ids, rope bases and the like stay far below this in every real config.
_MAX_ANY_INT = 1 << 40


def _named_limit(key: str) -> int:
    lowered = key.lower()
    for endings, limit in _NAMED_LIMITS:
        if lowered.endswith(endings):
            return limit
    return _MAX_ANY_INT


def _check_numbers(key: str, value: Any, path: Path, where: str) -> None:
    """Every integer under ``key`` (itself, or inside its lists) within the key's limit; no NaN/inf."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{path}: {where} = {value!r} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool):
        limit = _named_limit(key)
        if not -_MAX_ANY_INT <= value <= limit:
            raise InputError(
                f"{path}: {where} = {terminal_safe(value)[:40]} is beyond any real model's (at most {limit} for {key!r})"
            )


def _check_sizes(data: Any, path: Path, depth: int = 0, where: str = "", key: str = "") -> None:
    if depth > 8:
        raise InputError(f"{path}: config nested deeper than any real one")
    if isinstance(data, dict):
        for key, value in data.items():
            shown = terminal_safe(key)[:80]  # a key is the file's text too
            name = f"{where}.{shown}" if where else shown
            limit = _SIZE_LIMITS.get(key, 1 << 15 if key in _SIZE_FLOORS else None)
            if limit is not None and value is not None:
                floor = _SIZE_FLOORS.get(key, 1)
                # [448, 448]; or one value per layer or stage (Gemma 3n's intermediate_size, Florence-2's
                # DaViT patch_size), as many as a model has layers
                sizes = (
                    value
                    if isinstance(value, list) and 0 < len(value) <= _SIZE_LIMITS["num_hidden_layers"]
                    else [value]
                )
                if any(isinstance(v, bool) or not isinstance(v, int) or not floor <= v <= limit for v in sizes):
                    raise InputError(
                        f"{path}: {name} = {terminal_safe(value)[:40]} is not a size this tool accepts ({floor}..{limit})"
                    )
            if isinstance(value, (dict, list)) and key not in _SIZE_LIMITS and key not in _SIZE_FLOORS:
                _check_sizes(value, path, depth + 1, name, str(key))
            else:
                _check_numbers(str(key), value, path, name)
    elif isinstance(data, list):
        for i, value in enumerate(data[:4096]):
            name = f"{where}[{i}]"
            if isinstance(value, (dict, list)):
                _check_sizes(value, path, depth + 1, name, key)
            else:
                _check_numbers(key, value, path, name)


def _from_file(path: Path, name: str) -> ResolvedModel:
    import transformers

    from memwarden.estimation.families import model_class_for

    data = read_json(path, _MAX_CONFIG_BYTES, "config.json")
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a config.json (the top level is not an object)")
    # "_source"/"_memwarden..." keys are memwarden's notes (where a shipped config comes from)
    data = {k: v for k, v in data.items() if not k.startswith(("_memwarden", "_source"))}
    family = data.get("model_type")
    if not isinstance(family, str) or family not in transformers.CONFIG_MAPPING:
        raise InputError(
            f"{path}: model_type {str(family)[:80]!r} is not a transformers {transformers.__version__} model type"
        )
    _check_sizes(data, path)
    try:
        config = transformers.CONFIG_MAPPING[family].from_dict(data)
    except Exception as exc:  # a config transformers rejects
        raise InputError(
            f"{path}: transformers cannot read this config ({exc.__class__.__name__}: {terminal_safe(exc)[:200]})"
        ) from None
    model_class = model_class_for(family, data.get("architectures"), str(path))
    quant = data.get("quantization_config")
    if quant is None and isinstance(data.get("text_config"), dict):
        quant = data["text_config"].get("quantization_config")
    try:
        scheme = parse_scheme(quant)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    if scheme is not None and _saved_by_transformers_5(data):
        scheme = dataclasses.replace(scheme, new_names_only=True)
    return ResolvedModel(name, config, model_class, str(path), _checkpoint_dtype(data), scheme)


def _saved_by_transformers_5(data: dict[str, Any]) -> bool:
    """Whether config.json says transformers 5 or later wrote it ("5.24.0", "5.0.0.dev0")."""
    version = data.get("transformers_version")
    major = version.split(".", 1)[0] if isinstance(version, str) else ""
    return major.isdigit() and int(major) >= 5


_DTYPE_NAMES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}


def _checkpoint_dtype(data: dict[str, Any]) -> str | None:
    """The dtype config.json says the weights are stored in (``torch_dtype``, ``dtype`` in newer files)."""
    text = data.get("text_config")
    for source in (data, text if isinstance(text, dict) else {}):
        for key in ("dtype", "torch_dtype"):
            value = source.get(key)
            if isinstance(value, str) and value.removeprefix("torch.") in _DTYPE_NAMES:
                return _DTYPE_NAMES[value.removeprefix("torch.")]
    return None
