"""``dumps_indented`` is ``json.dumps(obj, indent=2)``, text for text, on any JSON value
(unicode, floats with NaN and the infinities, nested and empty containers, tuples,
non-string keys, the marker string itself) and the same error where it raises one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetrun import jsonout
from fleetrun.jsonout import _MARK, dumps_indented

texts = st.text() | st.sampled_from(
    ["", _MARK, f"a{_MARK}b", "\u2028", "\x00", "é", "\ud800", '"\\', "},\n    {", "[x", "{}"]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | texts
)
keys = texts | st.integers() | st.floats() | st.booleans() | st.none()
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(keys, inner, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=600, deadline=None)
@given(values)
def test_the_same_text_as_json_dumps_indent_2(obj: Any) -> None:
    assert dumps_indented(obj) == json.dumps(obj, indent=2)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "id": texts,
                "cost_usd": st.floats(),
                "depends_on": st.lists(texts),
                "links": st.dictionaries(texts, texts),
                "host": st.none() | texts,
            }
        )
    )
)
def test_the_same_text_for_what_status_prints(tasks: list[dict[str, Any]]) -> None:
    assert dumps_indented(tasks) == json.dumps(tasks, indent=2)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(keys, scalars | st.just([]) | st.just({}) | values, min_size=1), min_size=1
    )
)
def test_the_same_text_for_a_list_of_dicts(rows: list[dict[Any, Any]]) -> None:
    """The shape ``status --json`` prints, encoded in one call when no dict holds a
    container that is not empty."""
    assert dumps_indented(rows) == json.dumps(rows, indent=2)


def test_the_same_errors() -> None:
    loop: list[Any] = []
    loop.append(loop)
    for bad, error in ((loop, ValueError), ({"a": object()}, TypeError), ({(1, 2): 3}, TypeError)):
        with pytest.raises(error) as fast:
            dumps_indented(bad)
        with pytest.raises(error) as slow:
            json.dumps(bad, indent=2)
        assert str(fast.value) == str(slow.value)


def test_the_c_encoder_does_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the fallback to ``json.dumps`` the same text comes out: the C encoder made
    it (a marker inside a container encoded alone is only text); with the marker beside a
    nested container, the fallback is taken."""
    calls: list[Any] = []
    real = json.dumps
    monkeypatch.setattr(jsonout.json, "dumps", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    data = [{"name": "é", "deps": ["a", "b"], "links": {}, "n": 1.5}, [], {"x": [[1], {"y": None}]}]
    assert dumps_indented(data) == real(data, indent=2) and calls == []
    assert (
        dumps_indented([{"name": _MARK}, [1]]) == real([{"name": _MARK}, [1]], indent=2)
        and calls == []
    )
    assert (
        dumps_indented([_MARK, [1]]) == real([_MARK, [1]], indent=2) and len(calls) == 1
    )  # beside a nested one
