"""git and gh, run without a shell, and what they print read strictly.

Nothing here knows fleetrun: :func:`run` starts a program and says why it failed in
words (never an exception), :func:`parse_list` and :func:`parse_created` read what
``gh`` printed. ``gh``'s output is not trusted (a wrong ``gh`` on the PATH, a proxy's
HTML page, a newer gh that prints more): a URL is taken only when it is one
(``https://``, a host, printable ASCII, :func:`fleetrun.check_url`), anything
else is a reason.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Optional, Union

import fleetrun

#: What a gh or git failure may show of its output, per stream.
TAIL_CHARS = 600
#: The environment variables that hold credentials: their values never reach a note.
SECRET_VARS = ("GH_TOKEN", "GITHUB_TOKEN", "GH_ENTERPRISE_TOKEN", "GITHUB_ENTERPRISE_TOKEN")
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


@dataclass
class Ran:
    """A finished program: its exit code and output, or why it did not run."""

    code: Optional[int]
    out: str = ""
    err: str = ""
    why: str = ""  # it did not start, or timed out

    @property
    def ok(self) -> bool:
        return self.code == 0


def scrub(text: str) -> str:
    """``text`` without credentials: the values of :data:`SECRET_VARS` and the
    ``user:password@`` of a URL become ``***``."""
    for var in SECRET_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return _USERINFO.sub("***@", text)


def tail(text: str) -> str:
    """The end of an output, on one line, scrubbed: what a note quotes."""
    text = " ".join(scrub(text).split())
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def run(
    argv: list[str], cwd: str, timeout_s: float, stdin: Optional[str] = None, env: Optional[dict[str, str]] = None
) -> Ran:
    """Run ``argv`` in ``cwd`` with this process's environment (``GH_TOKEN`` and the
    git credential helpers reach the program, and nothing writes them down) plus
    ``env``; never a shell, never a terminal prompt."""
    import subprocess  # here: fleetrun --help loads the plugin, and must not import it

    full = dict(
        os.environ,
        GIT_TERMINAL_PROMPT="0",
        GH_PROMPT_DISABLED="1",
        GH_NO_UPDATE_NOTIFIER="1",
        NO_COLOR="1",
        GH_SPINNER_DISABLED="1",
        **(env or {}),
    )
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env=full,
        )
    except FileNotFoundError:
        return Ran(None, why=f"{argv[0]} not found")
    except PermissionError:
        return Ran(None, why=f"{argv[0]} is not executable")
    except subprocess.TimeoutExpired:
        return Ran(None, why=f"no answer in {timeout_s:g}s")
    except OSError as e:
        return Ran(None, why=f"cannot start {argv[0]}: {e.strerror or e}")
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def failure(what: str, ran: Ran) -> str:
    """Why ``what`` failed, with what it said: ``gh pr create: exit code 4: To get started...``."""
    if ran.why:
        return f"{what}: {ran.why}"
    said = tail(ran.err) or tail(ran.out) or "(it printed nothing)"
    return f"{what}: exit code {ran.code}: {said}"


def _url(value: object) -> Union[str, None]:
    # fleetrun.check_url is imported on first use (the ledger comes with it): loading the
    # plugin, which every command does once it is installed, stays cheap
    return value if isinstance(value, str) and fleetrun.check_url(value, ("https",)) is None else None


def parse_list(out: str) -> Union[tuple[str, Optional[str]], str]:
    """``gh pr list --head BRANCH --json url``'s stdout.

    :return: ``("found", url)`` (the first pull request), ``("none", None)`` (``[]``), or
        the reason it is not an answer (a str).
    """
    try:
        data = json.loads(out)
    except ValueError:
        return f"printed something that is not JSON: {tail(out)[:200] or '(nothing)'}"
    if not isinstance(data, list) or not all(isinstance(i, dict) for i in data):
        return f"printed JSON that is not a list of pull requests: {tail(out)[:200]}"
    if not data:
        return ("none", None)
    url = _url(data[0].get("url"))
    if url is None:
        return f"printed a pull request whose url is not an https URL: {tail(str(data[0].get('url')))[:200]}"
    return ("found", url)


def parse_created(out: str) -> Union[str, tuple[str]]:
    """``gh pr create``'s stdout: the new pull request's URL, its last line.

    :return: ``(url,)``, or the reason there is none (a str).
    """
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    url = _url(lines[-1]) if lines else None
    if url is None:
        return f"printed no https URL of a pull request: {tail(out)[:200] or '(nothing)'}"
    return (url,)


_EXISTS = re.compile(r'a pull request for branch ".*" into branch ".*" already exists:\s*(\S+)\s*\Z', re.S)


def existing_from_error(err: str) -> Optional[str]:
    """The URL in gh's ``a pull request for branch "B" into branch "main" already
    exists:\\nURL`` (another process opened it between our list and our create)."""
    m = _EXISTS.search(err.strip())
    return _url(m.group(1)) if m else None
