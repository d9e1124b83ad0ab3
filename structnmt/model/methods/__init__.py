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

from structnmt.config import from_dict
from structnmt.errors import ConfigError
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
    "register", "build_methods", "validate_method_configs", "structure_needs",
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


def _parse(entry: dict[str, Any], model_cfg: Any, where: str) -> Method:
    _discover()
    name = entry.get("name")
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r} (known: {', '.join(sorted(METHODS))})", f"{where}.name")
    cls = METHODS[name]
    params = from_dict(cls.Params, dict(entry), where)
    if params.stack == "encoder" and params.attention == "cross":
        raise ConfigError("the encoder has no cross-attention", f"{where}.attention")
    try:
        method = cls(params, model_cfg)
    except ConfigError as err:
        if err.field and not err.field.startswith(where):
            raise ConfigError(str(err).split(": ", 1)[-1], f"{where}.{err.field}") from None
        raise
    # layers are checked where the method acts (its sites), against that stack's depth: a
    # method placed by ``sides`` (DBSA, LPSI, ...) ignores ``stack``
    depths = {"encoder": model_cfg.enc_layers, "decoder": model_cfg.dec_layers}
    for site in method.sites():
        depth = depths[site.stack]
        if not 0 <= site.layer < depth:
            raise ConfigError(f"layer {site.layer + 1} is outside the {site.stack}'s layers 1..{depth}",
                              f"{where}.layers")
    for head in method.head_list():
        if not 0 <= head < model_cfg.n_heads:
            raise ConfigError(f"head {head} is outside 0..{model_cfg.n_heads - 1}", f"{where}.heads")
    return method


def build_methods(model_cfg: Any) -> list[Method]:
    return [_parse(e, model_cfg, f"model.methods[{i}]") for i, e in enumerate(model_cfg.methods)]


def validate_method_configs(model_cfg: Any, path: str | None = None) -> None:
    """Check every ``model.methods`` entry: a known name, valid parameters, layers and heads
    inside the model. The registry checks its own entries (``config.py`` checks the rest);
    errors name the entry's field, after the config file ``path`` when given."""
    try:
        build_methods(model_cfg)
    except ConfigError as err:
        if path is None:
            raise
        raise ConfigError(str(err), path=path) from None


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
