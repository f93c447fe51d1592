"""``-k`` expressions, as in pytest: names matched as case-insensitive substrings,
combined with ``and``, ``or``, ``not`` and parentheses."""

from __future__ import annotations

import re
from typing import Callable

from .exceptions import UsageError

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


class KeywordExpr:
    def __init__(self, text: str, fn: Callable[[str], bool]) -> None:
        self.text = text
        self.fn = fn

    def __call__(self, name: str) -> bool:
        return self.fn(name.lower())

    @classmethod
    def compile(cls, text: str) -> KeywordExpr:
        tokens = _TOKEN.findall(text)
        pos = 0

        def err(msg: str) -> UsageError:
            return UsageError(f"bad expression {text!r}: {msg}", key="-k")

        def peek() -> str | None:
            return tokens[pos] if pos < len(tokens) else None

        def take() -> str:
            nonlocal pos
            if pos >= len(tokens):
                raise err("unexpected end")
            pos += 1
            return tokens[pos - 1]

        def expr() -> Callable[[str], bool]:
            left = term()
            while peek() == "or":
                take()
                right = term()
                left = (lambda a, b: lambda n: a(n) or b(n))(left, right)
            return left

        def term() -> Callable[[str], bool]:
            left = factor()
            while peek() == "and":
                take()
                right = factor()
                left = (lambda a, b: lambda n: a(n) and b(n))(left, right)
            return left

        def factor() -> Callable[[str], bool]:
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
            word = tok.lower()
            return lambda n: word in n

        if not tokens:
            raise err("empty")
        fn = expr()
        if pos != len(tokens):
            raise err(f"unexpected {tokens[pos]!r}")
        return cls(text, fn)
