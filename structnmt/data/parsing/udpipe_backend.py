"""UDPipe 1 dependency parses (optional: used only when ``ufal.udpipe`` is installed).

The tokenizer runs with ``ranges`` so every token carries ``TokenRange=start:end`` (its
character offsets in the line), and with ``presegmented`` so a line stays one sentence;
should it still produce several, they are joined as in the spaCy back end.
"""

from __future__ import annotations

from pathlib import Path

import conllu

from structnmt.data.example import DepTree
from structnmt.data.parsing.base import Convention, finish_tree
from structnmt.errors import ParserError


class UDPipeParser:
    def __init__(self, model_path: str, convention: Convention | None = None, where: str = "parser") -> None:
        try:
            from ufal.udpipe import Model, Pipeline
        except ImportError:
            raise ParserError(f"{where}.backend: ufal.udpipe is not installed "
                              "(`pip install ufal.udpipe`)") from None
        model = Model.load(model_path)
        if model is None:
            raise ParserError(f"{where}.model: cannot load the UDPipe model {model_path!r}")
        self._model = model
        self._pipeline = Pipeline(model, "tokenize=ranges;presegmented", Pipeline.DEFAULT, Pipeline.DEFAULT,
                                  "conllu")
        self.name = f"udpipe:{Path(model_path).name}"
        self.version = "1"
        self.convention: Convention = convention or "ud"

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        from ufal.udpipe import ProcessingError

        trees = []
        for k, text in enumerate(texts):
            error = ProcessingError()
            out = self._pipeline.process(text, error)
            if error.occurred():
                raise ParserError(f"UDPipe failed on line {lines[k] if lines else k + 1}: {error.message}")
            words: list[str] = []
            spans: list[tuple[int, int]] = []
            heads: list[int] = []
            labels: list[str] = []
            for sent in conllu.parse(out):
                base = len(words)
                span = None
                for token in sent:
                    misc = token.get("misc") or {}
                    if "TokenRange" in misc:
                        start, end = misc["TokenRange"].split(":")
                        span = (int(start), int(end))
                    if not isinstance(token["id"], int):
                        continue  # a multi-word token's range line: its words follow with its span
                    assert span is not None
                    words.append(token["form"])
                    spans.append(span)
                    head = token["head"]
                    heads.append(base + (head - 1 if head else token["id"] - 1))
                    labels.append(token["deprel"])
            tree = finish_tree(text, words, spans, heads, labels, parser=f"{self.name} {self.version}")
            tree.check(None, lines[k] if lines else k + 1)
            trees.append(tree)
        return trees
