"""``json.dumps(obj, indent=2)``, the same text, encoded by the C encoder.

The standard library encodes with its pure-Python encoder as soon as ``indent`` is
given: ``status --json`` at 10,000 tasks spent most of its time there. The C encoder
takes one item separator for every depth, so each container is encoded alone with
the separator of its own depth (``",\\n" + "  " * (depth + 1)``), its brackets opened
and closed on lines of their own, as ``indent=2`` prints them; a container holding
others (its text shows a bracket opening a container that is not empty) has each of
them replaced by a marker string first, and their own text put where the markers are.
Text that holds the marker itself (or a value the C encoder does not take) is encoded
by ``json.dumps(obj, indent=2)`` instead, so the result is always that function's (``tests/test_jsonout.py`` checks it on generated data).
"""

from __future__ import annotations

import json
import json.encoder
import re
from typing import Any, Callable

#: The C encoder's constructor; None without the C accelerator.
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)

__all__ = ["dumps_indented"]

#: What stands for a nested container while its parent is encoded.
_MARK = "\x00fleetrun-json-nested\x00"
_MARK_TEXT = json.dumps(_MARK)
_CONTAINERS = (dict, list, tuple)
#: A bracket opening a container that is not empty: a list's first value never starts
#: with "]", a dict's first key is a string. Found in a string's text as well, where it
#: only sends the value the longer way.
_OPENED = re.compile(r"[\[{](?![\]}])")


class _Fallback(Exception):
    """The fast path cannot promise ``json.dumps``'s text for this value."""


def _default(o: Any) -> Any:
    raise _Fallback  # json.dumps raises its own TypeError for it


_encoders: dict[int, Callable[[Any, int], Any]] = {}


def _encoder(depth: int) -> Callable[[Any, int], Any]:
    enc = _encoders.get(depth)
    if enc is None:
        from json.encoder import encode_basestring_ascii

        assert _make_encoder is not None
        # markers, default, str encoder, indent, key and item separators, sort_keys, skipkeys,
        # allow_nan: json.dumps's but the item separator, and no markers (a circular value
        # ends in RecursionError here, then in json.dumps's own ValueError)
        enc = _encoders[depth] = _make_encoder(
            None,
            _default,
            encode_basestring_ascii,
            None,
            ": ",
            ",\n" + "  " * (depth + 1),
            False,
            False,
            True,
        )
    return enc


def _encode(o: Any, depth: int) -> str:
    enc = _encoder(depth)
    if not isinstance(o, _CONTAINERS) or not o:  # a scalar, [] or {}: the same text at any depth
        return "".join(enc(o, 0))
    text = "".join(enc(o, 0))
    inner = "  " * (depth + 1)
    if (
        _OPENED.search(text, 1, len(text) - 1) is not None
    ):  # it may hold a container that is not empty
        values = o.values() if isinstance(o, dict) else o
        nested = [v for v in values if isinstance(v, _CONTAINERS) and v]
        if nested:
            if isinstance(o, dict):
                flat: Any = {
                    k: (_MARK if isinstance(v, _CONTAINERS) and v else v) for k, v in o.items()
                }
            else:
                flat = [(_MARK if isinstance(v, _CONTAINERS) and v else v) for v in o]
            parts = "".join(enc(flat, 0)).split(_MARK_TEXT)
            if len(parts) != len(nested) + 1:  # the marker was in the data too
                raise _Fallback
            out = [parts[0]]
            for child, after in zip(nested, parts[1:]):
                out.append(_encode(child, depth + 1))
                out.append(after)
            text = "".join(out)
    return f"{text[0]}\n{inner}{text[1:-1]}\n{inner[:-2]}{text[-1]}"


def _rows(rows: list[dict[Any, Any]]) -> str | None:
    """A list of dicts none empty (``status --json``'s tasks) in one call of the C
    encoder, with the dicts' item separator; None unless no dict holds a container that
    is not empty. Then a raw line break is only in a separator (the encoder writes one
    in a string as ``\\n``), and ``},\\n    {`` only between two of the dicts (in a dict,
    a separator is followed by a key, a string), where the list's own separator goes."""
    text = "".join(_encoder(1)(rows, 0))
    if len(_OPENED.findall(text)) != 1 + len(rows):  # "[" and each dict's "{": nothing deeper
        return None
    body = text[2:-2].replace("},\n    {", "\n  },\n  {\n    ")
    return f"[\n  {{\n    {body}\n  }}\n]"


def dumps_indented(obj: Any) -> str:
    """``json.dumps(obj, indent=2)``: the same text (``ensure_ascii``, NaN and the
    infinities allowed, keys in their order, ``TypeError`` for what JSON cannot hold).

    :param obj: what to encode: dicts, lists, tuples, strings, numbers, booleans, None.
    """
    if _make_encoder is not None:
        try:
            if type(obj) is list and obj and set(map(type, obj)) == {dict} and all(obj):
                text = _rows(obj)
                if text is not None:
                    return text
            return _encode(obj, 0)
        except (_Fallback, RecursionError, ValueError, TypeError):
            pass
    return json.dumps(obj, indent=2)
