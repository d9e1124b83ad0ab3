"""Universal Dependencies parsers: train one from CoNLL-U treebanks, score any against gold.

Heads are 0-based with the root pointing to itself throughout, as in
:class:`structnmt.data.example.DepTree`.
"""

from structnmt.parsers.ud_eval import evaluate_parser, format_scores, score_trees, universal_label
from structnmt.parsers.ud_train import UDSentence, read_conllu, train_ud_parser

__all__ = [
    "UDSentence",
    "evaluate_parser",
    "format_scores",
    "read_conllu",
    "score_trees",
    "train_ud_parser",
    "universal_label",
]
