"""safe_text: what fleetrun prints that it did not write cannot drive the terminal."""

from __future__ import annotations

import pytest

from fleetrun.textutil import NAME_LIMIT, safe_name, safe_text


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text", "plain text"),
        ("\x1b[2J\x1b]0;owned\x07x", "\\x1b[2J\\x1b]0;owned\\x07x"),
        ("a\x00b\x7fc", "a\\x00b\\x7fc"),
        ("csi\x9b6n", "csi\\x9b6n"),  # C1: as good as ESC [ on some terminals
        ("line\rover", "line\\x0dover"),
        ("one\ntwo", "one\\x0atwo"),
        ("tab\there", "tab\there"),
        ("rtl\u202eevil \u2066x\u2069", "rtl\\u202eevil \\u2066x\\u2069"),
        ("caf\u00e9 \u2713 \U0001f600", "caf\u00e9 \u2713 \U0001f600"),  # printable unicode stays
    ],
)
def test_control_characters_are_made_visible(raw: str, shown: str) -> None:
    assert safe_text(raw) == shown


def test_keep_newlines_for_text_that_has_lines() -> None:
    assert safe_text("a\nb\x1bc", keep="\t\n") == "a\nb\\x1bc"
    assert safe_text("a\tb", keep="") == "a\\x09b"


def test_idempotent() -> None:
    once = safe_text("\x1b[31mred\x9b")
    assert safe_text(once) == once


def test_limit_caps_with_an_ellipsis() -> None:
    assert safe_text("x" * 10, limit=5) == "xxxx\u2026"
    assert safe_text("x" * 5, limit=5) == "xxxxx"
    assert safe_text("\x1b" * 10, limit=6) == "\\x1b\\\u2026"  # capped after escaping: the cap is what is shown
    long = safe_name("n" * 500)
    assert len(long) == NAME_LIMIT and long.endswith("\u2026")


def test_any_value() -> None:
    assert safe_text(None) == "None"
    assert safe_text(ValueError("bad\x07")) == "bad\\x07"


def test_printable_text_holds_nothing_to_escape() -> None:
    """``safe_text`` returns printable text as it is, without its regular expression:
    that is right only while every character it escapes is one ``str.isprintable``
    refuses (checked over every code point, so a character added to the list that is
    printable fails here)."""
    from fleetrun.textutil import _CONTROL

    printable = "".join(c for c in map(chr, range(0x110000)) if c.isprintable())
    assert _CONTROL.search(printable) is None
    assert _CONTROL.search("".join(map(chr, range(0x100)))) is not None  # the check above means something
