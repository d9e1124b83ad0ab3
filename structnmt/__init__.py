"""structnmt: structure-aware neural machine translation.

From Python (``structnmt.api`` documents every function)::

    import structnmt

    translator = structnmt.load("demo/run/best.pt")
    translator.translate(["the dog sees a cat ."])          # -> list[str]
    maps = translator.attention("the dog sees a cat .")      # every layer's and head's attention
    structnmt.evaluate(["a hypothesis"], ["a reference"])    # sacreBLEU scores

The functions are imported on first use, so ``import structnmt`` stays cheap (no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from structnmt.errors import CheckpointError, ConfigError, DataError, ParserError, StructNMTError

__version__ = "0.1.0"

#: public name -> the module that defines it (imported when the name is first used)
_LAZY = {
    **{name: "structnmt.api" for name in (
        "load", "load_config", "prepare", "prepare_multi30k", "train", "test", "evaluate", "average", "demo",
        "report", "plot_attention", "plot_curves", "inspect", "methods", "train_parser", "evaluate_parser",
        "run_study", "study_status", "study_report", "study_compare", "download", "prepare_stage",
        "export_ctranslate2", "export_trees", "import_trees",
    )},
    "Translator": "structnmt.decoding.translator",
    "AttentionMaps": "structnmt.decoding.attention_maps",
    "ExperimentConfig": "structnmt.config",
}

__all__ = [
    "AttentionMaps", "CheckpointError", "ConfigError", "DataError", "ExperimentConfig", "ParserError",
    "StructNMTError", "Translator", "__version__", "average", "demo", "download", "evaluate", "evaluate_parser",
    "export_ctranslate2", "export_trees", "import_trees", "inspect", "load", "load_config", "methods",
    "plot_attention", "plot_curves", "prepare", "prepare_multi30k", "prepare_stage", "report", "run_study",
    "study_compare", "study_report", "study_status", "test", "train", "train_parser",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'structnmt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
