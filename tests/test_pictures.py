"""Pictures exist, open as PNG, have the asked-for size and are not blank."""

from __future__ import annotations

import json

import matplotlib.image
import numpy as np
import pytest

from structnmt.errors import DataError
from structnmt.evaluation.buckets import Bucket
from structnmt.visualisation.attention import plot_attention
from structnmt.visualisation.curves import plot_training_curves
from structnmt.visualisation.lengths import plot_bleu_by_length


def check_png(path, width, height):
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (height, width)
    assert image[..., :3].var() > 0
    assert not list(path.parent.glob(f".{path.name}.*.tmp"))  # no temporary left behind


WORDS = "the cat sat on the mat".split()


@pytest.mark.parametrize("structure", ["none", "arcs", "scenes"])
def test_attention_heat_map(tmp_path, structure):
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(6), size=6)
    arcs = [(0, 1), (1, 2), (2, 2), (3, 5), (4, 5), (5, 2)] if structure == "arcs" else None
    scenes = [[0, 1, 2], [3, 4, 5]] if structure == "scenes" else None
    out = plot_attention(weights, WORDS, WORDS, tmp_path / f"{structure}.png", arcs=arcs, scenes=scenes,
                         title="layer 1 head 1", figsize=(5, 6), dpi=50)
    check_png(out, 250, 300)


def test_attention_shape_mismatch(tmp_path):
    with pytest.raises(ValueError, match="shape"):
        plot_attention(np.ones((2, 3)), ["a", "b"], ["a", "b"], tmp_path / "x.png")


def test_bleu_by_length_picture(tmp_path):
    def buckets(shift):
        return [Bucket(0, 10, 5, 30 + shift, 50), Bucket(10, 20, 3, 25 + shift, 45),
                Bucket(20, float("inf"), 0, None, None)]

    out = plot_bleu_by_length({"base": buckets(0), "pascal": buckets(2)}, tmp_path / "len.png",
                              figsize=(6, 4), dpi=50)
    check_png(out, 300, 200)


def test_training_curves_picture(tmp_path):
    for name, offset in (("base", 0.0), ("pascal", 0.3)):
        run = tmp_path / name
        run.mkdir()
        records = [{"kind": "train", "step": s, "loss": 5 - s / 50 + offset, "tgt_tokens_per_s": 1000}
                   for s in range(10, 110, 10)]
        records += [{"kind": "valid", "step": s, "loss": 4 - s / 60, "bleu": s / 5 + offset}
                    for s in (50, 100)]
        (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = plot_training_curves([tmp_path / "base", tmp_path / "pascal"], tmp_path / "curves.png",
                               figsize=(9, 3), dpi=50)
    check_png(out, 450, 150)
    with pytest.raises(DataError, match="missing: no such run folder or log file$"):
        plot_training_curves([tmp_path / "missing"], tmp_path / "c2.png")
    (tmp_path / "fresh").mkdir()
    with pytest.raises(DataError, match=r"fresh/log.jsonl: no training log here \(a run folder holds log.jsonl"):
        plot_training_curves([tmp_path / "fresh"], tmp_path / "c2.png")
