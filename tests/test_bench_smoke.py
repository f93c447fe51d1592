"""The benchmarks still run: bench/scale.py at a size of a few tasks prints every row
of its table (its figures are the bench's, never an assertion here). A bench's helper
changed under it (loopscale's first pass became an object) once broke it unseen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_scale_bench_runs_at_a_small_size(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH / "scale.py"), "--sizes", "20,40", "--idle", "0.2", "--passes", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    sys.path.insert(0, str(BENCH))
    try:
        import scale
    finally:
        sys.path.remove(str(BENCH))
    for label, _key, _base in scale.ROWS:
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(label)), None)
        assert line is not None and "-" not in line[len(label) :].split(), f"{label}: {line}"
