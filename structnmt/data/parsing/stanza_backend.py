"""Stanza dependency parses (optional: used only when the ``stanza`` package is installed).

Stanza tokenises itself (``tokenize_no_ssplit`` keeps one sentence per line) and gives every
token its character offsets, which we keep; handing it pre-tokenised text would lose them.
The words of a multi-word token (French "du" = "de le") share that token's span.
"""

from __future__ import annotations

from structnmt.data.example import DepTree
from structnmt.data.parsing.base import Convention, finish_tree
from structnmt.errors import ParserError


class StanzaParser:
    def __init__(self, lang: str, convention: Convention | None = None, where: str = "parser") -> None:
        try:
            import stanza
        except ImportError:
            raise ParserError(f"{where}.backend: stanza is not installed (`pip install stanza`)") from None
        try:
            self.nlp = stanza.Pipeline(lang, processors="tokenize,mwt,pos,lemma,depparse",
                                       tokenize_no_ssplit=True, download_method=None, verbose=False)
        except Exception as err:  # stanza raises many types for a missing model
            raise ParserError(f"{where}.model: cannot load the Stanza model for {lang!r} "
                              f"(download it with stanza.download({lang!r})): {err}") from None
        self.name = f"stanza:{lang}"
        self.version = stanza.__version__
        self.convention: Convention = convention or "ud"

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        trees = []
        for k, text in enumerate(texts):
            doc = self.nlp(text)
            words: list[str] = []
            spans: list[tuple[int, int]] = []
            heads: list[int] = []
            labels: list[str] = []
            for sent in doc.sentences:
                base = len(words)
                for token in sent.tokens:
                    for word in token.words:
                        words.append(word.text)
                        spans.append((token.start_char, token.end_char))
                        # stanza heads are 1-based within the sentence, 0 for the root
                        heads.append(base + (word.head - 1 if word.head > 0 else word.id - 1))
                        labels.append(word.deprel)
            tree = finish_tree(text, words, spans, heads, labels, parser=f"{self.name} {self.version}")
            tree.check(None, lines[k] if lines else k + 1)
            trees.append(tree)
        return trees
