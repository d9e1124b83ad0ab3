"""``structnmt plot attention``: one head's attention on one sentence, with its structure on top.

The sentence is raw text (parsed when the dataset's parser can parse new text, so that the
arcs can be drawn) or a line of a prepared split (with its stored trees and scenes). The
weights come from :func:`~structnmt.decoding.attention_maps.attention_maps` on the model's
own translation, the same one ``translate`` gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from structnmt.decoding.translator import Translator
from structnmt.errors import ConfigError, DataError
from structnmt.visualisation.attention import figure_format, plot_attention


def _structure_drawing(heads: list[int], word_index: np.ndarray, scene_members: list[tuple[int, int]] | None
                       ) -> tuple[list[tuple[int, int]], list[list[int]] | None]:
    """Arcs between the first sub-words of dependent and head; scenes as lists of sub-words."""
    first = {int(w): int(np.flatnonzero(word_index == w)[0]) for w in np.unique(word_index) if w >= 0}
    arcs = [(first[d], first[h]) for d, h in enumerate(heads) if d != h and d in first and h in first]
    scenes = None
    if scene_members:
        groups: dict[int, list[int]] = {}
        for word, scene in scene_members:
            groups.setdefault(int(scene), []).extend(np.flatnonzero(word_index == word).tolist())
        scenes = [sorted(g) for g in groups.values()]
    return arcs, scenes


def plot_model_attention(translator: Translator, out: str | Path, sentence: str | None = None,
                         split: str = "test", line: int | None = None,
                         attention: Literal["encoder", "cross"] = "encoder", layer: int = 1, head: int = 0) -> Path:
    """Draw head ``head`` (0-based) of encoder self-attention or cross-attention in ``layer``
    (1-based) for ``sentence``, or for line ``line`` (1-based) of the prepared ``split``."""
    from structnmt.data.batch import Batch
    from structnmt.data.batching import collate, collate_examples
    from structnmt.data.dataset import ParallelDataset
    from structnmt.decoding.attention_maps import attention_maps

    figure_format(out)  # a name that cannot be written is refused before the translation
    model, pre = translator.model, translator.preprocessor
    depth = model.cfg.enc_layers if attention == "encoder" else model.cfg.dec_layers
    if not 1 <= layer <= depth:
        raise ConfigError(f"layer {layer} is outside 1..{depth}", "--layer")
    if not 0 <= head < model.cfg.n_heads:
        raise ConfigError(f"head {head} is outside 0..{model.cfg.n_heads - 1}", "--head")
    if (sentence is None) == (line is None):
        raise ConfigError("give a sentence or a line of a prepared split (one of them)", "--sentence")
    if sentence is not None and not sentence.strip():
        raise ConfigError("the sentence is empty: there is no attention to draw", "--sentence")
    fields = model.structure_needs(inference=True)
    fields = {"src": fields["src"] | {"word_index"}, "tgt": set()}
    heads = word_index = scene_members = None
    if sentence is not None:  # raw text: parsed if a method needs it and the parser can
        parser_ok = pre.side_cfg("src").parser.backend not in ("none", "conllu")
        if fields["src"] - {"word_index"} and not parser_ok:
            raise ConfigError("this model needs source trees and the dataset's parser cannot parse new text; "
                              "draw a line of a prepared split instead", "--sentence")
        example = pre.encode_sources([sentence], with_structure=parser_ok, path="<sentence>")[0]
        if example.src.word_index is None:
            fields["src"].discard("word_index")
        batch = collate_examples([example], fields, translator.labels)
        if example.src.tree is not None:
            heads, word_index = example.src.tree.heads, np.asarray(example.src.word_index)
            scene_members = example.src.scenes.members if example.src.scenes is not None else None
    else:  # a sentence of a prepared split, with its stored structure
        data = ParallelDataset(translator.dataset_dir, split)
        places = data.scored_positions()  # lines count as in eval/<split>.*, set-aside empty sources included
        total = len(data) + len(data.set_aside())
        if not 1 <= line <= total:  # type: ignore[operator]
            raise DataError(f"line {line} is outside 1..{total}", data.path)
        if line - 1 not in places:  # type: ignore[operator]
            raise DataError(f"line {line} has an empty source: there is no attention to draw", data.path)
        i = places.index(line - 1)  # type: ignore[operator]
        full = collate(data, np.array([i]), fields)
        batch = Batch(full.src, struct={"src": full.struct["src"], "tgt": {}})
        arrays = data.side_arrays(i, "src")
        if "heads" in arrays:
            heads, word_index = arrays["heads"].tolist(), np.asarray(arrays["word_index"])
            if "scene_members" in arrays:
                scene_members = [tuple(m) for m in np.asarray(arrays["scene_members"]).reshape(-1, 2)]
    maps = attention_maps(model, pre, batch, translator.config.decoding)
    if attention == "encoder":
        weights, rows = maps.encoder[layer - 1, head], maps.source_tokens
    else:
        weights, rows = maps.cross[layer - 1, head], maps.target_tokens
    arcs = scenes = None
    if heads is not None and attention == "encoder":
        arcs, scenes = _structure_drawing(heads, word_index, scene_members)  # type: ignore[arg-type]
    return plot_attention(weights, rows, maps.source_tokens, Path(out), arcs=arcs, scenes=scenes,
                          title=f"{attention} layer {layer} head {head}")
