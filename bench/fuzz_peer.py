"""Fuzz the supervisor's reading of peers for as long as you like (issue 10, item 4).

The same targets and strategies as ``tests/test_untrusted_peer.py`` (which runs them
bounded, 200 examples each): every verb's reply parser, the cached peer state, raw
reply bytes and the bundle header stream. The property: a value or a reasoned
refusal (``Malformed``, ``PeerError``), never another exception. Prints, per target,
how many examples ran and how each ended::

    python bench/fuzz_peer.py                   # 2000 examples per target
    python bench/fuzz_peer.py --examples 50000  # a night
    python bench/fuzz_peer.py --only status,probe

Exit status 1 if any target raised something else (hypothesis prints the smallest
example it found).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_untrusted_peer import (  # noqa: E402
    PARSERS,
    VALID,
    bundle_chunks,
    damaged,
    json_values,
    raw_bytes,
    run_bundle_stream,
    run_entry,
    run_parser,
    run_raw,
)


def targets(tmp: Path) -> dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], str]]]:
    out: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], str]]] = {}
    for verb in sorted(PARSERS):
        out[f"reply:{verb}"] = (damaged(verb), lambda v, verb=verb: run_parser(verb, v))
    out["peer-state:cached"] = (st.one_of(damaged("peer-state"), json_values), run_entry)
    out["raw-bytes"] = (raw_bytes(), run_raw)
    out["bundle-stream"] = (bundle_chunks(), lambda c: run_bundle_stream(c, tmp))
    return out


def fuzz(strategy: st.SearchStrategy[Any], run: Callable[[Any], str], counts: Counter[str], examples: int) -> None:
    """Run one target ``examples`` times, counting how each example ended."""

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(value: Any) -> None:
        counts[run(value)] += 1

    one()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=2000, help="examples per target (default 2000)")
    ap.add_argument("--only", default="", help="comma-separated substrings of target names")
    ns = ap.parse_args()
    wanted = [w for w in ns.only.split(",") if w]
    failed = 0
    total = 0
    with tempfile.TemporaryDirectory() as d:
        for name, (strategy, run) in targets(Path(d)).items():
            if wanted and not any(w in name for w in wanted):
                continue
            counts: Counter[str] = Counter()
            start = time.monotonic()
            try:
                fuzz(strategy, run, counts, ns.examples)
                verdict = "ok"
            except Exception as e:  # the property broke: say so, go on with the others
                failed += 1
                verdict = f"FAILED: {type(e).__name__}: {e}"
            n = sum(counts.values())
            total += n
            shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            print(f"{name:<24} {n:>7} examples in {time.monotonic() - start:6.1f}s  ({shown})  {verdict}", flush=True)
    print(f"{total} examples, {failed} target(s) failed; valid replies known for {len(VALID)} kinds")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
