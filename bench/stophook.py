"""How fast ``fleetrun mailbox stop-hook`` answers: without mail and with mail.

Claude Code runs the Stop hook at the end of every turn of every session in a role's
folder, so its start-up is on every turn's path. Each case runs ``--runs`` times (default
20) as Claude Code runs it — ``python -m fleetrun mailbox stop-hook`` with the hook's JSON
on stdin, from the role's folder — next to ``python -c pass`` (the interpreter's own
start-up), measured in the same run, and ``python -c 'import fleetrun.cli'`` (what any
fleetrun command pays before it does anything); the medians and the ratios are printed:

- ``no ledger``: a home with no ``state.db`` yet;
- ``no mail``: roles bound, nothing pending (one query, no psutil);
- ``mail for another role``: a message waits for a role whose folder does not hold the
  session's cwd (no psutil either);
- ``mail``: a message waits for the session's role; it is claimed and the block
  decision printed (psutil walks the hook's parent chain). A fresh message is delivered
  before each run, outside the timing.

With ``--script`` the ``fleetrun`` console script next to the interpreter is timed too::

    python bench/stophook.py
    python bench/stophook.py --runs 50 --script
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleetrun.plugins.mailbox import store


def once(argv: list[str], env: dict[str, str], cwd: str, stdin: bytes) -> tuple[float, bytes]:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, input=stdin, capture_output=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    return took, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--script", action="store_true", help="time the fleetrun console script too")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        role = Path(tmp) / "repo"
        role.mkdir()
        env = dict(os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")
        env.pop("FLEETRUN_PLUGINS", None)
        hook = json.dumps(
            {
                "session_id": "s",
                "transcript_path": "/dev/null",
                "cwd": str(role),
                "hook_event_name": "Stop",
                "stop_hook_active": False,
                "last_assistant_message": "done",
            }
        ).encode()
        runners = {"python -m fleetrun": [sys.executable, "-m", "fleetrun", "mailbox", "stop-hook"]}
        if ns.script:
            runners["fleetrun script"] = [str(Path(sys.executable).with_name("fleetrun")), "mailbox", "stop-hook"]
        base = statistics.median(once([sys.executable, "-c", "pass"], env, tmp, b"")[0] for _ in range(ns.runs))
        print(f"python -c pass: {base * 1000:.1f} ms (median of {ns.runs})")
        floor = statistics.median(
            once([sys.executable, "-c", "import fleetrun.cli"], env, tmp, b"")[0] for _ in range(ns.runs)
        )
        print(
            f"python -c 'import fleetrun.cli' (what any fleetrun command pays first): {floor * 1000:.1f} ms, "
            f"{floor / base:.2f}x python -c pass"
        )
        results: dict[str, dict[str, float]] = {}
        for n, (label, argv) in enumerate(runners.items()):
            results[label] = {}
            if home.exists():
                for f in home.iterdir():
                    f.unlink()
                home.rmdir()
            results[label]["no ledger"] = statistics.median(once(argv, env, str(role), hook)[0] for _ in range(ns.runs))
            home.mkdir(mode=0o700)
            from fleetrun.ledger import Ledger

            Ledger(home / "state.db").close()  # the ledger, as a run leaves it
            conn = store.connect(str(home / "state.db"))
            store.bind(conn, "repo", str(role))
            results[label]["no mail"] = statistics.median(once(argv, env, str(role), hook)[0] for _ in range(ns.runs))
            elsewhere = Path(tmp) / "other"
            elsewhere.mkdir(exist_ok=True)
            store.bind(conn, "elsewhere", str(elsewhere))
            with store.tx(conn) as cur:
                store.deliver(
                    cur,
                    "elsewhere",
                    f"task_bench{n}_x",
                    f"task_bench{n}_x_a1",
                    "Not yours.",
                    "role = elsewhere",
                    time.time(),
                )
            results[label]["mail for another role"] = statistics.median(
                once(argv, env, str(role), hook)[0] for _ in range(ns.runs)
            )
            times = []
            for i in range(ns.runs):
                with store.tx(conn) as cur:
                    store.deliver(
                        cur,
                        "repo",
                        f"task_bench{n}_{i}",
                        f"task_bench{n}_{i}_a1",
                        "Do the thing.",
                        "role = repo",
                        time.time(),
                    )
                took, out = once(argv, env, str(role), hook)
                if b'"decision": "block"' not in out:
                    raise SystemExit(f"the hook did not block with mail waiting: {out!r}")
                times.append(took)
            results[label]["mail"] = statistics.median(times)
            conn.close()
        for label, cases in results.items():
            for case, t in cases.items():
                print(f"{label} mailbox stop-hook, {case}: {t * 1000:.1f} ms, {t / base:.2f}x python -c pass")


if __name__ == "__main__":
    main()
