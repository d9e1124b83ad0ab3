"""Where a structure-aware method acts, and the registry of its typed parameters.

Every ``model.methods`` entry becomes the ``Params`` dataclass of its method when the config is
loaded (:func:`structnmt.config.load_config`), once. This module says *where* in one vocabulary
for every method: ``stack`` (``encoder``, ``decoder`` or both as a list; ``sides: [src, tgt]``,
the older spelling DBSA, SISA, SyncAttn and LPSI took, is read for every method), ``attention``
(``self``/``cross``), ``layers`` (1-based, like the papers) and ``heads`` (0-based indices, a
count ``n`` for the first n heads, or ``"all"``), resolved into :class:`Site` s here and checked
against the depth of the stack each site lies in.

It sits on the config floor and imports no model code: the methods register their ``Params``
classes into :data:`METHOD_PARAMS` when :mod:`structnmt.model.methods` is imported (the config
loader imports it on the first method entry it reads), the way a registry of plug-ins works.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from structnmt.errors import ConfigError

Stack = Literal["encoder", "decoder"]
AttentionKind = Literal["self", "cross"]
#: the older spelling of ``stack`` that DBSA, SISA, SyncAttn and LPSI took: the sentence side
STACK_OF_SIDE: dict[str, str] = {"src": "encoder", "tgt": "decoder"}


@dataclass(frozen=True)
class Site:
    """One attention module of the model; ``layer`` is 0-based here (configs are 1-based)."""

    stack: Stack
    attention: AttentionKind
    layer: int

    @property
    def struct_side(self) -> str:
        """Which sentence the query rows belong to: source for encoder attention, target otherwise."""
        return "src" if self.stack == "encoder" else "tgt"


def resolve_heads(heads: list[int] | int | str, n_heads: int) -> list[int]:
    """``"all"``, a count or a list of 0-based heads -> the list of heads."""
    if heads == "all":
        return list(range(n_heads))
    if isinstance(heads, int):
        return list(range(heads))
    return list(heads)  # type: ignore[arg-type]


def check_heads(heads: list[int] | int | str, n_heads: int, field: str) -> None:
    """Every head ``heads`` asks for exists in a model of ``n_heads``; the error says what was
    asked and what the model has (a count past it read as "head 2 is outside 0..1", naming a head
    nobody wrote)."""
    if isinstance(heads, int):
        if heads < 1:
            raise ConfigError(f"a count of heads must be at least 1, got {heads}", field)
        if heads > n_heads:
            raise ConfigError(f"{heads} heads asked (the first {heads}), the model has {n_heads} (model.n_heads)",
                              field)
        return
    listed = resolve_heads(heads, n_heads)
    if not listed:
        raise ConfigError("name at least one head", field)
    for head in listed:
        if not 0 <= head < n_heads:
            raise ConfigError(f"head {head} is outside 0..{n_heads - 1}: the model has {n_heads} heads "
                              "(model.n_heads), numbered from 0", field)


@dataclass
class MethodParams:
    """Where a method acts. Every method's parameter dataclass extends this one.

    Build one with :func:`structnmt.config.method_params` (or by loading a config), never
    directly: the entry as written is kept (:meth:`entry`), and a config's digest is taken
    from it, so a field added later at its default or an old spelling changes no digest.
    """

    name: str = ""
    stack: Stack | list[Stack] = "encoder"
    attention: AttentionKind = "self"
    layers: list[int] = field(default_factory=lambda: [1])
    heads: list[int] | int | str = "all"

    #: fields renamed since recipes were written: {old name: new name}; the old one is still read
    RENAMED: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        self._entry: dict[str, Any] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # a field changed in code no longer matches the entry it was read from: forget the entry,
        # so that what is saved and hashed (``entry()``) is what the params now say
        if name != "_entry" and getattr(self, "_entry", None) is not None:
            object.__setattr__(self, "_entry", None)
        object.__setattr__(self, name, value)

    # -- where ---------------------------------------------------------------
    def stacks(self) -> list[str]:
        return [self.stack] if isinstance(self.stack, str) else list(self.stack)

    def sites(self) -> list[Site]:
        return [Site(stack, self.attention, layer - 1)  # type: ignore[arg-type]
                for stack in self.stacks() for layer in self.layers]

    def head_list(self, n_heads: int) -> list[int]:
        return resolve_heads(self.heads, n_heads)

    # -- checks --------------------------------------------------------------
    def validate(self, where: str) -> None:
        """Checks that need only the entry; methods extend it (and call it)."""
        stacks = self.stacks()
        if not stacks or len(set(stacks)) != len(stacks):
            raise ConfigError("name each stack once: encoder, decoder or [encoder, decoder]", f"{where}.stack")
        if "encoder" in stacks and self.attention == "cross":
            raise ConfigError("the encoder has no cross-attention", f"{where}.attention")
        if not self.layers:
            raise ConfigError("name at least one layer", f"{where}.layers")
        if isinstance(self.heads, str) and self.heads != "all":
            raise ConfigError(f"expected a list of heads, a count or 'all', got {self.heads!r}", f"{where}.heads")

    def check_model(self, model: Any, where: str) -> None:
        """Checks against the model (``ModelConfig``): every layer inside the depth of the stack
        it lies in, every head inside the layer. Methods with more model-bound fields extend it."""
        depths = {"encoder": model.enc_layers, "decoder": model.dec_layers}
        for stack in self.stacks():
            for layer in self.layers:
                if not 1 <= layer <= depths[stack]:
                    raise ConfigError(f"layer {layer} is outside the {stack}'s layers 1..{depths[stack]}",
                                      f"{where}.layers")
        check_heads(self.heads, model.n_heads, f"{where}.heads")

    # -- the entry as written ------------------------------------------------
    def entry(self) -> dict[str, Any]:
        """The ``model.methods`` entry this was read from, as written (what a config saves and
        hashes); for params built in code, the fields that differ from their defaults."""
        if self._entry is not None:
            return copy.deepcopy(self._entry)
        default = type(self)()
        out: dict[str, Any] = {"name": self.name}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name != "name" and value != getattr(default, name):
                out[name] = copy.deepcopy(value)
        return out

    @classmethod
    def respell(cls, entry: dict[str, Any], where: str) -> dict[str, Any]:
        """An entry in today's spelling: ``sides`` becomes ``stack``, renamed fields their new name."""
        out = dict(entry)
        if "sides" in out:
            if "stack" in out:
                raise ConfigError("give stack or its older spelling sides, not both", f"{where}.sides")
            sides = out.pop("sides")
            if not isinstance(sides, list) or not all(isinstance(s, str) and s in STACK_OF_SIDE for s in sides):
                raise ConfigError(f"expected a list of src/tgt, got {sides!r}", f"{where}.sides")
            out["stack"] = [STACK_OF_SIDE[s] for s in sides]
        for old, new in cls.RENAMED.items():
            if old in out:
                if new in out:
                    raise ConfigError(f"give {new} or its older spelling {old}, not both", f"{where}.{old}")
                out[new] = out.pop(old)
        return out

    @classmethod
    def as_written(cls, err: ConfigError, entry: dict[str, Any], where: str) -> ConfigError:
        """``err`` naming the field the way ``entry`` spells it (``sides``, a renamed field)."""
        old_of = {new: old for old, new in cls.RENAMED.items()}
        field = (err.field or "").removeprefix(f"{where}.")
        name = re.split(r"[\[.]", field, maxsplit=1)[0]  # synch_layers[1]: the field is synch_layers
        rest = field[len(name):]
        if name == "stack" and "sides" in entry:
            return ConfigError(f"{err.message} (sides: src is the encoder, tgt the decoder)", f"{where}.sides{rest}")
        if old_of.get(name) in entry:
            return ConfigError(err.message, f"{where}.{old_of[name]}{rest}")
        return err


#: method name -> its ``Params`` class; filled by ``structnmt.model.methods.register``
METHOD_PARAMS: dict[str, type[MethodParams]] = {}
