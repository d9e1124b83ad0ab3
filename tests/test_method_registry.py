"""The checks every registered method gets without a line of its own: a new method is one file
plus the tests of its own formulas.

For each method of the registry (with the entries of ``registry_cases``): its config entry
survives a save and a reload unchanged, a layer or head outside the model is refused naming the
field and the stack, it adds parameters exactly when it says so, and it trains (a finite loss,
gradients that reach every parameter it adds) and translates from source-side fields alone on
the synthetic task. Every recipe in ``configs/`` loads and builds its model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from registry_cases import all_cases, batches, make_model, prepare_synthetic, registered_methods, vocab_size

import structnmt
from structnmt.config import config_from_dict, to_dict
from structnmt.errors import ConfigError
from structnmt.model.losses import label_smoothed_nll
from structnmt.model.search import beam_search
from structnmt.model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
METHOD_CASES = {case: entries for case, entries in all_cases().items() if entries}
pytestmark = pytest.mark.usefixtures("one_thread")


def _model_section(entries: list[dict], **kw) -> dict:
    return {"enc_layers": 2, "dec_layers": 3, "d_model": 32, "n_heads": 4, "d_ff": 64, "methods": entries, **kw}


@pytest.mark.parametrize("case", sorted(METHOD_CASES))
def test_a_method_entry_survives_a_save_and_a_reload(case):
    entries = METHOD_CASES[case]
    cfg = config_from_dict({"model": _model_section(entries)})
    assert [type(p).__name__ for p in cfg.model.methods] == [
        type(p).__name__ for p in config_from_dict({"model": _model_section(entries)}).model.methods]
    saved = to_dict(cfg)
    assert saved["model"]["methods"] == entries  # saved (and hashed) as written
    again = config_from_dict(saved)
    assert again.model.methods == cfg.model.methods and to_dict(again) == saved


@pytest.mark.parametrize("name", sorted(registered_methods()))
def test_a_layer_or_head_outside_the_model_is_refused_naming_the_field_and_the_stack(name):
    entry = next(e for entries in METHOD_CASES.values() for e in entries if e["name"] == name)
    stacks = config_from_dict({"model": _model_section([entry])}).model.methods[0].stacks()
    depth = {"encoder": 2, "decoder": 3}
    past = max(depth[s] for s in stacks) + 1  # beyond every stack the method acts in
    messages = []
    # [past] alone, and 1..past for methods that want layers without gaps (deep context)
    for layers in ([past], list(range(1, past + 1))):
        with pytest.raises(ConfigError) as err:
            config_from_dict({"model": _model_section([{**entry, "layers": layers}])})
        assert err.value.field == "model.methods[0].layers"
        messages.append(str(err.value))
    assert any(f"layer {past} is outside the {s}'s layers 1..{depth[s]}" in m for m in messages for s in stacks), \
        messages
    with pytest.raises(ConfigError) as err:
        config_from_dict({"model": _model_section([{**entry, "heads": [4]}])})
    assert err.value.field == "model.methods[0].heads" and "head 4 is outside 0..3" in str(err.value)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return prepare_synthetic(tmp_path_factory.mktemp("registry"), train=40, test=8)


@pytest.mark.parametrize("case", sorted(METHOD_CASES))
def test_a_method_trains_and_translates_from_source_fields_alone(dataset, case):
    torch.manual_seed(0)
    vocab = vocab_size(dataset)
    model = make_model(case, vocab, dropout=0.0).train()
    vanilla = make_model("vanilla", vocab)
    added = model.num_parameters() - vanilla.num_parameters()
    assert (added > 0) == any(m.adds_parameters for m in model.methods)

    batch = batches(dataset, "train", model)[0]
    out = model(batch)
    loss, _ = label_smoothed_nll(out.logits, batch.tgt_out, 0.1)
    loss = loss + sum(out.losses.values(), torch.zeros(()))
    assert torch.isfinite(loss)
    loss.backward()
    own = {n for n, _ in model.named_parameters()} - {n for n, _ in vanilla.named_parameters()}
    for name, p in model.named_parameters():
        if name in own:  # every parameter the method adds is trained by something
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name

    model.eval()
    src_only = batches(dataset, "test", model, inference=True)[0]
    assert not src_only.struct["tgt"]
    hyps = beam_search(model, src_only, beam=2, max_len_a=0.0, max_len_b=5, nbest=1)
    assert len(hyps) == len(src_only.index) and all(len(h[0].tokens) <= 5 for h in hyps)


@pytest.mark.parametrize("case", sorted(all_cases()))
def test_padding_lengths_to_a_multiple_of_8_changes_no_loss_and_no_gradient(dataset, case):
    """``training.pad_to_multiple`` (8 on CUDA when compiled) must be invisible to every method:
    its tree, scene and distance fields, masks and losses must all ignore the added padding.

    Compared in float64: a padded position that reached a scene, a normalisation or a loss
    would move the result by far more than float64's rounding, while float32 would differ by the
    order of its sums alone (by up to ~1e-6 of a gradient's largest entry, depending on the CPU's
    kernels), which no tolerance can tell from a small leak."""
    results, shapes = [], []
    for multiple in (1, 8):
        torch.manual_seed(0)
        model = make_model(case, vocab_size(dataset), dropout=0.0).eval().double()  # eval: no random draws
        batch = batches(dataset, "train", model, multiple=multiple)[0]
        shapes.append((batch.src.size(1), batch.tgt_in.size(1)))
        out = model(batch)
        loss, _ = label_smoothed_nll(out.logits, batch.tgt_out, 0.1)
        loss = loss + sum(out.losses.values(), torch.zeros((), dtype=torch.float64))
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (short, short_grads), (padded, padded_grads) = results
    assert shapes[1] != shapes[0] and all(n % 8 == 0 for n in shapes[1])  # padding was added
    assert short.dtype == torch.float64
    torch.testing.assert_close(padded, short, rtol=1e-10, atol=1e-12)
    assert padded_grads.keys() == short_grads.keys()
    for name in short_grads:
        scale = short_grads[name].abs().max().item()  # a tolerance from the values: float64 rounding of sums
        torch.testing.assert_close(padded_grads[name], short_grads[name], rtol=1e-9, atol=1e-12 * max(scale, 1.0),
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_padding_stops_at_the_models_positions(dataset):
    """A length rounded up to 8 must not pass ``model.max_positions`` (the positional table's size)."""
    from structnmt.data.batching import collate
    from structnmt.data.dataset import ParallelDataset

    data = ParallelDataset(dataset, "train")
    longest = max(range(len(data)), key=lambda i: len(data.side_arrays(i, "src")["ids"]))
    n = len(data.side_arrays(longest, "src")["ids"]) + 1  # with its EOS
    assert n % 8, "the synthetic task's longest source must not be a multiple of 8 for this test"
    fields = {"src": {"valid"}, "tgt": {"valid"}}
    assert collate(data, [longest], fields, 8).src.size(1) == -(-n // 8) * 8
    assert collate(data, [longest], fields, 8, limit=n).src.size(1) == n  # capped: the model reads n positions
    assert collate(data, [longest], fields, 8, limit=n - 1).src.size(1) == n  # never shorter than the sentence


RECIPES = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_loads_and_builds_its_model(recipe, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = structnmt.load_config(Path("configs") / recipe)
    model = Transformer(cfg.model, 100, 100)  # the recipe's sites exist in the recipe's model
    assert len(model.methods) == len(cfg.model.methods)
    for method in model.methods:
        for site in method.sites():
            assert model.attention(site).site == site


def test_params_say_what_they_hold_after_a_change_in_code_and_are_checked_when_built_in_code():
    from structnmt.model.methods.dbsa import DBSAParams

    cfg = config_from_dict({"model": _model_section([{"name": "lpsi", "synch": "mse", "lambda_synch": 0.1}])})
    params = cfg.model.methods[0]
    assert params.entry() == {"name": "lpsi", "synch": "mse", "lambda_synch": 0.1}  # as written
    params.sync = "rank"  # changed in code: saved and hashed as it now is, not as it was read
    assert params.entry() == {"name": "lpsi", "sync": "rank", "lambda_sync": 0.1}
    with pytest.raises(ConfigError, match=r"model\.methods\[0\]\.name: DBSAParams with name ''"):
        config_from_dict({"model": _model_section([DBSAParams(layers=[1])])})
    with pytest.raises(ConfigError, match=r"model\.methods\[0\]\.stack: name each stack once"):
        config_from_dict({"model": _model_section([DBSAParams(name="dbsa", stack=[])])})


@pytest.mark.parametrize("entry, field", [
    ({"name": "dbsa", "sides": [["src"]]}, "sides"),
    ({"name": "lpsi", "synch": "mse", "synch_layers": [2, "x"]}, "synch_layers[1]"),
    ({"name": "lpsi", "synch": "mse", "synch_layers": [3]}, "synch_layers"),
    ({"name": "syncattn", "sides": ["src"]}, "sides"),
])
def test_an_error_names_the_field_as_the_entry_spells_it(entry, field):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"model": _model_section([entry])})
    assert err.value.field == f"model.methods[0].{field}", str(err.value)
