"""Settings and command hooks as the real CLI loads and runs them: the setting sources,
the settings files and ``--settings``, SessionStart, PostToolUse and Stop hooks.
"""

import json
import os
import sys

from .cliargs import load_json_or_file, parse_rule
from .common import PERMISSION_MODES, UsageError

SETTING_SOURCES = ("user", "project", "local")
#: A Stop hook may keep a session going; the fake stops obeying after this many.
MAX_STOP_CONTINUATIONS = 20


def parse_setting_sources(value):
    """``--setting-sources user,project`` -> ["user", "project"]. Unset: all three (the
    CLI's default). Any other name is an error, as in the real CLI; "" loads none."""
    if value is None:
        return list(SETTING_SOURCES)
    out = []
    for name in value.split(","):
        name = name.strip()
        if not name:
            continue
        if name not in SETTING_SOURCES:
            raise UsageError("Error processing --setting-sources: Invalid setting source: %s. "
                             "Valid options are: user, project, local" % name)
        out.append(name)
    return out


def config_dir():
    """Claude Code's user folder: $CLAUDE_CONFIG_DIR, else ~/.claude."""
    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")


def settings_files(sources, cwd):
    """The settings files of the enabled sources, lowest precedence first."""
    paths = {"user": os.path.join(config_dir(), "settings.json"),
             "project": os.path.join(cwd, ".claude", "settings.json"),
             "local": os.path.join(cwd, ".claude", "settings.local.json")}
    return [paths[s] for s in SETTING_SOURCES if s in sources]


def load_settings_file(path):
    """A settings file's object, or None. Like the real CLI, a broken file is reported
    and skipped, not fatal."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        sys.stderr.write("Settings error: %s: %s (ignored)\n" % (path, exc))
        return None
    return data if isinstance(data, dict) else None


def load_settings(values, sources, cwd):
    """The settings of the enabled sources and ``--settings``, lowest precedence first,
    and the permissions they give (a Bash allow rule counts from every source but the
    project's settings.json, as measured): (settings list, allow rules, deny rules, the last
    valid ``defaultMode`` or None).

    :raises UsageError: if ``--settings`` is not a JSON object or a file holding one.
    """
    allow, deny = [], []
    settings_mode = None
    # lowest precedence first: user, project, local, then --settings
    named = [(source, load_settings_file(path))
             for source, path in zip([s for s in SETTING_SOURCES if s in sources], settings_files(sources, cwd))]
    if "settings" in values:
        flag_settings = load_json_or_file(values["settings"], "--settings")
        if not isinstance(flag_settings, dict):
            raise UsageError("Error: Invalid JSON provided to --settings")
        named.append(("flag", flag_settings))
    named = [(source, d) for source, d in named if d is not None]
    for source, settings in named:
        perms = settings.get("permissions")
        if not isinstance(perms, dict):
            continue
        rules = [r for r in perms.get("allow") or [] if isinstance(r, str)]
        if source == "project":
            # Measured (issue 13, 2.1.197 and 2.1.332, -p mode): an allow rule
            # Bash(fleetrun mailbox done:*) in the project's .claude/settings.json left
            # the call refused, while the same rule in settings.local.json, the user's
            # settings.json or --allowedTools let it run. Other tools' project rules count.
            rules = [r for r in rules if parse_rule(r)[0] != "Bash"]
        allow += rules
        deny += [r for r in perms.get("deny") or [] if isinstance(r, str)]
        if perms.get("defaultMode") in (*PERMISSION_MODES, "default"):  # another value is ignored
            settings_mode = perms["defaultMode"]
    return [d for _, d in named], allow, deny, settings_mode


def matcher_matches(matcher, value):
    import re

    if value is None or matcher in (None, "", "*"):
        return True
    try:
        return re.fullmatch(str(matcher), value) is not None
    except re.error:
        return matcher == value


def transcript_path(cwd, session_id):
    import re

    return os.path.join(config_dir(), "projects", re.sub(r"[^A-Za-z0-9]", "-", cwd), session_id + ".jsonl")


class Hooks:
    """The command hooks of the loaded settings, captured once at start-up (the real CLI
    snapshots hooks when a session starts: a settings file written later does not count)."""

    def __init__(self, settings_list, cwd, session_id, permission_mode):
        self.settings_list = settings_list
        self.cwd = cwd
        self.session_id = session_id
        self.permission_mode = permission_mode
        self.ran = []  # [{"event", "command", "exit"}], for the call log

    def commands(self, event, value=None):
        out, seen = [], set()
        for settings in self.settings_list:
            hooks = settings.get("hooks")
            groups = hooks.get(event) if isinstance(hooks, dict) else None
            for group in groups if isinstance(groups, list) else []:
                if not isinstance(group, dict) or not matcher_matches(group.get("matcher"), value):
                    continue
                for hook in group.get("hooks") or []:
                    if (isinstance(hook, dict) and hook.get("type") == "command"
                            and isinstance(hook.get("command"), str) and hook["command"] not in seen):
                        seen.add(hook["command"])  # identical commands run once
                        out.append(hook)
        return out

    def run(self, event, extra, value=None):
        """Run the event's hooks; returns [(exit code or None, stdout, stderr)]."""
        import subprocess

        payload = {"session_id": self.session_id, "transcript_path": transcript_path(self.cwd, self.session_id),
                   "cwd": self.cwd, "permission_mode": self.permission_mode, "hook_event_name": event}
        payload.update(extra)
        results = []
        for hook in self.commands(event, value):
            try:
                timeout = float(hook.get("timeout", 60))
            except (TypeError, ValueError):
                timeout = 60.0
            try:
                proc = subprocess.run(["/bin/sh", "-c", hook["command"]], cwd=self.cwd,
                                      input=json.dumps(payload).encode(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, timeout=timeout,
                                      env=dict(os.environ, CLAUDE_PROJECT_DIR=self.cwd))
                code, out, err = proc.returncode, proc.stdout.decode("utf-8", "replace"), \
                    proc.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                code, out, err = None, "", "hook timed out after %gs" % timeout
            except OSError as exc:
                code, out, err = None, "", str(exc)
            self.ran.append({"event": event, "command": hook["command"], "exit": code})
            results.append((code, out, err))
        return results

    def post_tool_use(self, tool, tool_use_id, tool_input, response):
        """After a tool ran (the real CLI runs PostToolUse hooks in -p mode too)."""
        self.run("PostToolUse", {"tool_name": tool, "tool_input": tool_input, "tool_use_id": tool_use_id,
                                 "tool_response": response}, value=tool)

    def session_start(self, source):
        self.run("SessionStart", {"source": source}, value=source)

    def stop(self, active, last_message):
        """Run the Stop hooks. A hook that prints {"decision": "block", "reason": R}, or
        exits 2 with R on stderr, keeps the session going: returns R (else None)."""
        reasons = []
        for code, out, err in self.run("Stop", {"stop_hook_active": active,
                                                 "last_assistant_message": last_message}):
            if code == 2:
                reasons.append(err.strip())
                continue
            if code != 0:
                continue
            try:
                decision = json.loads(out) if out.strip().startswith("{") else None
            except ValueError:
                decision = None
            if isinstance(decision, dict) and decision.get("decision") == "block":
                reasons.append(str(decision.get("reason") or ""))
        return "\n".join(reasons) if reasons else None
