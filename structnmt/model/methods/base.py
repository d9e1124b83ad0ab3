"""The plug-in interface for structure-aware attention.

A *method* (PASCAL, Deps-SAN, SASA, DBSA, ...) is one small module in this package.
It declares

* which structure fields it reads (``needs``; e.g. ``{"src": ("parent_mid",)}``) and which
  of those it still needs at translation time (``needs_at_inference``),
* where it acts (:class:`Site`: encoder/decoder, self/cross attention, layers, heads),
* how it changes attention, through the hooks of :class:`AttentionPlugin`:

  ``queries(q)`` / ``keys(k)``   before the scores         (SACrA, context-aware SAN)
  ``scores(S)``                   before the softmax        (PASCAL, Deps-SAN, Localness, LPSI)
  ``bias()``                      additive, fused-kernel OK (Wink masks, local windows)
  ``probs(A)``                    after the softmax         (UDISCAL, SASA), and where
                                  auxiliary losses are read (DBSA, SISA)
  ``extra_output(A)``             added to ``A V``          (relative positions on values)
  ``additive()``, ``score_mod()`` fused forms of ``scores`` (LPSI, relative positions; PASCAL, Deps-SAN)
  ``prob_scale()``                fused form of ``probs``   (SASA, UDISCAL)

* and, for losses that span layers (SyncAttn, SynchMSE/Rank), ``Method.loss(records)``
  reading the attention tensors it asked for in ``Method.records()``.

The trainer and the decoder never name a method: they call the model, and the model
calls whatever plug-ins the config attached. A new method is a new file here with a
``@register("name")`` class; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor, nn

from structnmt.method_config import METHOD_PARAMS, MethodParams, Site

__all__ = ["METHODS", "AttentionContext", "AttentionPlugin", "Method", "MethodParams", "RecordKey", "Site", "register"]
P = TypeVar("P", bound=MethodParams)

RecordKey = tuple[str, int, str, str]  # (stack, layer 0-based, "self"|"cross", name)


class AttentionContext:
    """Everything a plug-in may read inside one attention call.

    Shapes: ``q`` is (B, H, I, d_head), ``k`` and ``v`` are (B, H, J, d_head). Query rows are
    positions ``q_offset .. q_offset+I-1`` of the query sentence (``q_offset > 0`` only in
    incremental decoding). ``struct`` holds the structure tensors of both sides
    (``struct["src"]["dist"]`` ...), built only for the fields some method asked for.
    """

    def __init__(
        self,
        site: Site,
        struct: dict[str, dict[str, Tensor]],
        key_padding: Tensor | None,
        causal: bool,
        training: bool,
        q_offset: int = 0,
        records: dict[RecordKey, Tensor] | None = None,
        requested: set[RecordKey] | frozenset = frozenset(),
        losses: dict[str, Tensor] | None = None,
        key_input: Tensor | None = None,
        key_proj: Any = None,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.site = site
        self.struct = struct
        self.key_padding = key_padding  # (B, J) True at padding
        self.causal = causal
        self.training = training
        self.q_offset = q_offset
        self.records = records
        self.requested = requested
        self.losses = losses if losses is not None else {}
        self.key_input = key_input  # (B, J, d_model): what the keys were projected from
        self.key_proj = key_proj  # callable: (B, J, d_model) -> (B, H, J, d_head)
        self.state = state  # per-sentence decoding state a plug-in may cache in (incremental decoding)
        self.q: Tensor | None = None
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def side(self, which: str | None = None) -> dict[str, Tensor]:
        """Structure fields of ``which`` ("src"/"tgt"), by default of the query side."""
        return self.struct.get(which or self.site.struct_side, {})

    def key(self, name: str) -> RecordKey:
        return (self.site.stack, self.site.layer, self.site.attention, name)

    def wants(self, name: str) -> bool:
        """True if a method's loss or an analysis asked for this site's tensor ``name``."""
        return self.records is not None and self.key(name) in self.requested

    def record(self, name: str, value: Tensor) -> None:
        """Keep a tensor for a model-level loss or an analysis, if someone asked for it."""
        if self.wants(name):
            self.records[self.key(name)] = value  # type: ignore[index]

    def add_loss(self, name: str, value: Tensor) -> None:
        """Add a (weighted) auxiliary loss term; the trainer sums and logs each term by name."""
        self.losses[name] = self.losses[name] + value if name in self.losses else value


#: FlexAttention's ``score_mod``: ``(score, b, h, q_idx, kv_idx) -> score`` on 0-d tensors, where
#: ``score`` is QK^T/sqrt(d) of one cell and ``q_idx`` counts this call's rows (add ``ctx.q_offset``)
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class AttentionPlugin(nn.Module):
    """Changes some heads of one attention module. Override only the hooks you need.

    ``heads`` are 0-based head indices. Every hook receives and returns full (B, H, ...)
    tensors and must leave other heads, padding keys and special-token rows untouched.

    Fused kernels (``structnmt/model/attention.py``): a layer runs SDPA or FlexAttention instead
    of the explicit (B, H, I, J) matrices when every plug-in sets ``explicit = False`` and gives
    each ``scores``/``probs`` hook it overrides a fused form: ``additive`` (SDPA and FlexAttention)
    or ``score_mod`` (FlexAttention only) for ``scores``, ``prob_scale`` (SDPA only) for
    ``probs``. ``bias`` needs no other form. A test (``tests/test_fused_structure.py``) checks
    that every route gives the explicit path's outputs and gradients.
    """

    #: True if the plug-in needs the explicit score or weight matrices: it reads them (a loss, a
    #: value term) or replaces them in a way no fused kernel expresses. False: the layer may run a
    #: fused kernel, which receives the plug-in's queries/keys, ``bias`` and the fused forms above.
    explicit: ClassVar[bool] = True

    def __init__(self, heads: list[int]) -> None:
        super().__init__()
        self.heads = list(heads)
        self._head_index: dict[torch.device, Tensor] = {}

    def head_index(self, device: torch.device) -> Tensor:
        """The plug-in's heads as a tensor on ``device``, made once (no host copy per call)."""
        cached = self._head_index.get(device)
        if cached is None:
            cached = self._head_index[device] = torch.tensor(self.heads, dtype=torch.long, device=device)
        return cached

    def queries(self, q: Tensor, ctx: AttentionContext) -> Tensor:
        return q

    def keys(self, k: Tensor, ctx: AttentionContext) -> Tensor:
        return k

    def bias(self, ctx: AttentionContext) -> Tensor | None:
        """Additive term for the scores, broadcastable to (B, H, I, J); -inf masks a key.

        Every route adds it after all ``scores`` hooks (FlexAttention: as ``score_mod`` where the
        plug-in gives one, else gathered from this tensor)."""
        return None

    def additive(self, ctx: AttentionContext) -> Tensor | None:
        """The fused form of an additive ``scores`` hook: the term T, broadcastable to (B, H, I, J),
        with ``scores(s, ctx) == s + T`` for every ``s`` (0 on other heads and untouched cells, -inf
        masks a key, in the dtype of ``ctx.q``; it may carry gradients). SDPA adds it in its float
        mask, FlexAttention gathers it (or calls ``score_mod``). It may record what ``scores``
        records. None: the hook is not additive (then ``score_mod`` is its only fused form)."""
        return None

    def score_mod(self, ctx: AttentionContext) -> ScoreMod | None:
        """FlexAttention's form of the plug-in's ``scores`` hook (or, for a plug-in without one, of
        its ``bias``): ``mod(score, b, h, q_idx, kv_idx)`` equals that hook's cell. Needed where
        ``scores`` is not additive (a scaling); elsewhere optional, to compute the term from small
        tables instead of gathering a (B, H, I, J) tensor. Tensors it captures may need gradients."""
        return None

    def prob_scale(self, ctx: AttentionContext) -> Tensor | None:
        """The fused form of a ``probs`` hook that scales the weights without renormalising them:
        M, broadcastable to (B, H, I, J), with ``probs(a, ctx) == a * M`` and ``0 <= M <= 1`` (1 on
        other heads and untouched cells). SDPA then sees each key twice, with ``log M`` and with
        ``log(1 - M)`` and a zero value, so the softmax keeps its denominator: twice the keys."""
        return None

    def scores(self, s: Tensor, ctx: AttentionContext) -> Tensor:
        """``s`` = QK^T/sqrt(d), before any padding or causal mask."""
        return s

    def probs(self, a: Tensor, ctx: AttentionContext) -> Tensor:
        """``a`` = softmax of the masked scores, before attention dropout."""
        return a

    def extra_output(self, a: Tensor, ctx: AttentionContext) -> Tensor | None:
        """A term added to ``A V`` (B, H, I, d_head)."""
        return None

    def fold_queries(self, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor] | None:
        """The query projection (d_model, d_model) and its bias of a *plain* attention that computes
        what this plug-in computes at translation time, or None when no plain attention can.

        Engines that only run a plain Transformer (``structnmt export ctranslate2``) take a model
        whose every plug-in folds; a plug-in that reads structure or changes the softmax cannot.
        """
        return None


class Method(Generic[P]):
    """A structure-aware method as configured in one ``model.methods`` entry: its typed ``Params``,
    checked field by field when the config was read and against the model by ``build_methods``."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[MethodParams]] = MethodParams
    #: structure fields read, per side ("src"/"tgt"): used to build only what is needed
    needs: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: the subset still needed when translating (source side only: target trees do not exist then)
    needs_at_inference: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: True if the method adds trainable parameters (the parameter-free ones must not)
    adds_parameters: ClassVar[bool] = False
    #: what ``structnmt inspect`` can read out of the method's self-attention sites: {reading: the
    #: recorded tensor it reads}. Readings: ``"dependency_tree"`` (a (B, H', L, L) parent
    #: distribution per token), ``"phrase_structure"`` (a (B, H', L) syntactic distance per token)
    readouts: ClassVar[dict[str, str]] = {}

    def __init__(self, params: P, model_cfg: Any) -> None:
        self.p: P = params
        self.model_cfg = model_cfg

    # -- where (said by the params, one vocabulary for every method) -----------
    def head_list(self) -> list[int]:
        return self.p.head_list(self.model_cfg.n_heads)

    def sites(self) -> list[Site]:
        return self.p.sites()

    # -- hooks ---------------------------------------------------------------
    def make_plugin(self, site: Site) -> AttentionPlugin | None:
        """The plug-in for one site (a fresh module per site: parameters are per layer)."""
        return None

    def plugins(self) -> list[tuple[Site, AttentionPlugin]]:
        out = []
        for site in self.sites():
            plugin = self.make_plugin(site)
            if plugin is not None:
                out.append((site, plugin))
        return out

    def embed(self, x: Tensor, side: str, struct: dict[str, Tensor]) -> Tensor:
        """Change token embeddings (B, L, d) of ``side`` (S&H label embeddings)."""
        return x

    def embedding_module(self) -> nn.Module | None:
        """Parameters used by ``embed``; the model registers them."""
        return None

    def check_dataset(self, meta: dict[str, Any]) -> None:
        """Refuse, before training, a dataset this method cannot read (``meta.json``'s contents).

        Checks here run once instead of per batch, where they would stop a compiled graph."""

    def records(self) -> set[RecordKey]:
        """Attention tensors ``loss`` needs, e.g. ``("decoder", 2, "cross", "probs")``."""
        return set()

    def loss(self, records: dict[RecordKey, Tensor], batch_struct: dict[str, dict[str, Tensor]],
             pads: dict[str, Tensor]) -> dict[str, Tensor]:
        """Model-level auxiliary losses (already weighted), by name."""
        return {}


# ---------------------------------------------------------------------------
# registry

METHODS: dict[str, type[Method]] = {}


def register(name: str):
    """Class decorator: make a method available under ``name`` in configs."""

    def wrap(cls: type[Method]) -> type[Method]:
        if name in METHODS and METHODS[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        METHODS[name] = cls
        METHOD_PARAMS[name] = cls.Params  # the config floor types entries through this
        return cls

    return wrap
