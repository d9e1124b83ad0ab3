"""Structure-aware methods as attention plug-ins; every module here registers itself.

Adding a method: drop a module into this package that defines a ``@register("name")``
subclass of :class:`Method`. It is discovered automatically; the trainer, the decoder
and the model code stay as they are.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

from structnmt.model.methods.base import (
    METHODS,
    AttentionContext,
    AttentionPlugin,
    Method,
    MethodParams,
    RecordKey,
    Site,
    register,
)

__all__ = [
    "METHODS", "AttentionContext", "AttentionPlugin", "Method", "MethodParams", "RecordKey", "Site",
    "register", "build_methods", "structure_needs",
]

_loaded = False
#: modules of this package that hold no method (the interface, the helpers methods share)
_NOT_METHODS = {"base", "shared"}


def _discover() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_METHODS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def build_methods(model_cfg: Any) -> list[Method]:
    """The model's methods, one per ``model.methods`` entry (typed and checked when the config
    was loaded; checked again here against this model, for a ``ModelConfig`` made in code)."""
    _discover()
    model_cfg.validate("model")
    return [METHODS[params.name](params, model_cfg) for params in model_cfg.methods]


def structure_needs(methods: list[Method], inference: bool = False) -> dict[str, set[str]]:
    """Union of the structure fields the methods read, per side."""
    out: dict[str, set[str]] = {"src": set(), "tgt": set()}
    for method in methods:
        table = method.needs_at_inference if inference else method.needs
        for side, fields in table.items():
            out[side].update(fields)
    return out


def method_params_doc(name: str) -> dict[str, Any]:
    """Defaults of a method's parameters (for ``structnmt methods``)."""
    _discover()
    cls = METHODS[name]
    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(cls.Params) if f.name != "name"}


_discover()  # every method registers itself (and its Params, for the config loader) on import
