"""The command-line examples of README.md and docs/*.md, run: docs and tool cannot drift.

The convention (docs/cli.md, "Examples in these docs"):

- A fenced block whose info string starts with ``console`` is an example that runs.
  Its ``$ COMMAND`` lines are run by bash, one after the other in one shell (so
  ``echo $?`` reports the command before it), and each is followed by the lines it
  prints (standard output and error together). Other fenced blocks are not run.
- ``console unordered``: the lines of each command may come in any order (tasks run
  at once, so their lines interleave differently from one run to the next).
- In an expected line ``...`` stands for any text; a line holding only ``...`` for any
  number of lines. Times (``08:33:12``), task ids (``task_mx1l9se9683172_0``) and
  durations (``in 2s``) match whatever they are.
- A fenced block whose info string is ``toml file=NAME`` (or any language with
  ``file=NAME``) is written to ``NAME`` for the examples after it in the same document.
- Each example runs in a fresh folder holding a copy of ``examples/``, with
  ``HOME=/home/me`` (so the fleetrun home shows as ``/home/me/.fleetrun``), the
  ``fleetrun`` of this checkout on ``PATH``, and no colour. Examples run the bundled
  demo (a scripted agent, no model): each takes about a second.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FAKE_HOME = "/home/me"

_FENCE = re.compile(r"^(\s*)(`{3,})(.*)$")


@dataclass
class Command:
    line: int
    text: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Example:
    doc: Path
    line: int
    unordered: bool
    commands: list[Command]
    files: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def parse(doc: Path) -> list[Example]:
    """The console examples of ``doc``, each with the files declared before it."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    examples: list[Example] = []
    files: dict[str, str] = {}
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start = i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip("`") == ""):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        words = info.split()
        name = next((w[5:] for w in words if w.startswith("file=")), None)
        if name:
            files[name] = "\n".join(body) + "\n"
        if words[:1] == ["console"]:
            commands: list[Command] = []
            for n, text in enumerate(body):
                if text.startswith("$ "):
                    commands.append(Command(start + n + 1, text[2:]))
                elif commands:
                    commands[-1].expected.append(text)
            assert commands, f"{doc}:{start}: a console block without a `$ ` command"
            examples.append(Example(doc, start, "unordered" in words[1:], commands, dict(files)))
    return examples


ALL = [ex for doc in DOCS for ex in parse(doc)]


# ---------------------------------------------------------------------------------
# matching

_VOLATILE = [
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "HH:MM:SS"),
    (re.compile(r"\btask_[0-9a-z]+_(\d+)\b"), r"task_ID_\1"),
    (re.compile(r"\bin (\d+h)?(\d+m)?\d+s\b"), "in Ns"),
]


def normalize(text: str) -> str:
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return text.rstrip()


def line_pattern(expected: str) -> re.Pattern[str]:
    parts = normalize(expected).split("...")
    return re.compile(".*".join(re.escape(p) for p in parts) + r"\Z")


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def matches(expected: list[str], actual: list[str], unordered: bool) -> bool:
    expected, actual = _trim(expected), _trim([normalize(a) for a in actual])
    if unordered:
        rest = list(actual)
        gap = "..." in [e.strip() for e in expected]
        for e in expected:
            if e.strip() == "...":
                continue
            pat = line_pattern(e)
            hit = next((k for k, a in enumerate(rest) if pat.match(a)), None)
            if hit is None:
                return False
            del rest[hit]
        return gap or not rest

    def walk(ei: int, ai: int) -> bool:
        if ei == len(expected):
            return ai == len(actual)
        if expected[ei].strip() == "...":
            return any(walk(ei + 1, k) for k in range(ai, len(actual) + 1))
        return ai < len(actual) and bool(line_pattern(expected[ei]).match(actual[ai])) and walk(ei + 1, ai + 1)

    return walk(0, 0)


# ---------------------------------------------------------------------------------
# running

_MARK = "\x1e@@fleetrun-docs-example@@"


def run_example(ex: Example, tmp: Path) -> list[list[str]]:
    """Each command's output lines, in order."""
    work = tmp / "w"
    shutil.copytree(REPO / "examples", work / "examples", ignore=shutil.ignore_patterns("sandbox", "__pycache__"))
    home = tmp / "me"
    home.mkdir()
    for name, text in ex.files.items():
        p = work / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "fleetrun"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fleetrun "$@"\n')
    shim.chmod(0o755)
    script = ["exec 2>&1"]
    for c in ex.commands:
        # the marker keeps $? of the command before it, for `echo $?`
        script += [f"__rc=$?; printf '%s\\n' '{_MARK}'; (exit $__rc)", c.text]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETRUN_")}
    env.update(
        HOME=str(home),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
        FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1",
        GIT_AUTHOR_NAME="me",
        GIT_AUTHOR_EMAIL="me@example.invalid",
        GIT_COMMITTER_NAME="me",
        GIT_COMMITTER_EMAIL="me@example.invalid",
    )
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        timeout=120,
    )
    text = proc.stdout.decode(errors="replace").replace(str(home), FAKE_HOME)
    chunks = text.split(_MARK + "\n")[1:]
    return [chunk.splitlines() for chunk in chunks]


@pytest.mark.parametrize("ex", ALL, ids=[ex.id for ex in ALL])
def test_docs_example(ex: Example, tmp_path: Path) -> None:
    outputs = run_example(ex, tmp_path)
    assert len(outputs) == len(ex.commands)
    wrong = []
    for c, actual in zip(ex.commands, outputs):
        if not matches(c.expected, actual, ex.unordered):
            wrong.append(
                f"{ex.doc.relative_to(REPO)}:{c.line}: $ {c.text}\n  the docs say:\n    "
                + "\n    ".join(c.expected)
                + "\n  fleetrun printed:\n    "
                + "\n    ".join(actual)
            )
    assert not wrong, "\n".join(wrong)


def test_the_docs_have_examples_that_run() -> None:
    """The examples this file runs are where users look: the README and the CLI reference."""
    docs = {ex.doc.name for ex in ALL}
    assert {"README.md", "cli.md", "tasks-toml.md"} <= docs, docs


# the matcher itself, so a broken matcher cannot make every example pass


def test_matcher_wildcards_and_volatile_parts() -> None:
    assert matches(["08:33:12 a DONE", "=== 1 done in 2s ==="], ["10:01:59 a DONE", "=== 1 done in 0s ==="], False)
    assert matches(
        ["fleetrun 0.1.0 -- home ... -- plugins: ..."], ["fleetrun 0.1.0 -- home /x -- plugins: a, b"], False
    )
    assert matches(["first", "...", "last"], ["first", "x", "y", "last"], False)
    assert matches(["b", "a"], ["a", "b"], True)
    assert not matches(["a"], ["a", "b"], False)
    assert not matches(["a", "b"], ["b", "a"], False)
    assert not matches(["a"], ["a", "b"], True)
    assert not matches(["0 tasks collected"], ["", "0 tasks collected"], False)
    assert not matches(["tasks.toml: 0 tasks, valid"], ["tasks.toml: no tasks collected"], False)
