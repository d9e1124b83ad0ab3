"""Structure-aware methods as attention plug-ins; every module here registers itself.

Adding a method: drop a module into this package that defines a ``@register("name")``
subclass of :class:`Method`. It is discovered automatically; the trainer, the decoder
and the model code stay as they are. A method kept outside the package (a user's own
module) is found the same way when ``STRUCTNMT_METHODS`` names its module (``mymethods`` or
``a.b,c``; every process a command, a study or ``torchrun`` starts inherits it), or when an
installed package declares it as an entry point of the group ``structnmt.methods``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import pkgutil
import traceback
from typing import Any

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
    "register", "build_methods", "structure_needs",
]

_loaded = False
#: modules of this package that hold no method (the interface, the helpers methods share)
_NOT_METHODS = {"base", "shared"}
#: modules outside the package that define methods, comma-separated
METHODS_ENV = "STRUCTNMT_METHODS"
#: the entry-point group through which an installed package offers its methods
ENTRY_POINT_GROUP = "structnmt.methods"


def _discover() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_METHODS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    for module in filter(None, (part.strip() for part in os.environ.get(METHODS_ENV, "").split(","))):
        _load_outside(lambda module=module: importlib.import_module(module), f"module {module!r}", METHODS_ENV)
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        _load_outside(point.load, f"{point.value!r} (entry point {point.name!r})", f"entry points {ENTRY_POINT_GROUP}")
    _loaded = True


def _load_outside(load: Any, what: str, where: str) -> None:
    """Import a module of methods kept outside the package; a failure names the module and the
    line that failed (the user's own code: a ConfigError, not a traceback through structnmt)."""
    try:
        load()
    except Exception as err:
        frames = [f for f in traceback.extract_tb(err.__traceback__)[1:]
                  if not f.filename.startswith("<") and f.filename not in (importlib.__file__, __file__)]
        at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        hint = " (is its folder on PYTHONPATH?)" if isinstance(err, ModuleNotFoundError) else ""
        raise ConfigError(f"cannot import {what}{hint}: {type(err).__name__}: {err}{at}", where) from None


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
