"""Device placement over the whole method registry, without a GPU.

A tensor made on the CPU while the model lives on a GPU is a crash (or a silent host copy
per step) that only the first user with a GPU would see. Two nets catch it here:

* the model, every method's auxiliary loss and backward, and the model's side of beam search
  (encode, beam expansion, cached decoding steps, cache re-ordering) run with parameters and
  batch on the ``meta`` device: any CPU tensor mixed in raises "Tensor on device cpu is not on the
  expected device meta". Meta tensors hold no values, so the few places that read one (is
  there padding at all? are the labels in range?) are answered "no" by a dispatch mode;
* beam search reads values, so it (with training and greedy search) runs on the CPU under a
  ``TorchFunctionMode`` that fails on any tensor factory call (``arange``, ``zeros``,
  ``tensor``, ...) made without a device: on a GPU that call would make a CPU tensor.

Checked against the bug: with ``device=`` removed from the ``arange`` in ``local_window.py``'s
bias, both tests fail for ``local_window`` (the meta pass with "Tensor on device meta is not
on the expected device cpu"); with the head index (``base.py``) and head mask (``shared.py``)
built on the CPU and copied, as they were before, the factory test fails for the methods
that use them.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from structnmt.data.batch import BOS_ID
from structnmt.model.losses import label_smoothed_nll
from structnmt.model.search import beam_search, greedy_search
from tests.registry_cases import (
    all_cases,
    batches,
    covered_methods,
    make_model,
    prepare_synthetic,
    registered_methods,
    vocab_size,
)

FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.empty_strided, torch.tensor,
             torch.as_tensor, torch.scalar_tensor, torch.eye, torch.rand, torch.randn, torch.randint, torch.randperm,
             torch.linspace, torch.logspace, torch.tril_indices, torch.triu_indices}


class FactoriesNeedADevice(TorchFunctionMode):
    """Records every tensor factory call without ``device=`` made from structnmt's code."""

    def __init__(self) -> None:
        super().__init__()
        self.offenders: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            ours = [f for f in traceback.extract_stack()[:-1] if "/structnmt/" in f.filename]
            if ours:
                self.offenders.add(f"{ours[-1].filename.split('/structnmt/')[-1]}:{ours[-1].lineno} "
                                   f"torch.{func.__name__}")
        return func(*args, **kwargs)


class MetaValues(TorchDispatchMode):
    """Answers a value read of a meta tensor (``bool(t.any())``, ``int(t.max())``) with False / 0."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
            return False if args[0].dtype == torch.bool else 0
        return func(*args, **(kwargs or {}))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return prepare_synthetic(tmp_path_factory.mktemp("device"), train=40, test=12)


def test_every_registered_method_is_covered():
    assert registered_methods() == covered_methods()
    assert len(registered_methods()) >= 10  # the registry was found at all


def _train_pass(model, batch) -> None:
    out = model(batch)
    loss, _ = label_smoothed_nll(out.logits, batch.tgt_out, 0.1)
    total = loss + sum(out.losses.values())
    total.backward()
    return out


def _beam_steps(model, source_only, beam: int = 3):
    """What beam search asks of the model: encode, expand to beams, two cached steps with the
    cache re-ordered between them (the search's own bookkeeping reads values: the factory test
    covers it)."""
    n = source_only.size
    device = source_only.src.device
    with torch.no_grad():
        enc = model.encode(source_only.src, {"src": source_only.struct["src"], "tgt": {}})
        enc = enc.index_select(torch.arange(n, device=device).repeat_interleave(beam))
        cache = model.new_cache()
        tokens = torch.full((n * beam, 1), BOS_ID, dtype=torch.long, device=device)
        first = model.decode(tokens, enc, cache=cache)
        type(model).reorder_cache(cache, torch.arange(n * beam, device=device).flip(0))
        return first, model.decode(tokens, enc, cache=cache)


@pytest.mark.parametrize("case", sorted(all_cases()))
def test_model_losses_and_backward_stay_on_the_model_device(dataset, case):
    model = make_model(case, vocab_size(dataset)).train()
    batch = batches(dataset, "train", model)[0]
    source_only = batches(dataset, "test", model, inference=True)[0]
    model.to("meta")
    batch, source_only = batch.to("meta"), source_only.to("meta")
    with MetaValues():
        out = _train_pass(model, batch)
        model.eval()
        steps = _beam_steps(model, source_only)
    assert out.logits.device.type == "meta"
    assert all(v.device.type == "meta" for v in out.losses.values())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.device.type == "meta" for g in grads)
    assert all(step.device.type == "meta" for step in steps)


@pytest.mark.parametrize("case", sorted(all_cases()))
def test_no_tensor_is_made_without_the_inputs_device(dataset, case):
    model = make_model(case, vocab_size(dataset)).train()
    batch = batches(dataset, "train", model)[0]
    source_only = batches(dataset, "test", model, inference=True)[0]
    mode = FactoriesNeedADevice()
    with mode:
        _train_pass(model, batch)
        greedy_search(model, source_only, max_len_a=0.0, max_len_b=4)
        beams = beam_search(model, source_only, beam=3, max_len_a=0.0, max_len_b=4)
    assert len(beams) == source_only.size
    assert not mode.offenders, f"tensors made without the inputs' device at {sorted(mode.offenders)}"
