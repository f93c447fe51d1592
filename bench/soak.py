"""The chaos soak (issue 21): not a timing. A queue of a few hundred tasks with
dependencies (some ``base = "dependencies"``), retries, reviewers, malformed agent
output and known costs runs under ``fleetrun work`` while the supervisor is SIGKILLed
(and started again), shepherds are SIGKILLed and the home's disk fills up for a while,
at random moments (and, with ``--peers``, a peer's link drops for a while); then the invariants are checked and the counts printed: every task
ended once, no two attempts of a task at once, no orphan process, every DONE branch of
``base = "dependencies"`` holds its dependencies' heads, the ledger's costs are the
agents' reported costs, no file under the home over the cap. Exit 0 only with no
violation.

    python bench/soak.py                 # 300 tasks, seed 1
    python bench/soak.py --seed 7 --tasks 100 --no-disk-full
    python bench/soak.py --long          # 1,000 tasks: a night's run
    python bench/soak.py --peers 2       # two peers in network namespaces too

The harness is tests/soakrun.py (the bounded run in the default suite,
tests/acceptance/test_soak.py, is the same code); the durability checks are the
crash-point tests' own. Where this machine cannot mount a tmpfs (not root), the full
disk is left out with the reason printed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import pytest  # noqa: E402 - the MonkeyPatch that Fleeter and FakeClaude set the environment with
from soakrun import NetPeers, Soak, SoakOptions, kill_orphans  # noqa: E402

from fleetrun.fleeter import FakeClaude, Fleeter  # noqa: E402

LONG = 1000


def mount_small_home(root: Path, size_mb: int) -> tuple[Optional[Path], Optional[str]]:
    """A tmpfs of ``size_mb`` for the home: :return: (its folder, None) or (None, why not)."""
    mnt = root / "small"
    mnt.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot mount a tmpfs: {e}"
    if r.returncode != 0:
        return None, "cannot mount a tmpfs (needs root): " + (r.stderr.strip() or f"exit {r.returncode}")
    return mnt, None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=300, help="tasks in the queue (default 300)")
    ap.add_argument("--long", action="store_true", help=f"{LONG} tasks, for a night's run")
    ap.add_argument("--seed", type=int, default=1, help="the queue and the chaos schedule come from it")
    ap.add_argument("--parallel", type=int, default=4, help="[local] max_tasks (default 4)")
    ap.add_argument("--no-supervisor-kills", action="store_true")
    ap.add_argument("--no-shepherd-kills", action="store_true")
    ap.add_argument("--no-disk-full", action="store_true")
    ap.add_argument("--no-malformed", action="store_true", help="no agent emits malformed stream-json")
    ap.add_argument("--chatty", type=int, default=2, help="agents printing more than the cap (default 2)")
    ap.add_argument("--detach", type=int, default=2, help="agents leaving a setsid process behind (default 2)")
    ap.add_argument(
        "--gap",
        type=float,
        nargs=2,
        default=(0.5, 3.0),
        metavar=("MIN", "MAX"),
        help="seconds between blows, uniform (default 0.5 3)",
    )
    ap.add_argument(
        "--deadline", type=float, default=None, help="seconds before the run counts as hung (default 6 s a task)"
    )
    ap.add_argument(
        "--peers",
        type=int,
        default=0,
        help="peers in network namespaces, each a real sshd "
        "(default 0; skipped with the reason where the machine cannot)",
    )
    ap.add_argument("--no-peer-links", action="store_true", help="never drop a peer's link")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (the home, the repo, the logs)")
    args = ap.parse_args(argv)
    n = LONG if args.long else args.tasks
    opts = SoakOptions(
        tasks=n,
        seed=args.seed,
        parallel=args.parallel,
        supervisor_kills=not args.no_supervisor_kills,
        shepherd_kills=not args.no_shepherd_kills,
        disk_full=not args.no_disk_full,
        malformed=not args.no_malformed,
        chatty=args.chatty,
        detach=args.detach,
        gap=tuple(args.gap),
        deadline=args.deadline or 6.0 * n,
        peer_links=not args.no_peer_links,
        log=lambda line: print(line, flush=True),
    )
    root = Path(tempfile.mkdtemp(prefix="fleetrun-soak-"))
    print(f"soak: {n} tasks, seed {args.seed}, in {root}", flush=True)
    mnt: Optional[Path] = None
    why: Optional[str] = "--no-disk-full"
    if not args.no_disk_full:
        # room for the worktrees of the running tasks, the attempt folders and the ledger
        mnt, why = mount_small_home(root, 64 + n // 2)
    code = 1
    try:
        with pytest.MonkeyPatch.context() as mp:
            fleeter = Fleeter(root, mp)
            fake = FakeClaude(fleeter, mp)
            if mnt is not None:
                fleeter.home = mnt / "h"
                mp.setenv("FLEETRUN_HOME", str(fleeter.home))
            peers: Optional[NetPeers] = None
            if args.peers:
                try:
                    peers = NetPeers(root, mp, args.peers)
                    print(f"peers: {args.peers} in network namespaces", flush=True)
                except BaseException as e:  # pytest's Skipped too: the reason this machine cannot
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    print(f"peers: none ({type(e).__name__}: {e})", flush=True)
            try:
                report = Soak(fleeter, fake, opts, root, small_disk=why, peers=peers).run()
                print("\n".join(report.lines()), flush=True)
            finally:
                if peers is not None:
                    peers.close()
                kill_orphans(root)
                fleeter.close()
                if args.keep and mnt is not None:  # the tmpfs goes: keep a copy of the home
                    shutil.copytree(
                        fleeter.home,
                        root / "home",
                        symlinks=True,
                        dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.sock"),
                    )
        code = 1 if report.violations else 0
    finally:
        if mnt is not None:
            kill_orphans(root)
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        if args.keep:
            print(f"kept {root} (the home: {root / 'home'})" if mnt else f"kept {root}")
        else:
            subprocess.run(["rm", "-rf", str(root)], check=False)
    return code


if __name__ == "__main__":
    started = time.monotonic()
    rc = main()
    print(f"exit {rc} after {time.monotonic() - started:.0f}s")
    sys.exit(rc)
