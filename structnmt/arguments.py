"""The Python API's arguments checked against their type hints, before any work.

A wrong type given to ``structnmt.report(5)`` or ``plot_attention(head="1")`` would otherwise
fail deep inside (a ``TypeError`` from pathlib, a ``ValueError`` from a tensor's shape) or, worse,
be taken for something else (``"yes"`` as true, a string as a list of one-letter names). Each
public function of :mod:`structnmt.api` is wrapped by :func:`checked`, which reads the function's
own hints, so that the hint is the one statement of what an argument may be:

* a value of another type is a :class:`~structnmt.errors.ConfigError` naming the argument;
* one string (or path) where the hint asks for a list of them is that list of one, as the
  command line's repeated options are (``report("runs/a")`` is ``report(["runs/a"])``), and
  any other iterable there (a generator, ``range``, ``dict.keys()``) is made a list;
* ``bool`` is not an ``int`` and an ``int`` is a ``float``, as Python's own numbers are used;
* an error raised by a check the command line shares (``--out: ... is a directory``) names the
  function's argument instead of the option (``out: ...``), as the caller wrote it.

Hints the checker does not know (``Any``, callables, other generics) accept every value.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import PurePath
from typing import Any, Literal, TypeVar, Union

from structnmt.errors import ConfigError, StructNMTError

F = TypeVar("F", bound=Callable[..., Any])


class _DeviceHint:
    """``torch.device`` in a hint, checked without importing torch (``import structnmt`` stays light)."""


#: names the hints of structnmt.api use only under TYPE_CHECKING, as the checker reads them
_HINT_NAMES: dict[str, Any] = {
    "torch": types.SimpleNamespace(device=_DeviceHint),
    "Translator": Any,
    "GoldFormat": Literal["auto", "pharaoh", "talp"],
}


def _resolve(fn: Callable[..., Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(fn, localns=_HINT_NAMES)
    hints.pop("return", None)
    return hints


def _alternatives(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _is_sequence(hint: Any) -> bool:
    return typing.get_origin(hint) in (Sequence, list, tuple)


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is what ``hint`` allows (unknown hints allow everything)."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(matches(value, alternative) for alternative in typing.get_args(hint))
    if origin is Literal:
        return any(isinstance(value, type(choice)) and value == choice for choice in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is _DeviceHint:
        return type(value).__name__ == "device"
    if _is_sequence(hint):
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(matches(v, item) for v in value)
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        args = typing.get_args(hint)
        return isinstance(value, Mapping) and (not args or all(matches(k, args[0]) for k in value))
    if isinstance(hint, type):
        return isinstance(value, os.PathLike) if issubclass(hint, PurePath) else isinstance(value, hint)
    return True


#: simple hints in words
_WORDS = {bool: "True or False", int: "an integer", float: "a number", str: "a string", _DeviceHint: "a torch.device"}
PATH_WORDS = "a path (str or pathlib.Path)"
_PLURALS = {_WORDS[bool]: "True or False values", _WORDS[int]: "integers", _WORDS[float]: "numbers",
            _WORDS[str]: "strings", _WORDS[_DeviceHint]: "torch.devices"}


def describe(hint: Any) -> str:
    """A hint in words, for the error message."""
    if hint is type(None) or hint is None:
        return "None"
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        alternatives = list(typing.get_args(hint))
        paths = [a for a in alternatives if isinstance(a, type) and issubclass(a, PurePath)]
        if paths and str in alternatives:  # str | Path: one path
            alternatives = [paths[0]] + [a for a in alternatives if a is not str and a not in paths]
        return " or ".join(dict.fromkeys(describe(a) for a in alternatives))
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(hint))
    if _is_sequence(hint):
        args = typing.get_args(hint)
        item = describe(args[0]) if args else ""
        if item == PATH_WORDS:
            return "a list of paths (str or pathlib.Path)"
        return f"a list of {_PLURALS[item]}" if item in _PLURALS else f"a list of ({item})" if item else "a list"
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        return "a mapping"
    if hint in _WORDS:
        return _WORDS[hint]
    if isinstance(hint, type):
        return PATH_WORDS if issubclass(hint, PurePath) else hint.__name__
    return str(hint)


def _as_hinted(value: Any, hint: Any) -> Any:
    """Where the hint takes a list and not the value as it is: one string or path is a list of it,
    and any other iterable (a generator, ``dict.keys()``, ``range``, a set) is made a list."""
    if matches(value, hint) or not any(_is_sequence(a) for a in _alternatives(hint)):
        return value
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (bytes, bytearray, Mapping)):
        return list(value)
    return value


_OPTION = re.compile(r"--([a-z][a-z0-9-]*)")
#: set while the command line runs a command: its user gave options, and errors name them so
_COMMAND_LINE: contextvars.ContextVar[bool] = contextvars.ContextVar("command_line", default=False)


@contextlib.contextmanager
def command_line() -> Iterator[None]:
    """Within it, API calls leave errors naming command-line options as they are."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def name_arguments(err: StructNMTError, parameters: Mapping[str, Any]) -> None:
    """Where ``err`` names a command-line option (its config field, or its message's first word)
    that is one of ``parameters`` with ``_`` for ``-``, name the parameter instead, in place."""
    if _COMMAND_LINE.get():
        return
    text = str(err)
    field = getattr(err, "field", None)
    named = field if isinstance(field, str) and _OPTION.fullmatch(field) else None
    if named is None:
        first = _OPTION.match(text)
        named = first.group(0) if first and text[first.end():first.end() + 1] == ":" else None
    if named is None:
        return
    parameter = named[2:].replace("-", "_")
    if parameter not in parameters:
        return
    if named == field:
        err.field = parameter  # type: ignore[attr-defined]
    err.args = (text.replace(f"{named}: ", f"{parameter}: ", 1),) + err.args[1:]


def checked(fn: F | None = None, *, own: tuple[str, ...] = ()) -> Any:
    """``fn`` with every argument checked against its hint first (see the module docstring);
    ``own`` names arguments the function checks itself, with a message that says more."""
    if fn is None:
        return functools.partial(checked, own=own)
    signature = inspect.signature(fn)
    hints: dict[str, Any] | None = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:
            hints = {name: hint for name, hint in _resolve(fn).items() if name not in own}
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise ConfigError(f"{fn.__name__}(): {err}") from None
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            if hint is None:
                continue
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL or kind is inspect.Parameter.VAR_KEYWORD:
                items = enumerate(value) if kind is inspect.Parameter.VAR_POSITIONAL else value.items()
                for key, item in items:  # *args and **kwargs: the hint is each one's
                    if not matches(item, hint):
                        raise ConfigError(f"expected {describe(hint)}, got {item!r}", f"{name}[{key!r}]")
                continue
            bound.arguments[name] = _as_hinted(value, hint)
            if not matches(bound.arguments[name], hint):
                raise ConfigError(f"expected {describe(hint)}, got {value!r}", name)
        try:
            return fn(*bound.args, **bound.kwargs)
        except StructNMTError as err:  # a check shared with the command line names its option
            name_arguments(err, signature.parameters)
            raise

    return wrapper
