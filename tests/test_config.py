"""Configs are refused with a message that names the bad field."""

from __future__ import annotations

import pytest

import structnmt
from structnmt.config import config_from_dict, load_config, to_dict
from structnmt.errors import ConfigError


def test_unknown_field_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_modle: 256\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: model\.d_modle: unknown field \(did you mean 'd_model'\? "):
        load_config(path)
    # the top level lists what a user writes there: base, not the loader's own path
    path.write_text("modle: {}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (f"{path}: modle: unknown field (did you mean 'model'? known fields: base, data, "
                                 "decoding, model, training)")
    path.write_text("training: {zzz: 1}\n")  # nothing close: no guess
    with pytest.raises(ConfigError, match=r"training\.zzz: unknown field \(known fields: "):
        load_config(path)


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match=r"training\.max_tokens: expected an integer, got 'many'"):
        config_from_dict({"training": {"max_tokens": "many"}})


def test_heads_must_divide_model_size():
    with pytest.raises(ConfigError, match=r"model\.n_heads: n_heads \(3\) must divide d_model \(256\)"):
        config_from_dict({"model": {"n_heads": 3, "d_model": 256}})


def test_bool_is_not_an_integer():
    with pytest.raises(ConfigError, match="training.seed"):
        config_from_dict({"training": {"seed": True}})


def test_base_configs_are_merged(tmp_path):
    (tmp_path / "base.yaml").write_text("model:\n  d_model: 64\n  n_heads: 4\ntraining:\n  lr: 0.01\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\nmodel:\n  n_heads: 2\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.training.lr) == (64, 2, 0.01)


def test_null_in_an_extending_config_removes_the_base_s_key(tmp_path):
    """A recipe adapted to one's own data must be able to drop the recipe's test sets."""
    (tmp_path / "base.yaml").write_text(
        "data:\n  dir: ds\n  src: {lang: en}\n  tgt: {lang: de}\n"
        "  splits:\n    train: {src: a.en, tgt: a.de}\n    test_2016: {src: t.en, tgt: t.de}\n"
        "training:\n  lr: 0.01\n")
    (tmp_path / "child.yaml").write_text(
        "base: base.yaml\ndata:\n  splits:\n    train: {src: mine.en, tgt: mine.de}\n    test_2016: null\n"
        "    test: {src: mt.en, tgt: mt.de}\ntraining:\n  lr: null\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert sorted(cfg.data.splits) == ["test", "train"] and cfg.data.splits["train"].src == "mine.en"
    assert cfg.training.lr == type(cfg.training)().lr  # a removed field is back at its default


def test_invalid_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_method_entries_are_typed_and_checked_when_the_config_is_read(tmp_path):
    from structnmt.model.methods.pascal import PascalParams

    with pytest.raises(ConfigError, match=r"^model\.methods\[0\]\.name: unknown method 'nosuch'"):
        config_from_dict({"model": {"methods": [{"name": "nosuch"}]}})
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  enc_layers: 1\n  methods: [{name: pascal, layers: [2]}]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: model\.methods\[0\]\.layers: layer 2 is outside"):
        load_config(path)
    path.write_text("model:\n  enc_layers: 2\n  methods: [{name: pascal, layers: [2], heads: all}]\n")
    params = load_config(path).model.methods[0]
    assert isinstance(params, PascalParams) and params.layers == [2] and params.variance == 1.0
    # a config saves (and hashes) each entry as written, not its typed expansion
    assert to_dict(load_config(path))["model"]["methods"] == [{"name": "pascal", "layers": [2], "heads": "all"}]


def test_config_module_does_not_import_the_model():
    import subprocess
    import sys

    code = ("import sys, structnmt.config; "
            "print(any(m.startswith(('structnmt.model', 'torch')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_method_layers_are_checked_against_the_stack_where_the_method_acts():
    """A decoder-side DBSA head on a decoder deeper than the encoder: accepted (it was refused as
    'outside the encoder's layers 1..3'); a layer past the decoder is refused naming the decoder."""
    deep_decoder = {"model.dec_layers": 6}
    cfg = structnmt.load_config("configs/multi30k_en_fr_dbsa.yaml", {
        **deep_decoder, "model.methods": [{"name": "dbsa", "sides": ["tgt"], "layers": [5], "heads": [0]}]})
    assert cfg.model.methods[0].layers == [5] and cfg.model.methods[0].stacks() == ["decoder"]
    past_decoder = "layer 7 is outside the decoder's layers 1..6"
    for entry, message in (
        ({"name": "dbsa", "sides": ["tgt"], "layers": [7], "heads": [0]}, past_decoder),
        ({"name": "lpsi", "sides": ["tgt"], "layers": [7]}, past_decoder),
        ({"name": "deps_san", "layers": [5]}, "layer 5 is outside the encoder's layers 1..3"),
    ):
        with pytest.raises(ConfigError, match=f"model.methods.0..layers: {message}"):
            structnmt.load_config("configs/multi30k_en_fr_dbsa.yaml", {**deep_decoder, "model.methods": [entry]})


def test_cuda_graphs_takes_auto_on_or_off_and_names_itself_otherwise(tmp_path):
    assert config_from_dict({}).training.cuda_graphs == "auto"
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  cuda_graphs: off\n")  # YAML 1.1 reads off as false
    assert load_config(path).training.cuda_graphs == "off"
    with pytest.raises(ConfigError, match=r"training\.cuda_graphs: must be one of \['auto', 'on', 'off'\], got 'yes'"):
        config_from_dict({"training": {"cuda_graphs": "yes"}})


def test_an_nbest_wider_than_the_beam_names_both() -> None:
    from structnmt.config import DecodingConfig

    with pytest.raises(ConfigError, match=r"^decoding\.nbest: must be between 1 and the beam size \(2\), got 3$"):
        DecodingConfig(beam=2, nbest=3).validate("decoding")


def test_base_and_path_are_not_fields_to_set(tmp_path):
    """--set path=x was taken and silently dropped; base=... was offered as its own correction."""
    (tmp_path / "c.yaml").write_text("model: {d_model: 64}\n")
    for key in ("path", "base"):
        with pytest.raises(ConfigError, match=rf"{key}: not a field to set"):
            load_config(tmp_path / "c.yaml", {key: "other.yaml"})
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"base": "other.yaml"})
    assert "did you mean" not in str(caught.value) and "known fields: data, decoding" in str(caught.value)
