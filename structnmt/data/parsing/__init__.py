"""Dependency parser back ends: spaCy, Stanza, UDPipe, stored CoNLL-U parses, and a parse cache.

:func:`make_parser` lives here, above the back ends it chooses between, so that they can
import :mod:`~structnmt.data.parsing.base` without a circle.
"""

from __future__ import annotations

from structnmt.config import ParserConfig
from structnmt.data.parsing.base import Parser, finish_tree
from structnmt.data.parsing.cache import CachedParser
from structnmt.errors import ConfigError

__all__ = ["CachedParser", "Parser", "finish_tree", "make_parser"]


def make_parser(cfg: ParserConfig, split: str, processes: int = 1, where: str = "parser") -> Parser | None:
    """The configured back end for one split, or None for ``backend: none``.

    ``where`` is the config path of ``cfg`` (``data.src.parser``), so errors name the field.
    """
    if cfg.backend == "none":
        return None
    if cfg.backend == "spacy":
        from structnmt.data.parsing.spacy_backend import SpacyParser

        return SpacyParser(cfg.model or "", convention=cfg.convention, batch_size=cfg.batch_size,
                           processes=processes, where=where)
    if cfg.backend == "stanza":
        from structnmt.data.parsing.stanza_backend import StanzaParser

        return StanzaParser(cfg.model or "", convention=cfg.convention, where=where)
    if cfg.backend == "udpipe":
        from structnmt.data.parsing.udpipe_backend import UDPipeParser

        return UDPipeParser(cfg.model or "", convention=cfg.convention, where=where)
    if cfg.backend == "conllu":
        from structnmt.data.parsing.conllu_backend import ConlluParser

        if split == "translate" and split not in cfg.conllu:  # the input of `structnmt translate`
            raise ConfigError("the model reads source trees when it translates, and the dataset's trees came from "
                              "stored CoNLL-U files, which cannot parse new text: prepare the data with a parser "
                              "(spacy, stanza or udpipe), or score the dataset's own splits with `structnmt test`",
                              f"{where}.backend")
        if split not in cfg.conllu:
            raise ConfigError(f"no CoNLL-U file for split {split!r} (have: {sorted(cfg.conllu)})",
                              f"{where}.conllu")
        return ConlluParser(cfg.conllu[split], convention=cfg.convention)
    raise ConfigError(f"unknown parser back end {cfg.backend!r}", f"{where}.backend")
