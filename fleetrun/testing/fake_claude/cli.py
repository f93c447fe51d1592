"""The fake's ``main``: the command line checked, settings and hooks loaded, the
session store consulted, then the scenario's steps acted out and the result printed.
"""

import json
import os
import sys
import time
import uuid

from .cliargs import (
    check_mcp_configs,
    check_values,
    help_text,
    json_schema,
    mcp_servers,
    parse_args,
    parse_rule,
    read_prompt,
    split_tool_list,
)
from .common import (
    DEFAULT_MODEL,
    DEFAULT_TOOLS,
    KNOWN_TOOLS,
    MODEL_ALIASES,
    OLD,
    ROOT_REFUSAL,
    VERSION,
    VERSIONS,
    UsageError,
    append_log,
    as_root,
    fail,
    init_tools,
    report_cost,
    scenario_fail,
)
from .hooks import MAX_STOP_CONTINUATIONS, Hooks, load_settings, parse_setting_sources
from .permissions import Permissions
from .scenario import Session, State, check_step, load_step, schema_errors
from .streamjson import Out, api_error, js_number, no_conversation, terminal_reset


def main(argv):
    started = time.time()
    cwd = os.getcwd()
    log = {"argv": argv, "prompt": None, "cwd": cwd,
           "env": {k: v for k, v in os.environ.items() if k.startswith("FLEETRUN_")},
           "session_id": None, "key": None, "n": None, "pid": os.getpid(), "error": None}

    def usage_fail(message):
        log["error"] = message
        append_log(log)
        fail(message)

    if VERSION not in VERSIONS:
        scenario_fail("FAKE_CLAUDE_VERSION=%s: the fake acts as %s" % (VERSION, " or ".join(VERSIONS)))
    try:
        values, operands, unknown = parse_args(argv)
    except UsageError as exc:
        usage_fail(str(exc))
    if values.get("help"):
        sys.stdout.write(help_text())
        return 0
    try:
        budget, max_turns = check_values(values, operands, unknown)
    except UsageError as exc:
        usage_fail(str(exc))
    fmt = values.get("output_format", "text")
    resume = values.get("resume")
    session_id = values.get("session_id")

    try:
        sources = parse_setting_sources(values.get("setting_sources"))
        loaded, settings_allow, settings_deny, settings_mode = load_settings(values, sources, cwd)
        check_mcp_configs(values)
        servers = mcp_servers(values, cwd, loaded)
        schema = json_schema(values)
    except UsageError as exc:
        usage_fail(str(exc))
    allow = split_tool_list(values.get("allowed_tools")) + settings_allow
    deny = split_tool_list(values.get("disallowed_tools")) + settings_deny
    log["setting_sources"] = sources
    # what a test asserts a session was given, beside its argv
    log.update(mcp_servers=servers, max_turns=max_turns, fallback_model=values.get("fallback_model"),
               append_system_prompt=values.get("append_system_prompt"),
               env_logged={name: os.environ.get(name) for name in
                           (os.environ.get("FAKE_CLAUDE_LOG_ENV") or "").split(",") if name})

    if "tools" in values:
        wanted = split_tool_list(values["tools"])
        # measured: the init event lists the chosen tools sorted, not as given
        tools = list(DEFAULT_TOOLS) if wanted == ["default"] else init_tools(t for t in wanted if t in KNOWN_TOOLS)
    else:
        tools = list(DEFAULT_TOOLS)
    tools = [t for t in tools if (t, None) not in [parse_rule(r) for r in deny]]
    if OLD:  # measured: 2.1.197 warns about a deny rule that names no tool it has (2.1.332 does not)
        for rule in deny:
            name, _ = parse_rule(rule)
            if name not in KNOWN_TOOLS and not name.startswith("mcp__"):
                sys.stderr.write("Permission deny rule \"%s\" matches no known tool \u2014 check for typos.\n"
                                 % rule)

    if values.get("dangerously_skip_permissions"):
        mode = "bypassPermissions"
    else:
        mode = values.get("permission_mode") or settings_mode or "default"
    if (mode == "bypassPermissions" or values.get("allow_dangerously_skip_permissions")) and as_root() \
            and os.environ.get("IS_SANDBOX") != "1":
        # measured (both versions): as root, outside a deliberate sandbox, the CLI refuses
        # at once: this line on stderr (no "error:" prefix), no event, exit 1
        usage_fail(ROOT_REFUSAL)
    if mode == "manual":  # measured (2.1.332): accepted, and the session reports "default"
        mode = "default"

    prompt = read_prompt(values, operands)
    log["prompt"] = prompt
    if not prompt.strip():
        usage_fail("Error: Input must be provided either through stdin or as a prompt argument "
                   "when using --print")

    scenario_path = os.environ.get("FAKE_CLAUDE_SCENARIO") or None
    state_dir = os.environ.get("FAKE_CLAUDE_STATE") or (
        os.path.dirname(os.path.abspath(scenario_path)) if scenario_path else None)
    task = os.environ.get("FLEETRUN_TASK_NAME")
    key = "default"
    if scenario_path:
        try:
            with open(scenario_path) as f:
                names = json.load(f)
            if task and os.environ.get("FLEETRUN_VERIFIER") and isinstance(names, dict) \
                    and task + ":review" in names:
                task = task + ":review"
            if task and isinstance(names, dict) and task in names:
                key = task
        except (OSError, ValueError) as exc:
            scenario_fail("cannot read %s: %s" % (scenario_path, exc))

    n = 1
    resumed = bool(resume or values.get("continue_"))
    if state_dir:
        with State(state_dir) as state:
            known = state.sessions()
            known_ids = {s["session_id"] for s in known}
            if resume and resume not in known_ids:
                return no_conversation(fmt, resume, started, log)
            if values.get("continue_"):
                mine = [s["session_id"] for s in known if s["cwd"] == cwd]
                if not mine:
                    usage_fail("No conversation found to continue")
                resume = mine[-1]
            if session_id is not None and session_id in known_ids and not (
                    values.get("fork_session") and (resume or values.get("continue_"))):
                usage_fail("Error: Session ID %s is already in use." % session_id)
            if session_id is None:
                session_id = resume if (resume and not values.get("fork_session")) else str(uuid.uuid4())
            if resume:
                log["conversation"] = state.prompts(resume)
            n = state.next_count(key)
            if load_step(scenario_path, task, n)[0].get("mode") == "die_at_start":
                # killed before its first request (an OOM kill, a reboot during start-up):
                # the real CLI writes a conversation only with its first message, so none
                # is kept and a --resume of this id is "No conversation found"
                log.update(session_id=session_id, key=key, n=n)
                append_log(log)
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
            if not values.get("no_session_persistence") and session_id not in known_ids:
                state.add_session(session_id, cwd)
            if not values.get("no_session_persistence"):
                state.add_prompt(session_id, prompt)
    elif session_id is None:
        session_id = resume if (resume and not values.get("fork_session")) else str(uuid.uuid4())

    # Measured with the real CLI: in plan mode a model alias ("haiku") is not honoured and
    # the requests go out as the default model; a full model id is used as given.
    # The init event names the resolved alias (measured offline, both versions, plan mode
    # too); the requests of plan mode with an alias go out as the default model (measured
    # before, with a model: not checkable offline).
    requested = values.get("model")
    shown = MODEL_ALIASES.get(requested, requested) if requested else DEFAULT_MODEL
    model = shown
    if mode == "plan" and requested and not requested.startswith("claude-"):
        model = DEFAULT_MODEL
    hooks = Hooks(loaded, cwd, session_id, mode)
    hooks.session_start("resume" if resumed else "startup")
    log.update(session_id=session_id, key=key, n=n, model=model, hooks=hooks.ran)
    append_log(log)

    step, _ = load_step(scenario_path, task, n)
    check_step(step)
    out = Out(fmt, session_id, model)
    partial = bool(values.get("include_partial_messages"))
    out.event({
        "type": "system", "subtype": "init", "cwd": cwd, "session_id": session_id,
        "tools": tools, "mcp_servers": [{"name": n, "status": "connected"} for n in servers], "model": shown, "permissionMode": mode,
        "slash_commands": [], "apiKeySource": "none", "claude_code_version": VERSION,
        "output_style": "default", "agents": [], "skills": [], "plugins": [],
        "uuid": str(uuid.uuid4()),
    })

    dirs = [os.path.join(cwd, d) for d in values.get("add_dir") or []]
    session = Session(out, Permissions(mode, allow, deny, tools, cwd, dirs), cwd, hooks)
    spent = 0.0  # what turns a Stop hook continued from cost
    turns_before = 0
    continuations = 0
    cut_at = None  # the cost when the budget ran out in the middle of a step
    while True:
        actions = list(step.get("actions", []))
        # measured in its code: --max-turns 0 is no cap at all (a cap is checked only when set)
        stopped_at_max_turns = bool(max_turns) and len(actions) + 1 > max_turns
        if stopped_at_max_turns:
            actions = actions[:max(max_turns, 0)]
        # the step's cost is spread over its turns; the CLI checks the budget after each
        per_turn = float(step.get("cost", 0.01)) / max(1, len(step.get("actions", [])) + 1)
        running = spent
        for i, action in enumerate(actions):
            running += per_turn
            if budget is not None and running > budget and step.get("mode", "ok") != "overspend":
                session.cut = True
                session.act(action)
                cut_at = (running, turns_before + i + 1)
                break
            session.act(action)
        step_mode = step.get("mode", "ok")
        text = str(step.get("result", "done" if scenario_path else "ok"))
        if cut_at is not None:
            break
        if step_mode == "die" and not stopped_at_max_turns:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if step_mode == "hang" and not stopped_at_max_turns:
            while True:
                time.sleep(3600)
        if step_mode == "no_result" and not stopped_at_max_turns:
            return int(step.get("exit", 0))
        if step.get("stall"):
            time.sleep(float(step["stall"]))
        text = str(step.get("result", "done" if scenario_path else "ok"))
        if step_mode not in ("ok", "exit_code") or stopped_at_max_turns \
                or continuations >= MAX_STOP_CONTINUATIONS:
            break
        reason = hooks.stop(continuations > 0, text)
        if reason is None:
            break
        # A Stop hook said "block": the session goes on with its reason as the next
        # instruction, acted out by the key's next step (logged as a continuation).
        out.text(text)
        spent += float(step.get("cost", 0.01))
        turns_before += int(step.get("turns", len(step.get("actions", [])) + 1))
        continuations += 1
        if state_dir:
            with State(state_dir) as state:
                n = state.next_count(key)
        else:
            n += 1
        append_log({"argv": argv, "prompt": reason, "cwd": cwd, "env": log["env"], "session_id": session_id,
                    "key": key, "n": n, "pid": os.getpid(), "error": None, "model": model,
                    "setting_sources": sources, "continuation": continuations, "hooks": []})
        step, _ = load_step(scenario_path, task, n)
        check_step(step)

    cost = spent + float(step.get("cost", 0.01))
    turns = turns_before + int(step.get("turns", len(step.get("actions", [])) + 1))
    if cut_at is not None:
        cost, turns = cut_at
    elapsed = int((time.time() - started) * 1000)
    result = {
        "type": "result", "subtype": "success", "is_error": False,
        "duration_ms": elapsed, "duration_api_ms": int(elapsed * 0.8),
        "num_turns": turns, "result": text, "stop_reason": "end_turn",
        "session_id": session_id, "total_cost_usd": cost,
        "usage": {"input_tokens": 12 * turns, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 8 * turns,
                  "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
                  "service_tier": "standard"},
        "modelUsage": {model: {"inputTokens": 12 * turns, "outputTokens": 8 * turns,
                               "cacheReadInputTokens": 0, "cacheCreationInputTokens": 0,
                               "webSearchRequests": 0, "costUSD": cost,
                               "contextWindow": 200000}},
        "permission_denials": session.denials,
        "uuid": str(uuid.uuid4()),
    }
    code = 0

    def error_result(subtype, errors):
        result.pop("result", None)
        result.update(subtype=subtype, is_error=True, errors=errors, stop_reason=None)

    def over_budget(stop_reason):
        error_result("error_max_budget_usd", ["Reached maximum budget ($%s)" % js_number(budget)])
        result["stop_reason"] = stop_reason
        if not OLD:
            result["terminal_reason"] = "budget_exhausted"

    if cut_at is not None:
        over_budget("tool_use")  # measured: it stops right after the model asked for a tool
        code = 1
    elif stopped_at_max_turns:
        error_result("error_max_turns", ["Reached maximum number of turns (%d)" % max_turns])
        result["num_turns"] = max_turns + 1
        code = 1
    elif step_mode == "is_error":
        error_result("error_during_execution", [text])
        code = 1
    elif step_mode in ("usage_limit", "rate_limit", "api_error"):
        text, status, error = api_error(step, out, session_id)
        result["total_cost_usd"] = spent + float(step.get("cost", 0))
        result["modelUsage"][model]["costUSD"] = result["total_cost_usd"]
        # measured: the error comes as a message of its own, not from the model
        out.assistant([{"type": "text", "text": text}], model="<synthetic>", error=error)
        result.update(subtype="success", is_error=True, result=text, api_error_status=status,
                      errors=None, stop_reason="stop_sequence")
        code = 1
    else:
        if step_mode == "overspend" and budget is not None:
            cost = budget + 0.5
            result["total_cost_usd"] = cost
            result["modelUsage"][model]["costUSD"] = cost
        if schema is not None and "structured" in step:
            # the real CLI gives the model a StructuredOutput tool and puts what it was
            # called with, once valid, in the result's structured_output
            out.assistant([{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24],
                            "name": "StructuredOutput", "input": step["structured"]}])
        out.text(text, partial=partial)
        if budget is not None and cost > budget:
            over_budget("end_turn")
            code = 1
        elif schema is not None and "structured" in step and schema_errors(step["structured"], schema):
            error_result("error_max_structured_output_retries",
                         ["Failed to provide valid structured output after 3 attempts"])
            code = 1
        elif step_mode == "exit_code":
            code = int(step.get("exit", 0))
        if schema is not None and "structured" in step and not result["is_error"]:
            result["structured_output"] = step["structured"]
    if "exit" in step:
        code = int(step["exit"])

    session_cost(result, state_dir, session_id, model,
                 resumed and not values.get("fork_session") and not values.get("no_session_persistence"))

    if step_mode == "raw":
        for raw_line in step.get("raw", []):
            out.line(str(raw_line))
    elif fmt == "stream-json":
        report_cost(result["total_cost_usd"])
        out.event(result)
    elif fmt == "json":
        report_cost(result["total_cost_usd"])
        out.line(json.dumps(result, separators=(",", ":"), ensure_ascii=False))
    elif "result" in result:
        out.line(result["result"])
    else:
        out.line("Error: " + "; ".join(result["errors"]))
    terminal_reset(fmt)
    return code


def session_cost(result, state_dir, session_id, model, resumed):
    """What the result says the session cost. Measured (the issue's figures): 2.1.197
    gives each invocation's cost in total_cost_usd; 2.1.332 gives the whole session's
    after --resume (what earlier invocations of it cost, plus this one) and this
    invocation's in model_usage_since_last_result (modelUsage's shape; on a fresh
    session the same as modelUsage)."""
    cost = float(result["total_cost_usd"])
    before = 0.0
    if state_dir:
        with State(state_dir) as state:
            before = state.add_cost(session_id, cost)
    if OLD:
        return
    this_run = {name: dict(usage) for name, usage in result["modelUsage"].items()}
    result["model_usage_since_last_result"] = this_run
    if resumed and before:
        result["total_cost_usd"] = before + cost
        result["modelUsage"] = {name: dict(usage, costUSD=before + cost) for name, usage in this_run.items()}
