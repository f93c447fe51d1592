"""The event stream's JSON Schema (``fleetrun/events.schema.json``, shipped in the
package) and a checker of event files against it, for tests: fleetrun's own suite
checks every events file its tests leave (``tests/conftest.py``); a plugin's tests may
do the same. Needs ``jsonschema`` (``pip install fleetrun[test]``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

#: The schema, draft 2020-12: one subschema per event type under ``$defs``.
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "events.schema.json"


def load_schema() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return result


@lru_cache(maxsize=1)
def _validators() -> tuple[Any, dict[str, Any]]:
    """The whole schema's validator, and one per type: the envelope and that type's
    subschema in one object (what the whole schema asks of an event of that type, with
    no ``if`` to try per type: ~3x faster, and most lines are good)."""
    import jsonschema

    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    per_type = {}
    for name, sub in schema["$defs"].items():
        assert set(sub) <= {"description", "type", "properties", "required"}, f"{name}: merge it by hand"
        merged = {
            "type": "object",
            "required": [*schema["required"], *sub["required"]],
            "properties": {**schema["properties"], **sub["properties"]},
        }
        per_type[name] = jsonschema.Draft202012Validator(merged)
    return jsonschema.Draft202012Validator(schema), per_type


def check_lines(lines: Iterable[str], where: str = "<events>") -> list[str]:
    """Every problem of the event lines, as ``WHERE:LINE: what is wrong``."""
    whole, per_type = _validators()
    problems = []
    for n, line in enumerate(lines, 1):
        try:
            event = json.loads(line)
        except ValueError as e:
            problems.append(f"{where}:{n}: not JSON: {e}")
            continue
        fast = per_type.get(str(event.get("type"))) if isinstance(event, dict) else None
        if fast is not None and fast.is_valid(event):
            continue
        for err in sorted(whole.iter_errors(event), key=lambda e: list(e.absolute_path)):
            path = "/".join(str(p) for p in err.absolute_path) or "(the event)"
            problems.append(f"{where}:{n}: {path}: {err.message}")
    return problems


def check_file(path: Path) -> list[str]:
    """Every problem of an events file (``events.ndjson`` or a rotated one)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if text and not text.endswith("\n"):
        return [f"{path}: the last line is cut (no newline at its end)"]
    return check_lines(text.splitlines(), str(path))
