"""SISA: syntactically-informed self-attention (Strubell et al. 2018), the supervised baseline of
pascal-bugliarello2020.

One encoder head scores keys with a bi-affine operator and is trained to attend to each
token's parent (``parent_first``: a word's first sub-word points to its parent word's first
sub-word, other sub-words to their own word's first one). That is DBSA's head on the source
side only, so this module reuses :class:`~structnmt.model.methods.dbsa.BiaffineHeadPlugin` with
the baseline's defaults:

* layer 1: Bugliarello & Okazaki place their syntax heads in the first layer and report the
  same trend (lower layers are better) for SISA;
* one head; source side only;
* ``lambda_dep = 1``: the baseline maximises the *joint* probability of translations and
  parents, i.e. the two log-likelihoods are added unweighted.

The loss is logged as ``sisa_src``.
"""

from __future__ import annotations

from dataclasses import dataclass

from structnmt.errors import ConfigError
from structnmt.method_config import Stack
from structnmt.model.methods.base import register
from structnmt.model.methods.dbsa import DBSA, DBSAParams


@dataclass
class SISAParams(DBSAParams):
    stack: Stack | list[Stack] = "encoder"
    lambda_dep: float = 1.0

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.stacks() != ["encoder"]:
            raise ConfigError("SISA supervises an encoder head only (use dbsa for the decoder)",
                              f"{where}.stack")


@register("sisa")
class SISA(DBSA):
    """One encoder head supervised to attend to each token's dependency parent (Strubell et al. 2018)."""

    Params = SISAParams
    loss_prefix = "sisa"
