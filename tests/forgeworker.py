"""A hostile peer's ``fleetrun``: installed as a peer's command (``relay add --command``)
behind a real sshd, it runs the real ``fleetrun`` for every verb, and for ``host serve``
(the persistent worker) passes the real worker's lines through while it forges lines of
its own into the same stream, as a peer that lies would.

The test drives it through files in ``$FORGE_DIR``:

- ``serving``: written by it once the real worker's hello went out.
- ``inject-N.ndjson``: each line is written to the supervisor as it is, between the
  real worker's lines; the file is renamed ``inject-N.sent`` once all went out.
- ``swallow``: the kinds of event (``then``, ``ended``...), one a word, the real
  worker's lines of which are not passed on: a peer that never answers.
- ``flood.json`` ``{"count": N, "seconds": S, "pad": BYTES}``: ``ended`` events for
  made-up attempt ids (each with ``pad`` bytes of junk in its status), until N went
  out or S seconds passed; then ``flood.done`` holds how many went out.

Stdlib only: it runs with the peer's interpreter, as ``fleetrun`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

FOLDER = Path(os.environ["FORGE_DIR"])
OUT = sys.stdout.buffer
LOCK = threading.Lock()


def write(line: bytes) -> None:
    with LOCK:
        OUT.write(line if line.endswith(b"\n") else line + b"\n")
        OUT.flush()


def made_up_id(i: int) -> str:
    return f"task_{uuid.uuid4().hex[:10]}_{i % 50}_a1"


def flood(rule: dict) -> int:
    pad = int(rule.get("pad", 0))
    end = time.monotonic() + float(rule.get("seconds", 25))
    sent = 0
    while sent < int(rule.get("count", 1000)) and time.monotonic() < end:
        status = {"state": "ended", "exit_code": 0, "ended": time.time(), "junk": uuid.uuid4().hex * (pad // 32)}
        write(json.dumps({"event": "ended", "attempt": made_up_id(sent), "status": status, "log_size": 0}).encode())
        sent += 1
    return sent


def forge() -> None:
    while True:
        for path in sorted(FOLDER.glob("inject-*.ndjson")):
            for line in path.read_bytes().splitlines():
                if line.strip():
                    write(line)
            path.rename(path.with_suffix(".sent"))
        rule_path = FOLDER / "flood.json"
        if rule_path.exists():
            rule = json.loads(rule_path.read_text())
            rule_path.unlink()
            (FOLDER / "flood.done").write_text(str(flood(rule)))
        time.sleep(0.05)


def swallowed(line: bytes) -> bool:
    rule = FOLDER / "swallow"
    if not rule.exists():
        return False
    try:
        event = json.loads(line).get("event")
    except (ValueError, AttributeError):
        return False
    return event in rule.read_text().split()


def serve(argv: list[str]) -> int:
    proc = subprocess.Popen([sys.executable, "-m", "fleetrun", *argv], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    started = False
    for line in proc.stdout:
        if not swallowed(line):
            write(line)
        if not started and b'"hello"' in line:
            started = True
            (FOLDER / "serving").write_text(str(os.getpid()))
            threading.Thread(target=forge, daemon=True).start()
    return proc.wait()


def main() -> int:
    argv = sys.argv[1:]
    if argv[:2] == ["host", "serve"]:
        return serve(argv)
    os.execv(sys.executable, [sys.executable, "-m", "fleetrun", *argv])
    return 0


if __name__ == "__main__":
    sys.exit(main())
