"""A trained model ready to use from Python: raw text in, detokenised translations out.

:func:`load_translator` (``structnmt.load``) rebuilds a checkpoint's model with the
preprocessing of the dataset it was trained on (Moses, SentencePiece, the parser when a
method reads source trees at test time), checking that the two belong together. The
:class:`Translator` it returns translates exactly as ``structnmt translate`` does with the
same settings, shows every attention matrix of a sentence pair, and scores given
references under the model.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structnmt.config import DecodingConfig, ExperimentConfig, check_beam
from structnmt.data.batch import PAD_ID
from structnmt.data.batching import collate_examples
from structnmt.data.corpus import control_character
from structnmt.data.example import Example, Side
from structnmt.data.pipeline import Preprocessor
from structnmt.decoding.attention_maps import AttentionMaps, attention_maps
from structnmt.decoding.translate import length_batches, translate_lines
from structnmt.errors import CheckpointError, ConfigError, DataError
from structnmt.model.transformer import Transformer


def resolve_device(spec: str | torch.device | None, where: str = "--device") -> torch.device:
    """``None`` or ``"auto"``: the GPU when there is one, else the CPU; otherwise the device named."""
    if isinstance(spec, torch.device):
        return spec
    if spec is None or spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"not a device: {spec!r}", where) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {spec!r} asked for, but no CUDA GPU is available", where)
    return device


def dataset_labels(dataset_dir: Path) -> list[str]:
    """The dependency-label list of a prepared dataset (label ids of the S&H features)."""
    meta = json.loads((Path(dataset_dir) / "meta.json").read_text(encoding="utf-8"))
    return meta.get("labels") or []


def dataset_of_checkpoint(checkpoint: Path, config: dict[str, Any],
                          vocab: dict[str, Any] | None = None) -> Path:
    """The dataset a checkpoint was trained on, found from the run, not from the current directory.

    ``data.dir`` is relative to where training ran. Looked for, in order: relative to the
    directory the run directory was named from (while the checkpoint still sits in its
    ``training.out_dir``, so a moved or copied project keeps working); the absolute path
    training recorded (``vocab.dataset``); and only then relative to the current directory
    (checkpoints moved out of their run). A user's own ``./demo/dataset`` must never stand in
    for a test's or another project's dataset of the same relative name."""
    data = config.get("data") or {}
    if not data.get("dir"):
        raise CheckpointError(f"{checkpoint}: the checkpoint names no dataset; give the dataset directory")
    named = Path(data["dir"])
    if named.is_absolute():
        return named
    out_dir = Path((config.get("training") or {}).get("out_dir", ""))
    run = checkpoint.resolve().parent
    if out_dir.parts and not out_dir.is_absolute() and run.parts[-len(out_dir.parts):] == out_dir.parts:
        root = run.parents[len(out_dir.parts) - 1]
        if (root / named / "meta.json").exists():
            return root / named
    recorded = (vocab or {}).get("dataset")
    if isinstance(recorded, str) and (Path(recorded) / "meta.json").exists():
        return Path(recorded)
    return named


def load_translator(checkpoint: str | Path, device: str | torch.device | None = None,
                    dataset: str | Path | None = None) -> Translator:
    """Rebuild the model of ``checkpoint`` on ``device`` with its dataset's preprocessing.

    ``dataset`` defaults to the dataset the model was trained on; another one must have the
    same vocabulary (:class:`CheckpointError` otherwise).
    """
    from structnmt.training.checkpoint import load_checkpoint, load_model

    checkpoint = Path(checkpoint)
    target = resolve_device(device)
    if dataset is None:
        state = load_checkpoint(checkpoint)
        dataset = dataset_of_checkpoint(checkpoint, state.get("config") or {}, state.get("vocab"))
    if (Path(dataset) / "meta.json").is_file():  # an incomplete one is named, not taken for another vocabulary
        from structnmt.data.dataset import check_meta, read_meta

        check_meta(read_meta(dataset), dataset)
    model, cfg, info = load_model(checkpoint, target, dataset_dir=dataset)
    return Translator(model, cfg, Preprocessor.from_dataset(dataset), Path(dataset), target, info)


def _sentences(sentences: str | Sequence[str], argument: str = "sentences") -> list[str]:
    """A list of sentences; one string is one sentence (not a sequence of characters)."""
    if isinstance(sentences, str):
        sentences = [sentences]
    if isinstance(sentences, (bytes, bytearray)):  # a Sequence of ints: would read as "sentence 1 is a int"
        raise DataError("got bytes, not a str: decode them first (text.decode('utf-8'))", argument)
    if not isinstance(sentences, Sequence):
        raise DataError(f"expected a str or a list of str, got {type(sentences).__name__}", argument)
    out = list(sentences)
    for number, sentence in enumerate(out, start=1):
        if isinstance(sentence, (bytes, bytearray)):
            raise DataError(f"sentence {number} is bytes, not a str: decode it first (text.decode('utf-8'))",
                            argument)
        if not isinstance(sentence, str):
            raise DataError(f"sentence {number} is a {type(sentence).__name__}, not a str", argument)
        ch = control_character(sentence)
        if ch is not None:  # as `structnmt translate` refuses it in a line of its input
            advice = "a text of several lines is a list of sentences: text.splitlines()" if ch in "\n\r" else \
                "remove it"
            raise DataError(f"sentence {number} holds control character U+{ord(ch):04X}: {advice}", argument)
    return out


class Translator:
    """A trained model and the preprocessing of its dataset (made by ``structnmt.load``).

    ``model`` (a :class:`~structnmt.model.transformer.Transformer` in eval mode), ``config``
    (the :class:`~structnmt.config.ExperimentConfig` it was trained with), ``preprocessor``,
    ``dataset_dir``, ``device`` and ``info`` (step, epoch, vocabulary, path) stay reachable
    for whatever the methods below do not cover.
    """

    def __init__(self, model: Transformer, config: ExperimentConfig, preprocessor: Preprocessor,
                 dataset_dir: Path, device: torch.device, info: dict[str, Any]) -> None:
        self.model = model
        self.config = config
        self.preprocessor = preprocessor
        self.dataset_dir = dataset_dir
        self.device = device
        self.info = info
        self.labels = dataset_labels(dataset_dir)

    def __repr__(self) -> str:
        return (f"Translator({self.info.get('path')!r}, step {self.info.get('step')}, "
                f"{self.model.num_parameters():,} parameters, {self.device})")

    def decoding(self, **changes: Any) -> DecodingConfig:
        """The checkpoint's decoding settings with ``changes`` (those not None) applied, checked."""
        from structnmt.config import convert

        hints = typing.get_type_hints(DecodingConfig)
        given = {k: convert(hints[k], v, k) for k, v in changes.items() if v is not None}  # beam="5" names beam
        if "beam" in given:
            check_beam(given["beam"], "beam")  # before a search of 10**6 rows, naming the argument
        settings = dataclasses.replace(self.config.decoding, **given)
        try:
            settings.validate("decoding")
        except ConfigError as err:  # a setting given here is named as the argument, not the config field
            name = (err.field or "").removeprefix("decoding.")
            if name in given:
                raise ConfigError(err.message, name) from None
            raise
        return settings

    def nbest(self, sentences: str | Sequence[str], n: int, beam: int | None = None,
              length_penalty: float | None = None, max_len_a: float | None = None,
              max_len_b: int | None = None, max_tokens: int | None = None,
              source: str = "<input>") -> list[list[str]]:
        """The ``n`` best detokenised translations of every sentence, best first, in input order
        (``source`` names the input in messages, as for :meth:`translate`)."""
        from structnmt.config import convert

        n = convert(int, n, "n")  # nbest(s, '2') names n, not a TypeError from max()
        if n < 1:
            raise ConfigError(f"must be at least 1, got {n}", "n")
        check_beam(n, "n")  # n best need a beam of n
        beam = None if beam is None else convert(int, beam, "beam")
        if beam is not None and n > beam:
            raise ConfigError(f"{n} best need a beam of at least {n}, got beam={beam}", "n")
        settings = self.decoding(beam=beam if beam is not None else max(n, self.config.decoding.beam),
                                 nbest=n, length_penalty=length_penalty, max_len_a=max_len_a,
                                 max_len_b=max_len_b, max_tokens=max_tokens)
        return self._translate(_sentences(sentences), settings, source)

    def translate(self, sentences: str | Sequence[str], beam: int | None = None,
                  length_penalty: float | None = None, max_len_a: float | None = None,
                  max_len_b: int | None = None, max_tokens: int | None = None,
                  source: str = "<input>", truncated: list[int] | None = None) -> list[str]:
        """One detokenised translation per sentence, in input order.

        Settings left at None are the checkpoint's (``decoding`` section: beam 5, length
        penalty 0.6 unless the config said otherwise); ``beam=1`` is greedy decoding. The
        output is the ``structnmt translate`` output for the same settings. A sentence longer
        than the model reads is translated from its longest prefix of whole words that fits,
        with a warning naming ``source`` and its number (appended to ``truncated``).
        """
        settings = self.decoding(beam=beam, nbest=1, length_penalty=length_penalty, max_len_a=max_len_a,
                                 max_len_b=max_len_b, max_tokens=max_tokens)
        return [hyps[0] for hyps in self._translate(_sentences(sentences), settings, source, truncated)]

    def _translate(self, lines: list[str], settings: DecodingConfig, source: str = "<input>",
                   truncated: list[int] | None = None) -> list[list[str]]:
        if not lines:
            return []
        return translate_lines(self.model, self.preprocessor, lines, settings, self.device, labels=self.labels,
                               source=source, truncated=truncated)

    def attention(self, source: str, target: str | None = None) -> AttentionMaps:
        """Every layer's and head's self- and cross-attention on one sentence pair.

        Without ``target`` the model's own translation (as :meth:`translate` gives it) is
        used. Arrays are float32: ``encoder`` (layers, heads, I, I), ``decoder`` (layers,
        heads, J, J), ``cross`` (layers, heads, J, I), labelled by ``source_tokens`` (I sub-words
        ending in ``</s>``) and ``target_tokens`` (J: ``<s>`` and the target's sub-words).
        """
        for name, text in (("source", source), ("target", target)):
            if not isinstance(text, str) and (name == "source" or text is not None):
                raise ConfigError(f"expected one sentence (a str), got {type(text).__name__}: attention maps are "
                                  "of one sentence pair at a time", name)
        (example,) = self.encode_sources([source])
        batch = collate_examples([example], self.source_fields(), self.labels)
        ids = None if target is None else self.target_ids(target)
        return attention_maps(self.model, self.preprocessor, batch, self.config.decoding, ids)

    @torch.no_grad()
    def score(self, sources: str | Sequence[str], references: str | Sequence[str],
              normalise: bool = False) -> list[float]:
        """The model's log-probability (natural log) of each reference given its source.

        Summed over the reference's sub-words and the final ``</s>``, or their mean with
        ``normalise``: the same number beam search ranks hypotheses by, before the length
        penalty. For BLEU or chrF of translations use ``structnmt.evaluate``.
        """
        self.model.eval()
        sources, references = _sentences(sources, "sources"), _sentences(references, "references")
        if len(sources) != len(references):
            raise DataError(f"{len(sources)} sources but {len(references)} references")
        examples = self.encode_sources(sources)
        for example, reference in zip(examples, references):
            example.tgt = Side(ids=self.target_ids(reference))
        fields = self.source_fields()
        out = np.zeros(len(examples))
        lengths = [max(len(ex.src.ids), len(ex.tgt.ids)) for ex in examples]  # type: ignore[union-attr]
        for indices in length_batches(lengths, self.config.decoding.max_tokens):
            batch = collate_examples([examples[i] for i in indices], fields, self.labels).to(self.device)
            struct = {"src": batch.struct["src"], "tgt": {}}
            logits = self.model.decode(batch.tgt_in, self.model.encode(batch.src, struct))
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            picked = logprobs.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)
            real = batch.tgt_out.ne(PAD_ID)
            total = (picked * real).sum(dim=1)
            if normalise:
                total = total / real.sum(dim=1)
            out[indices] = total.double().cpu().numpy()
        return out.tolist()

    # -- pieces ------------------------------------------------------------------
    def source_fields(self) -> dict[str, set[str]]:
        needs = self.model.structure_needs(inference=True)
        return {"src": needs["src"], "tgt": set()}

    def encode_sources(self, sources: list[str]) -> list[Example]:
        """Source examples as ``translate`` builds them (parsed only if a method reads trees)."""
        limit = self.model.cfg.max_positions - 1
        examples = self.preprocessor.encode_sources(sources, with_structure=bool(self.source_fields()["src"]),
                                                    path="<input>")
        for number, example in enumerate(examples, start=1):
            if len(example.src.ids) > limit:
                raise DataError(f"{len(example.src.ids)} sub-words; the model reads at most {limit} "
                                "(model.max_positions)", "<input>", number)
        return examples

    def target_ids(self, text: str) -> np.ndarray:
        pre = self.preprocessor
        ids, _ = pre.subwords["tgt"].encode(pre.tokenise("tgt", text))
        limit = self.model.cfg.max_positions - 1
        if len(ids) > limit:
            raise DataError(f"the target has {len(ids)} sub-words; the model reads at most {limit} "
                            "(model.max_positions)")
        return ids
