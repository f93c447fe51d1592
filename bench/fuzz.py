"""The agent-side fuzzers of the suite, run long (for nights).

    python bench/fuzz.py                       # 2000 examples per target
    python bench/fuzz.py --examples 20000      # a night
    python bench/fuzz.py --target stream_json --target status --seed 7

Runs each target of ``tests/fuzz_targets.py`` (stream-json lines and result events,
usage-limit reset texts, shepherd status.json objects and bytes, brain replies) with
hypothesis, without pytest, and prints per target the examples run, how many the
parser accepted and how many it refused with a reason. Property: every input is
accepted or refused with a reason; an exception is a bug: it prints the smallest
failing input and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzz_targets import TARGETS  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from fleetrun import untrusted  # noqa: E402
from fleetrun.plugins.verify_brain import BrainError  # noqa: E402


def run_target(name: str, examples: int, seed: int | None) -> tuple[dict[str, int], str | None]:
    strategy, check = TARGETS[name]
    counts = {"examples": 0, "accepted": 0, "refused": 0}

    def counted(value: Any) -> None:
        counts["examples"] += 1
        check(value)
        counts["refused" if _refused(check, value) else "accepted"] += 1

    conf = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    )
    test = conf(given(strategy)(counted))
    if seed is not None:
        from hypothesis import seed as hseed

        test = hseed(seed)(test)
    try:
        test()
    except Exception:
        return counts, traceback.format_exc()
    return counts, None


def _refused(check: Callable[[Any], None], value: Any) -> bool:
    """Whether the parser behind ``check`` refused ``value`` (with its reasoned failure)."""
    import fuzz_targets as ft

    try:
        if check is ft.check_stream:
            return not ft.claude.result_from_log(value, 0).ok
        if check is ft.check_result_event:
            ft.claudecli.parse_result_event(value)
        elif check is ft.check_reset:
            return ft.claudecli.parse_reset(value) is None
        elif check is ft.check_status:
            untrusted.parse_status(value)
        elif check is ft.check_status_bytes:
            return ft.status_from_bytes(value)[1] is not None
        elif check is ft.check_brain:
            (api, endpoint), raw = value
            ft.parse_brain_reply(api, endpoint, raw)
    except (untrusted.Malformed, BrainError):
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=2000, help="examples per target (default 2000)")
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="only these (repeatable)")
    ap.add_argument("--seed", type=int, help="a fixed seed, to repeat a run")
    ns = ap.parse_args(argv)
    failed = 0
    print(f"{'target':<14} {'examples':>9} {'accepted':>9} {'refused':>9} {'time':>8}")
    for name in ns.target or sorted(TARGETS):
        start = time.monotonic()
        counts, error = run_target(name, ns.examples, ns.seed)
        took = time.monotonic() - start
        print(
            f"{name:<14} {counts['examples']:>9} {counts['accepted']:>9} {counts['refused']:>9} {took:>7.1f}s"
            + ("  FAILED" if error else ""),
            flush=True,
        )
        if error:
            failed += 1
            print(error, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
