"""The scripted scenario the fake acts out instead of asking a model: the step of this
invocation (per-key counters and the session store, under one flock), its actions as
tool calls, and the check of a step's structured output against ``--json-schema``.
"""

import json
import os
import time
import uuid

from .common import MODES, OLD, scenario_fail
from .permissions import NOT_READ, not_enabled


class State:
    """Counters and the session store, in a directory, under one flock."""

    def __init__(self, directory):
        self.dir = directory
        self.fd = None

    def __enter__(self):
        import fcntl

        os.makedirs(self.dir, exist_ok=True)
        self.fd = os.open(os.path.join(self.dir, ".fake-claude.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock

    def _path(self, name):
        return os.path.join(self.dir, name)

    def next_count(self, key):
        path = self._path("fake-claude-counters.json")
        try:
            with open(path) as f:
                counters = json.load(f)
        except (OSError, ValueError):
            counters = {}
        counters[key] = counters.get(key, 0) + 1
        tmp = path + ".tmp.%d" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(counters, f)
        os.replace(tmp, path)
        return counters[key]

    def add_cost(self, session_id, cost):
        """Add an invocation's cost to its session's; return what the session cost before."""
        path = self._path("fake-claude-costs.json")
        try:
            with open(path) as f:
                costs = json.load(f)
        except (OSError, ValueError):
            costs = {}
        before = float(costs.get(session_id, 0.0))
        costs[session_id] = before + cost
        tmp = path + ".tmp.%d" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(costs, f)
        os.replace(tmp, path)
        return before

    def sessions(self):
        out = []
        try:
            with open(self._path("fake-claude-sessions.jsonl")) as f:
                for line in f:
                    if line.strip():
                        out.append(json.loads(line))
        except OSError:
            pass
        return out

    def prompts(self, session_id):
        """The prompts sent so far in a session (what a resume sends again)."""
        try:
            with open(self._path("fake-claude-prompts.jsonl")) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []
        return [r["prompt"] for r in rows if r["session_id"] == session_id]

    def add_prompt(self, session_id, prompt):
        with open(self._path("fake-claude-prompts.jsonl"), "a") as f:
            f.write(json.dumps({"session_id": session_id, "prompt": prompt}) + "\n")

    def add_session(self, session_id, cwd):
        with open(self._path("fake-claude-sessions.jsonl"), "a") as f:
            f.write(json.dumps({"session_id": session_id, "cwd": cwd}) + "\n")


def load_step(scenario_path, key_name, n):
    if not scenario_path:
        return {}, "default"
    try:
        with open(scenario_path) as f:
            scenario = json.load(f)
    except (OSError, ValueError) as exc:
        scenario_fail("cannot read %s: %s" % (scenario_path, exc))
    if not isinstance(scenario, dict):
        scenario_fail("the file must map keys to lists of steps")
    key = key_name if key_name and key_name in scenario else "default"
    steps = scenario.get(key)
    if steps is None:
        return {}, key
    if isinstance(steps, dict):
        steps = [steps]
    if not isinstance(steps, list) or not steps:
        scenario_fail("%r must be a non-empty list of steps" % key)
    return steps[min(n, len(steps)) - 1], key


def check_step(step):
    if not isinstance(step, dict):
        scenario_fail("a step must be an object: %r" % (step,))
    known = {"actions", "result", "cost", "turns", "mode", "exit", "stall", "reset_at",
             "limit_style", "structured", "raw", "auth", "status"}
    extra = set(step) - known
    if extra:
        scenario_fail("unknown step keys %s" % sorted(extra))
    if step.get("mode", "ok") not in MODES:
        scenario_fail("unknown mode %r (known: %s)" % (step.get("mode"), ", ".join(MODES)))
    arity = {"write": 3, "append": 3, "bash": 2, "commit": 2, "read": 2, "sleep": 2, "print": 2}
    for action in step.get("actions", []):
        if not isinstance(action, list) or not action or action[0] not in arity:
            scenario_fail("unknown action %r" % (action,))
        if len(action) != arity[action[0]]:
            scenario_fail("action %r takes %d arguments" % (action, arity[action[0]] - 1))


class Session:
    def __init__(self, out, perms, cwd, hooks=None):
        self.out = out
        self.perms = perms
        self.cwd = cwd
        self.hooks = hooks
        self.denials = []
        self.known = set()  # files this session read or wrote (its "file state")
        self.cut = False  # the budget ran out during this turn: the tool is cut off

    def tool(self, name, tool_input, run):
        tool_use_id = "toolu_" + uuid.uuid4().hex[:24]
        self.out.assistant([{"type": "tool_use", "id": tool_use_id, "name": name,
                             "input": tool_input}])
        if name not in self.perms.tools:
            # a tool --tools left out is not there at all: not a permission denial
            self.out.tool_result(tool_use_id, not_enabled(name), True)
            return
        path = tool_input.get("file_path")
        if OLD and name in ("Write", "Edit") and path and os.path.exists(path) \
                and path not in self.known:
            # 2.1.197 validates before it asks: an existing file must have been read
            self.out.tool_result(tool_use_id, NOT_READ, True)
            return
        refusal = self.perms.check(name, tool_input)
        if refusal is not None:
            self.denials.append({"tool_name": name, "tool_use_id": tool_use_id,
                                 "tool_input": tool_input})
            self.out.tool_result(tool_use_id, refusal, True)
            return
        if self.cut:
            if name == "Write":  # the write goes to a temporary file, renamed when done
                tmp = "%s.tmp.%d.%x" % (path, os.getpid(), int(time.time() * 1000))
                try:
                    with open(tmp, "w") as f:
                        f.write(tool_input.get("content", ""))
                except OSError:
                    pass
            return
        content, is_error = run()
        if path and not is_error:
            self.known.add(path)
        self.out.tool_result(tool_use_id, content, is_error)
        if self.hooks is not None and not is_error:
            self.hooks.post_tool_use(name, tool_use_id, tool_input, content)

    def path(self, p):
        return os.path.normpath(os.path.join(self.cwd, p))

    def act(self, action):
        kind = action[0]
        if kind == "print":
            self.out.text(str(action[1]))
        elif kind == "sleep":
            time.sleep(float(action[1]))
        elif kind == "write":
            path, content = self.path(action[1]), action[2]
            self.tool("Write", {"file_path": path, "content": content},
                      lambda: self._write(path, content, "w"))
        elif kind == "append":
            path, content = self.path(action[1]), action[2]
            self.tool("Edit", {"file_path": path, "old_string": "", "new_string": content},
                      lambda: self._write(path, content, "a"))
        elif kind == "read":
            path = self.path(action[1])
            self.tool("Read", {"file_path": path}, lambda: self._read(path))
        elif kind == "bash":
            command = action[1]
            self.tool("Bash", {"command": command, "description": "Run a command"},
                      lambda: self._sh(command))
        elif kind == "commit":
            import shlex

            command = "git add -A && git commit -q -m %s" % shlex.quote(action[1])
            self.tool("Bash", {"command": command, "description": "Commit the changes"},
                      lambda: self._sh(command))

    def _write(self, path, content, how):
        existed = os.path.exists(path)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, how) as f:
                f.write(content)
        except OSError as exc:
            return "<tool_use_error>%s</tool_use_error>" % exc, True
        if how == "w" and not existed:
            return ("File created successfully at: %s (file state is current in your context "
                    "\u2014 no need to Read it back)" % path), False
        return "The file %s has been updated." % path, False

    def _read(self, path):
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            return "<tool_use_error>File does not exist.</tool_use_error>", True
        return "\n".join("%d\t%s" % (i + 1, line) for i, line in enumerate(lines)), False

    def _sh(self, command):
        import subprocess

        proc = subprocess.run(["/bin/sh", "-c", command], cwd=self.cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        text = proc.stdout.decode("utf-8", "replace").rstrip("\n")
        if proc.returncode != 0:
            return ("Exit code %d\n%s" % (proc.returncode, text)).rstrip("\n"), True
        return text, False


def schema_errors(value, schema, where="$"):
    """A small JSON Schema check (type, enum, properties, required, additionalProperties,
    items): enough for the schemas tests pass. Returns a list of problems."""
    if not isinstance(schema, dict):
        return []
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    want = schema.get("type")
    if want in kinds and not isinstance(value, kinds[want]):
        return ["%s: expected %s" % (where, want)]
    if want in ("number", "integer") and (isinstance(value, bool) or not isinstance(
            value, int if want == "integer" else (int, float))):
        return ["%s: expected %s" % (where, want)]
    if "enum" in schema and value not in schema["enum"]:
        return ["%s: not one of %s" % (where, schema["enum"])]
    errors = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                errors.append("%s: %s is required" % (where, name))
        for name, item in value.items():
            if name in props:
                errors += schema_errors(item, props[name], "%s.%s" % (where, name))
            elif schema.get("additionalProperties") is False:
                errors.append("%s: unexpected property %s" % (where, name))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], "%s[%d]" % (where, i))
    return errors
