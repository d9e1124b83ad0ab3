"""Dependency parser back ends: spaCy, Stanza, UDPipe, stored CoNLL-U parses, and a parse cache."""

from structnmt.data.parsing.base import Parser, finish_tree, make_parser
from structnmt.data.parsing.cache import CachedParser

__all__ = ["CachedParser", "Parser", "finish_tree", "make_parser"]
