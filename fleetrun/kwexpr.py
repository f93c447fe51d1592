"""``-k`` and ``-m`` expressions, as in pytest: words combined with ``and``, ``or``,
``not`` and parentheses. Under ``-k`` a word matches a task's name as a
case-insensitive substring; under ``-m`` it must be one of the task's tags, whole
(pytest's markers)."""

from __future__ import annotations

import re
from typing import Callable

from .exceptions import UsageError

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


#: A compiled expression: given whether the subject has a word, whether it matches.
_Pred = Callable[[Callable[[str], bool]], bool]


class KeywordExpr:
    """A compiled expression; :meth:`__call__` matches a name (``-k``), :meth:`tags`
    a task's tags (``-m``)."""

    def __init__(self, text: str, fn: _Pred) -> None:
        self.text = text
        self.fn = fn

    def __call__(self, name: str) -> bool:
        """Whether ``name`` matches: each word a case-insensitive substring of it."""
        low = name.lower()
        return self.fn(lambda word: word.lower() in low)

    def tags(self, tags: list[str]) -> bool:
        """Whether a task with ``tags`` matches: each word one of them, whole."""
        have = set(tags)
        return self.fn(lambda word: word in have)

    @classmethod
    def compile(cls, text: str, key: str = "-k") -> KeywordExpr:
        """:param key: the option the expression came from, for its errors.

        :raises UsageError: an expression that does not parse.
        """
        tokens = _TOKEN.findall(text)
        pos = 0

        def err(msg: str) -> UsageError:
            return UsageError(f"bad expression {text!r}: {msg}", key=key)

        def peek() -> str | None:
            return tokens[pos] if pos < len(tokens) else None

        def take() -> str:
            nonlocal pos
            if pos >= len(tokens):
                raise err("unexpected end")
            pos += 1
            return tokens[pos - 1]

        def expr() -> _Pred:
            left = term()
            while peek() == "or":
                take()
                right = term()
                left = (lambda a, b: lambda n: a(n) or b(n))(left, right)
            return left

        def term() -> _Pred:
            left = factor()
            while peek() == "and":
                take()
                right = factor()
                left = (lambda a, b: lambda n: a(n) and b(n))(left, right)
            return left

        def factor() -> _Pred:
            tok = take()
            if tok == "not":
                inner = factor()
                return lambda n: not inner(n)
            if tok == "(":
                inner = expr()
                if take() != ")":
                    raise err("missing ')'")
                return inner
            if tok in (")", "and", "or"):
                raise err(f"unexpected {tok!r}")
            return lambda has: has(tok)

        if not tokens:
            raise err("empty")
        fn = expr()
        if pos != len(tokens):
            raise err(f"unexpected {tokens[pos]!r}")
        return cls(text, fn)
