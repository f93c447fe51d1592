"""Unit tests of ``-k`` expressions (:class:`fleetrun.kwexpr.KeywordExpr`)."""

from __future__ import annotations

import pytest

from fleetrun.exceptions import UsageError
from fleetrun.kwexpr import KeywordExpr

NAMES = ["user-schema", "user-api", "order-schema", "order-api", "docs", "Deploy-API"]


def select(expr: str) -> list[str]:
    match = KeywordExpr.compile(expr)
    return [n for n in NAMES if match(n)]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("schema", ["user-schema", "order-schema"]),
        ("user", ["user-schema", "user-api"]),
        ("docs", ["docs"]),
        ("nothing", []),
        # substring, not whole word
        ("er-sch", ["user-schema", "order-schema"]),
        ("-", ["user-schema", "user-api", "order-schema", "order-api", "Deploy-API"]),
        # and / or / not
        ("schema and user", ["user-schema"]),
        ("schema or docs", ["user-schema", "order-schema", "docs"]),
        ("not api", ["user-schema", "order-schema", "docs"]),
        ("schema and not user", ["order-schema"]),
        ("not not docs", ["docs"]),
        # "and" binds tighter than "or"
        ("docs or user and api", ["user-api", "docs"]),
        ("user and api or docs", ["user-api", "docs"]),
        # parentheses
        ("(docs or user) and api", ["user-api"]),
        ("not (user or order)", ["docs", "Deploy-API"]),
        ("((schema))", ["user-schema", "order-schema"]),
        ("(user)and(api)", ["user-api"]),
        ("  user   and\tapi  ", ["user-api"]),
    ],
)
def test_selection(expr: str, expected: list[str]) -> None:
    assert select(expr) == expected


@pytest.mark.parametrize("expr", ["api", "API", "Api", "aPI"])
def test_case_insensitive(expr: str) -> None:
    assert select(expr) == ["user-api", "order-api", "Deploy-API"]


def test_names_are_matched_case_insensitively() -> None:
    match = KeywordExpr.compile("deploy")
    assert match("DEPLOY-prod")
    assert match("Re-Deploy")
    assert not match("dep-loy")


def test_keeps_its_text() -> None:
    assert KeywordExpr.compile("a and not b").text == "a and not b"


def test_operators_are_lowercase_words() -> None:
    # As in pytest: only lowercase and/or/not are operators.
    assert KeywordExpr.compile("AND")("band")
    assert KeywordExpr.compile("notes")("release-notes")
    assert KeywordExpr.compile("android")("android-app")


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "bad expression '': empty"),
        ("   ", "bad expression '   ': empty"),
        ("a and", "bad expression 'a and': unexpected end"),
        ("not", "bad expression 'not': unexpected end"),
        ("a or", "bad expression 'a or': unexpected end"),
        ("(a", "bad expression '(a': unexpected end"),
        ("(a b", "bad expression '(a b': missing ')'"),
        ("a)", "bad expression 'a)': unexpected ')'"),
        ("()", "bad expression '()': unexpected ')'"),
        ("and a", "bad expression 'and a': unexpected 'and'"),
        ("or", "bad expression 'or': unexpected 'or'"),
        ("a or or b", "bad expression 'a or or b': unexpected 'or'"),
        ("a b", "bad expression 'a b': unexpected 'b'"),
        ("NOT a", "bad expression 'NOT a': unexpected 'a'"),
    ],
)
def test_errors(expr: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        KeywordExpr.compile(expr)
    assert info.value.key == "-k"
    assert info.value.message == message
    assert info.value.format() == f"ERROR: -k: {message}"


# -m: the same grammar over a task's tags, each word a whole tag (pytest's markers)
TAGS = {"api": ["backend"], "slow-api": ["backend", "slow"], "ui": ["frontend"], "bare": []}


def marked(expr: str) -> list[str]:
    match = KeywordExpr.compile(expr, key="-m")
    return [n for n, tags in TAGS.items() if match.tags(tags)]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("backend", ["api", "slow-api"]),
        ("backend and not slow", ["api"]),
        ("frontend or slow", ["slow-api", "ui"]),
        ("not backend", ["ui", "bare"]),
        ("back", []),  # a whole tag, not a substring, as pytest's -m
        ("(backend or frontend) and not slow", ["api", "ui"]),
    ],
)
def test_tag_expressions(expr, expected):
    assert marked(expr) == expected


def test_tag_expression_errors_name_m():
    with pytest.raises(UsageError) as e:
        KeywordExpr.compile("backend and", key="-m")
    assert e.value.key == "-m"
