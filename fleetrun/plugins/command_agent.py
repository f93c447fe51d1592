"""Built-in ``command_agent`` plugin: any agent CLI, by a command template.

Declared in a tasks file or ``$FLEETRUN_HOME/config.toml``::

    [agents.codex]
    command = ["codex", "exec", "{prompt}"]

and picked with ``agent = "codex"``. Placeholders (``{prompt}``, ``{prompt_file}``,
``{workdir}``, ``{model}``, ``{attempt}``, ``{tasks_dir}`` — the tasks file's
folder — and ``{python}`` — the interpreter running fleetrun) are substituted inside argv items; the
command never goes through a shell, so a prompt is one argument whatever it holds.
``stdin = true`` feeds the prompt on standard input too. Such an agent reports no
cost and no session: its exit code is the only signal of success. Its summary for
dependent tasks is what it wrote to ``$FLEETRUN_SUMMARY_FILE`` (:mod:`fleetrun.summary`),
never its output.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..exceptions import UsageError
from ..hookimpl import hookimpl
from ..reports import AgentEnd, AgentResult, SpawnSpec
from ..summary import read_summary, summary_path

if TYPE_CHECKING:
    from ..config import Config

PLACEHOLDERS = ("{prompt}", "{prompt_file}", "{workdir}", "{model}", "{attempt}", "{tasks_dir}", "{python}")
_KEYS = {"command", "stdin", "env"}


#: What may be a placeholder: a name in braces, not after a ``$`` (the shell's
#: ``${HOME}``). Other braces (``{}``, a dict literal in a ``python -c`` argument) are
#: the command's own.
_PLACEHOLDER_LIKE = re.compile(r"(?<!\$)\{[A-Za-z_][A-Za-z0-9_]*\}")


def _command_check(v: list[Any]) -> Optional[str]:
    """An empty command, or a misspelt placeholder: ``{workdri}`` would reach the agent
    literally, the night a task uses the agent. A name in braces that is close to no
    placeholder (``{i}`` in a Python f-string, ``{print}``) is the command's own text,
    which fleetrun passes on as it is."""
    if not v:
        return "must not be empty"
    import difflib

    problems: list[str] = []
    for item in v:
        for ph in _PLACEHOLDER_LIKE.findall(item):
            if ph in PLACEHOLDERS or any(ph in p for p in problems):
                continue
            close = difflib.get_close_matches(ph, PLACEHOLDERS, n=1, cutoff=0.75)
            if close:
                problems.append(f"unknown placeholder {ph} (did you mean {close[0]}?)")
    return ", ".join(problems) or None


@hookimpl(trylast=True)
def fleetrun_config_keys(config: Config) -> list[Any]:
    """``[agents.NAME]`` of config.toml (a tasks file's own are checked in :func:`agent_def`)."""
    from ..config import ConfigKey

    return [
        ConfigKey(
            "agents.*",
            "command",
            (list,),
            items=str,
            check=_command_check,
            required=True,
            doc="argv of the agent, with placeholders",
        ),
        ConfigKey("agents.*", "stdin", (bool,), doc="also write the prompt on standard input"),
        ConfigKey("agents.*", "env", (dict,), items=str, doc="extra environment variables"),
    ]


def agents(config: Config) -> dict[str, Any]:
    return config.settings.get("agents", {}) or {}


def agent_def(config: Config, name: str) -> Optional[dict[str, Any]]:
    defn = agents(config).get(name)
    if defn is None:
        return None
    where = f"agents.{name}"
    if not isinstance(defn, dict):
        raise UsageError("must be a table with command = [...]", key=where)
    unknown = set(defn) - _KEYS
    if unknown:
        raise UsageError(f"unknown key {sorted(unknown)[0]!r} (known: command, stdin, env)", key=where)
    cmd = defn.get("command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(x, str) for x in cmd):
        raise UsageError("command must be a non-empty list of strings", key=f"{where}.command")
    return defn


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    """An ``agent =`` that names no agent is an error before anything runs."""
    import difflib
    from pathlib import Path

    from ..collect import display_path
    from ..exceptions import UsageErrors
    from ..hosts import executable_problem
    from ..queueing import warn_tasks

    errors = []
    missing: dict[str, tuple[Any, int, str]] = {}  # by agent: its first task, how many, why
    problems: dict[str, Optional[str]] = {}
    for t in items:
        if t.agent == "claude":
            continue
        defn = agent_def(config, t.agent)
        exe = defn["command"][0] if defn is not None else ""
        if exe not in problems:  # looked up once an agent command, not once a task
            problems[exe] = executable_problem(exe) if exe and not any(ph in exe for ph in PLACEHOLDERS) else None
        problem = problems[exe]
        if problem:
            first, count, _ = missing.get(t.agent, (t, 0, problem))
            missing[t.agent] = (first, count + 1, problem)
        if defn is None:
            names = ["claude", *agents(config)]
            close = difflib.get_close_matches(t.agent, names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(names)})"
            errors.append(
                UsageError(
                    f"{t.agent!r} is not an agent{hint}; declare it as [agents.{t.agent}]",
                    file=display_path(Path(t.file_of("agent")), config.invocation_dir),
                    line=t.key_lines.get("agent", t.line),
                    key=f"task '{t.name}': agent",
                )
            )
    for first, count, problem in missing.values():
        # not an error: the task may be placed on a peer that has the tool
        warn_tasks(config, first, count, "agent", f"{problem} (set [agents.{first.agent}] command)")
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise UsageErrors(errors)


def render(command: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for item in command:
        for ph in PLACEHOLDERS:
            if ph in item:
                item = item.replace(ph, values.get(ph[1:-1], ""))
        out.append(item)
    return out


@hookimpl(trylast=True)
def fleetrun_spawn(task: Any, attempt: Any, workspace: Any, prompt: str, config: Config) -> Optional[SpawnSpec]:
    defn = agent_def(config, task.spec.agent) if task.spec.agent != "claude" else None
    if defn is None:
        return None
    values = {
        "prompt": prompt,
        # the attempt folder on its host (recorded when the workspace was prepared)
        "prompt_file": str(Path(attempt.dir or config.home / "attempts" / attempt.id) / "prompt"),
        "workdir": workspace.path,
        "model": task.spec.model or "",
        "attempt": str(attempt.number),
        "tasks_dir": os.path.dirname(task.spec.source or task.source or "."),
        "python": sys.executable,
    }
    env = {str(k): str(v) for k, v in defn["env"].items()} if isinstance(defn.get("env"), dict) else {}
    return SpawnSpec(
        argv=render(defn["command"], values),
        env=env,
        stdin="prompt" if defn.get("stdin") else None,
        parser="command_agent",
    )


@hookimpl(trylast=True)
def fleetrun_agent_result(
    task: Any, attempt: Any, log_path: str, exit_code: Optional[int], config: Config
) -> Optional[AgentResult]:
    if task.spec.agent == "claude":
        return None
    # the summary file sits next to the log, in the attempt folder; the output itself
    # (debug lines, progress) is never a summary
    text = read_summary(summary_path(os.path.dirname(log_path)))
    ok = exit_code == 0
    # an exit code is all a command says: 0 is verified, anything else resumed (None:
    # its host's reason decides, as for a session that died)
    return AgentResult(
        ok=ok,
        reason="" if ok else f"exit:{exit_code}",
        exit_code=exit_code,
        result_text=text,
        end=AgentEnd.ok() if ok else None,
    )
