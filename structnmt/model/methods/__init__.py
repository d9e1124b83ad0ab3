"""Structure-aware methods as attention plug-ins; every module here registers itself.

Adding a method: drop a module into this package that defines a ``@register("name")``
subclass of :class:`Method`. It is discovered automatically; the trainer, the decoder
and the model code stay as they are. A method kept outside the package (a user's own
module) is found the same way when ``STRUCTNMT_METHODS`` names its module (``mymethods`` or
``a.b,c``; every process a command, a study or ``torchrun`` starts inherits it), or when an
installed package declares it as an entry point of the group ``structnmt.methods``. A module
the variable names must import (the user asked for it); an installed package's entry point that
does not is a warning, and the error only of a config that names a method it did not register,
so that a broken package that was never asked for does not stop every command.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import pkgutil
import sys
import traceback
from collections.abc import Callable
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
    "register", "build_methods", "discover", "structure_needs",
]

#: modules of this package that hold no method (the interface, the helpers methods share)
_NOT_METHODS = {"base", "shared"}
#: modules outside the package that define methods, comma-separated
METHODS_ENV = "STRUCTNMT_METHODS"
#: the entry-point group through which an installed package offers its methods
ENTRY_POINT_GROUP = "structnmt.methods"
#: outside modules already imported, and whether the entry points were
_loaded_outside: set[str] = set()
_entry_points_loaded = False
#: entry points that failed to import: what went wrong, for the error of an unknown method
broken_entry_points: list[str] = []


def _discover_package() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_METHODS and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def discover() -> None:
    """Register the methods kept outside the package (the package's own register on import).

    Called where the registry is first read (a config's method entries, a model's methods,
    ``structnmt methods``), not when this package is imported, so that a user's module may import
    any part of structnmt; the variable is read each time, and a module that failed is tried again."""
    global _entry_points_loaded
    for module in filter(None, (part.strip() for part in os.environ.get(METHODS_ENV, "").split(","))):
        if module not in _loaded_outside:
            _load_outside(lambda module=module: importlib.import_module(module), module, f"module {module!r}",
                          METHODS_ENV)
            _loaded_outside.add(module)
    if not _entry_points_loaded:
        for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            package = f" of {point.dist.name}" if point.dist is not None else ""
            try:
                _load_outside(point.load, point.module, f"{point.value!r} (entry point {point.name!r}{package})",
                              f"entry points {ENTRY_POINT_GROUP}")
            except ConfigError as err:
                broken_entry_points.append(str(err))
                print(f"warning: {err}; its methods are not available (fix or uninstall the package)",
                      file=sys.stderr)
                continue
            _loaded_outside.add(point.module)
        _entry_points_loaded = True


def outside_modules() -> list[str]:
    """The modules outside the package whose methods this process registered (a study record
    names them: their code is not in structnmt's commit)."""
    return sorted(_loaded_outside)


def _load_outside(load: Callable[[], object], module: str, what: str, where: str) -> None:
    """Import a module of methods kept outside the package; a failure names the module and the
    line of the user's code that raised (one line on the command line; the cause stays chained)."""
    try:
        load()
    except Exception as err:
        library = os.path.dirname(importlib.__file__)
        frames = [f for f in traceback.extract_tb(err.__traceback__)
                  if not f.filename.startswith(("<", library)) and f.filename != __file__]
        at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        missing = isinstance(err, ModuleNotFoundError) and err.name is not None \
            and (module == err.name or module.startswith(err.name + "."))
        hint = " (is its folder on PYTHONPATH?)" if missing else ""
        raise ConfigError(f"cannot import {what}{hint}: {type(err).__name__}: {err}{at}", where) from err


def build_methods(model_cfg: Any) -> list[Method]:
    """The model's methods, one per ``model.methods`` entry (typed and checked when the config
    was loaded; checked again here against this model, for a ``ModelConfig`` made in code)."""
    discover()
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
    discover()
    cls = METHODS[name]
    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(cls.Params) if f.name != "name"}


_discover_package()  # every method of the package registers itself (and its Params, for the config loader)
