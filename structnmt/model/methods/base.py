"""The plug-in interface for structure-aware attention.

A *method* (PASCAL, Deps-SAN, SASA, DBSA, ...) is one small module in this package.
It declares

* which structure fields it reads (``needs``; e.g. ``{"src": ("parent_mid",)}``) and which
  of those it still needs at translation time (``needs_at_inference``),
* where it acts (:class:`Site`: encoder/decoder, self/cross attention, layers, heads),
* how it changes attention: each of its plug-ins declares **one** :class:`Effect` and writes
  the one hook that effect reads:

  ========================  ====================  =============================================
  ``Effect``                hook                  methods
  ========================  ====================  =============================================
  ``QUERY_KEY``             ``queries``/``keys``  SACrA, context-aware SAN
  ``ADDITIVE``              ``term``              LPSI, Localness, local windows, Wink masks,
                                                  relative positions without values
  ``SCORE_FN``              ``score_fn``          PASCAL, Deps-SAN (a scaling of the scores)
  ``PROB_SCALE``            ``scale``             SASA, UDISCAL (weights scaled, not renormalised)
  ``EXPLICIT``              ``scores``/``probs``  DBSA, SISA, SyncAttn, relative positions on
                            /``extra_output``     values (they read or replace the weights)
  ========================  ====================  =============================================

  The attention module (``structnmt/model/attention.py``) derives every route from that one
  declaration: the explicit (B, H, I, J) path adds a term, evaluates a score function on the
  whole grid or multiplies the weights; SDPA takes terms in its float mask and scales as twice
  the keys; FlexAttention takes score functions and gathered terms. So each method writes its
  math once, and a test checks that every route gives the same function.
* and, for losses that span layers (SyncAttn, SynchMSE/Rank), ``Method.loss(records)``
  reading the attention tensors it asked for in ``Method.records()``.

The trainer and the decoder never name a method: they call the model, and the model
calls whatever plug-ins the config attached. A new method is a new file here with a
``@register("name")`` class; nothing else changes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor, nn

from structnmt.method_config import METHOD_PARAMS, MethodParams, Site

__all__ = ["METHODS", "AttentionContext", "AttentionPlugin", "Effect", "Method", "MethodParams", "RecordKey", "Site",
           "check_declaration", "register"]
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


def kept_index(kept: dict[torch.device, Tensor], values: list[int], device: torch.device) -> Tensor:
    """``values`` as a long tensor on ``device``, made once and kept in ``kept`` (no host copy and
    wait per call). Under ``torch.compile`` it is made inside the graph and not kept: a tensor a
    compiled step stores on the model is an output of its CUDA graph, which the next replay
    overwrites (the next step would read freed memory, and cudagraph trees refuse it)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=torch.long, device=device)
    index = kept.get(device)
    if index is None:
        index = kept[device] = torch.tensor(values, dtype=torch.long, device=device)
    return index


class Effect(enum.Enum):
    """How a plug-in changes attention; each plug-in declares one (see the module docstring)."""

    QUERY_KEY = "query_key"  # queries(q)/keys(k): other vectors go into the kernel
    ADDITIVE = "additive"  # term(ctx): S + T before the softmax; -inf masks a key
    SCORE_FN = "score_fn"  # score_fn(ctx): S_ij -> f(S_ij, b, h, i, j), cell by cell
    PROB_SCALE = "prob_scale"  # scale(ctx): A * M after the softmax, not renormalised
    EXPLICIT = "explicit"  # scores(S)/probs(A)/extra_output(A): needs the full matrices


#: the hooks each effect reads; a plug-in overrides those of its own effect and no others
EFFECT_HOOKS: dict[Effect, tuple[str, ...]] = {
    Effect.QUERY_KEY: ("queries", "keys"),
    Effect.ADDITIVE: ("term",),
    Effect.SCORE_FN: ("score_fn",),
    Effect.PROB_SCALE: ("scale",),
    Effect.EXPLICIT: ("scores", "probs", "extra_output"),
}


class AttentionPlugin(nn.Module):
    """Changes some heads of one attention module through the one :class:`Effect` it declares.

    ``heads`` are 0-based head indices. Hooks receive and return full (B, H, ...) tensors and
    must leave other heads, padding keys and special-token rows untouched. Effects of several
    plug-ins in one layer apply in the order the methods are listed.
    """

    #: the plug-in's one effect (set on the class, or in ``__init__`` when a parameter decides)
    effect: Effect = Effect.EXPLICIT
    #: ``PROB_SCALE`` only: whether ``0 <= M <= 1`` always holds, which SDPA's form needs
    #: (``log(1 - M)``); off unless a plug-in promises it, so that a larger M stays explicit
    scale_at_most_one: bool = False

    def __init__(self, heads: list[int]) -> None:
        super().__init__()
        self.heads = list(heads)
        self._head_index: dict[torch.device, Tensor] = {}

    def head_index(self, device: torch.device) -> Tensor:
        """The plug-in's heads as a tensor on ``device`` (:func:`kept_index`)."""
        return kept_index(self._head_index, self.heads, device)

    # -- QUERY_KEY ----------------------------------------------------------------------
    def queries(self, q: Tensor, ctx: AttentionContext) -> Tensor:
        """Queries (B, H, I, d_head) after the projection (and, in cross-attention, before beams)."""
        return q

    def keys(self, k: Tensor, ctx: AttentionContext) -> Tensor:
        """Keys (B, H, J, d_head) of the new positions, before the decoding cache keeps them."""
        return k

    # -- ADDITIVE -----------------------------------------------------------------------
    def term(self, ctx: AttentionContext) -> Tensor:
        """T, broadcastable to (B, H, I, J), added to ``S = QK^T/sqrt(d)`` before the mask: 0 on
        other heads and untouched cells, -inf masks a key, in the dtype of ``ctx.q`` (float32
        where -inf must survive a bf16 sum); it may carry gradients."""
        raise NotImplementedError

    # -- SCORE_FN -----------------------------------------------------------------------
    def score_fn(self, ctx: AttentionContext) -> ScoreMod:
        """``f(score, b, h, q_idx, kv_idx)``: a cell's new score, written with tensor ops and
        indexing only, so that it runs on 0-d tensors (FlexAttention's ``score_mod``) and on
        broadcast index grids (the explicit route, which evaluates it over the whole matrix).
        ``q_idx`` counts this call's rows (add ``ctx.q_offset``). Tables it reads are built here,
        once per call; random draws happen here too, so both routes draw alike."""
        raise NotImplementedError

    # -- PROB_SCALE ---------------------------------------------------------------------
    def scale(self, ctx: AttentionContext) -> Tensor:
        """M, broadcastable to (B, H, I, J), with the weights becoming ``A * M`` (1 on other heads
        and untouched cells). A plug-in that sets ``scale_at_most_one`` (``0 <= M <= 1`` always)
        also runs on SDPA: every key is seen twice, with ``log M`` and with ``log(1 - M)`` and a
        zero value, so the softmax keeps its denominator."""
        raise NotImplementedError

    # -- EXPLICIT -----------------------------------------------------------------------
    def scores(self, s: Tensor, ctx: AttentionContext) -> Tensor:
        """``s`` = QK^T/sqrt(d) (B, H, I, J), before any padding or causal mask."""
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


def check_declaration(plugin: AttentionPlugin) -> None:
    """Refuse a plug-in that writes hooks of another effect than the one it declares (its math
    would then live in two places, and some route would silently ignore half of it)."""
    cls = type(plugin)
    if not isinstance(plugin.effect, Effect):
        raise TypeError(f"{cls.__name__}.effect must be an Effect, got {plugin.effect!r}")
    written = {hook for hooks in EFFECT_HOOKS.values() for hook in hooks
               if getattr(cls, hook) is not getattr(AttentionPlugin, hook)}
    own = set(EFFECT_HOOKS[plugin.effect])
    if written - own:
        raise TypeError(f"{cls.__name__} declares {plugin.effect.name} but writes {sorted(written - own)}: "
                        f"an {plugin.effect.name} plug-in writes only {sorted(own)}")
    if plugin.effect is not Effect.EXPLICIT and not written & own:
        raise TypeError(f"{cls.__name__} declares {plugin.effect.name} but writes none of {sorted(own)}")


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
        old = METHODS.get(name)
        where = f"{cls.__module__}.{cls.__qualname__}"
        # the same class defined again (a module reloaded, a notebook cell run twice) replaces it
        if old is not None and f"{old.__module__}.{old.__qualname__}" != where:
            raise ValueError(f"method {name!r} registered twice ({old.__module__}.{old.__qualname__} and {where})")
        cls.name = name
        METHODS[name] = cls
        METHOD_PARAMS[name] = cls.Params  # the config floor types entries through this
        return cls

    return wrap
