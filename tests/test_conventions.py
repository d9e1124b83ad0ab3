"""Trees of two annotation conventions are never synchronised (issue: UD on every side)."""

from __future__ import annotations

import json

import pytest

from structnmt.config import ModelConfig
from structnmt.errors import ConfigError
from structnmt.model.transformer import Transformer
from structnmt.training.trainer import check_conventions


def dataset(tmp_path, src: str, tgt: str | None):
    parsers = {"src": {"name": "a", "convention": src}, "tgt": None if tgt is None else {"convention": tgt}}
    (tmp_path / "meta.json").write_text(json.dumps({"parsers": parsers}))
    return tmp_path


def model(methods):
    return Transformer(ModelConfig(d_model=32, n_heads=4, d_ff=64, methods=methods), 20, 20)


def test_syncattn_refuses_mixed_conventions(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.src\.parser: .*ud trees on the source side and clearnlp"):
        check_conventions(model([{"name": "syncattn"}]), dataset(tmp_path, "ud", "clearnlp"))
    with pytest.raises(ConfigError, match=r"^c\.yaml: data\.src\.parser: the model's methods read trees on both sides"):
        check_conventions(model([{"name": "syncattn"}]), dataset(tmp_path, "ud", "clearnlp"), "c.yaml")


def test_same_convention_or_one_sided_methods_pass(tmp_path):
    check_conventions(model([{"name": "syncattn"}]), dataset(tmp_path, "ud", "ud"))
    # PASCAL reads source trees only: the target parser's convention does not matter
    check_conventions(model([{"name": "pascal"}]), dataset(tmp_path, "clearnlp", "ud"))
    check_conventions(model([]), dataset(tmp_path, "ud", None))
