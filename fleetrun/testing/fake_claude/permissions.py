"""Claude Code's permission rules in ``-p`` mode: modes, allow and deny rules (Bash
rules per command of a compound line), what ``--tools`` leaves out.
"""

import os

from .cliargs import parse_rule
from .common import EDIT_TOOLS, KNOWN_TOOLS, OLD, READ_ONLY_TOOLS


class Permissions:
    def __init__(self, mode, allow, deny, tools, cwd, dirs):
        self.mode = mode
        self.allow = [parse_rule(r) for r in allow]
        self.deny = [parse_rule(r) for r in deny]
        self.tools = tools
        self.cwd = cwd
        self.dirs = dirs

    def _rule_names(self, tool):
        # "Edit" rules cover every built-in tool that edits files.
        return {tool, "Edit"} if tool in EDIT_TOOLS else {tool}

    def _path_matches(self, pattern, path):
        import fnmatch

        rel = os.path.relpath(path, self.cwd)
        pattern = pattern[2:] if pattern.startswith("./") else pattern
        return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(rel, pattern)

    def _file_rule(self, rules, tool, path):
        names = self._rule_names(tool)
        for name, content in rules:
            if name in names and (content is None or content in ("", "*")
                                  or self._path_matches(content, path)):
                return True
        return False

    def _in_working_dirs(self, path):
        for d in [self.cwd] + self.dirs:
            d = os.path.realpath(d)
            if path == d or path.startswith(d.rstrip(os.sep) + os.sep):
                return True
        return False

    def check(self, tool, tool_input):
        """None if allowed, else the tool_result error text."""
        if tool == "Bash":
            return self._check_bash(tool_input["command"])
        path = tool_input.get("file_path", "")
        if self._file_rule(self.deny, tool, path):
            return "Permission to use %s has been denied." % tool
        if tool in READ_ONLY_TOOLS:
            return None
        if self.mode == "bypassPermissions":
            return None
        if tool in EDIT_TOOLS:
            asking = "Claude requested permissions to write to %s, but you haven't granted it yet." % path
            if self.mode == "plan":
                return "Cannot write to %s while in plan mode." % path
            if self._file_rule(self.allow, tool, path):
                return None
            if self.mode in ("acceptEdits", "auto") and self._in_working_dirs(os.path.realpath(path)):
                return None
            if self.mode == "auto":
                return None
            if self.mode == "dontAsk":
                return self._dont_ask(tool)
            return asking
        if self._simple_rule(self.allow, tool) or self.mode == "auto":
            return None
        if self.mode == "dontAsk":
            return self._dont_ask(tool)
        return "Claude requested permissions to use %s, but you haven't granted it yet." % tool

    def _dont_ask(self, tool):
        return ("Permission to use %s has been denied because Claude Code is running in "
                "don't ask mode." % tool)

    def _simple_rule(self, rules, tool):
        return any(name == tool for name, _ in rules)

    @staticmethod
    def _bash_rule_matches(content, command):
        if content is None or content in ("", "*"):
            return True
        if content.endswith(":*"):
            prefix = content[:-2]
            return command == prefix or command.startswith(prefix + " ")
        if "*" in content:
            import fnmatch

            return fnmatch.fnmatchcase(command, content)
        return command == content

    def _check_bash(self, command):
        parts = split_commands(command)
        for name, content in self.deny:
            if name == "Bash" and any(self._bash_rule_matches(content, p) for p in parts):
                return "Permission to use Bash with command %s has been denied." % command
        if self.mode in ("bypassPermissions", "auto"):
            return None
        needing = [p for p in parts
                   if not any(name == "Bash" and self._bash_rule_matches(content, p)
                              for name, content in self.allow)
                   and not (self.mode == "acceptEdits" and self._edit_command(p))]
        if not needing:
            return None
        if self.mode == "dontAsk":
            return self._dont_ask("Bash")
        if len(needing) < len(parts):
            return ("This Bash command contains multiple operations. The following parts "
                    "require approval: %s" % ", ".join(needing))
        return "Claude requested permissions to use Bash, but you haven't granted it yet."


    def _edit_command(self, part):
        """Measured: under acceptEdits the real CLI runs simple file-system commands
        (``touch f``, ``mkdir d``, ``echo x > f``) on paths in the working directories
        without an allow rule."""
        import shlex

        try:
            words = shlex.split(part)
        except ValueError:
            return False
        if not words or any(ch in part for ch in "`$(<"):
            return False
        targets = words[1:]
        if words[0] == "echo":
            if ">" not in words and ">>" not in words:
                return False
            targets = words[-1:]
            if words[-2] not in (">", ">>"):
                return False
        elif words[0] not in FILE_COMMANDS or ">" in part:
            return False
        paths = [w for w in targets if not w.startswith("-")]
        return bool(paths) and all(
            self._in_working_dirs(os.path.realpath(os.path.join(self.cwd, w))) for w in paths)


#: What acceptEdits runs without an allow rule (on paths inside the working directories).
FILE_COMMANDS = {"touch", "mkdir", "rmdir", "rm", "mv", "cp"}


def not_enabled(tool):
    """The tool_result of a call to a tool --tools left out, in each measured version."""
    if tool not in KNOWN_TOOLS:
        return "<tool_use_error>Error: No such tool available: %s</tool_use_error>" % tool
    if OLD:
        why = "is not enabled in this context."
    else:
        why = "is disabled for this session, in subagents as well as here."
    return "<tool_use_error>Error: No such tool available: %s. %s exists but %s</tool_use_error>" % (
        tool, tool, why)


NOT_READ = "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>"


def split_commands(command):
    """Split a shell command on && || ; | & and newlines, outside of quotes."""
    parts = []
    cur = ""
    quote = None
    i = 0
    while i < len(command):
        ch = command[i]
        if quote:
            cur += ch
            if ch == "\\" and quote == '"' and i + 1 < len(command):
                cur += command[i + 1]
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur += ch
        elif ch == "\\" and i + 1 < len(command):
            cur += ch + command[i + 1]
            i += 1
        elif ch in ";|&\n":
            if command[i:i + 2] in ("&&", "||"):
                i += 1
            if cur.strip():
                parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    if cur.strip():
        parts.append(cur.strip())
    return parts
