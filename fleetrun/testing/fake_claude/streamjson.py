"""What the fake prints: the stream-json events, the API errors and usage-limit
messages as the measured versions word them, and the terminal reset at exit.
"""

import json
import os
import sys
import time
import uuid

from .common import OLD, TERMINAL_RESET, append_log, scenario_fail


API_MAX_RETRIES = 10


def js_number(x):
    """Render a float the way JavaScript's String(x) does for ordinary values."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


class Out:
    def __init__(self, fmt, session_id, model):
        self.fmt = fmt
        self.session_id = session_id
        self.model = model

    def event(self, obj):
        if self.fmt != "stream-json":
            return
        self.line(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))

    def line(self, text):
        try:
            sys.stdout.buffer.write((text + "\n").encode("utf-8"))
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            os._exit(1)

    def assistant(self, content, model=None, **extra):
        msg = {
            "id": "msg_" + uuid.uuid4().hex[:24],
            "type": "message",
            "role": "assistant",
            "model": model or self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 8,
                      "service_tier": "standard"},
        }
        ev = {"type": "assistant", "message": msg, "parent_tool_use_id": None,
              "session_id": self.session_id, "uuid": str(uuid.uuid4())}
        ev.update(extra)
        self.event(ev)

    def text(self, text, partial=False, **extra):
        if partial:
            self.event({"type": "stream_event", "session_id": self.session_id,
                        "parent_tool_use_id": None, "uuid": str(uuid.uuid4()),
                        "event": {"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "text_delta", "text": text}}})
        self.assistant([{"type": "text", "text": text}], **extra)

    def tool_result(self, tool_use_id, content, is_error):
        self.event({
            "type": "user",
            "message": {"role": "user", "content": [{
                "tool_use_id": tool_use_id, "type": "tool_result",
                "content": content, "is_error": is_error}]},
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": str(uuid.uuid4()),
        })


def limit_message(step, reset_at):
    style = step.get("limit_style", "session")
    if style == "legacy":
        return "Claude AI usage limit reached|%d" % reset_at
    lt = time.localtime(reset_at)
    hour = lt.tm_hour % 12 or 12
    clock = "%d%s" % (hour, "am" if lt.tm_hour < 12 else "pm")
    if lt.tm_min:
        clock = "%d:%02d%s" % (hour, lt.tm_min, clock[-2:])
    if reset_at - time.time() > 24 * 3600:
        clock = "%s %d, %s" % (time.strftime("%b", lt), lt.tm_mday, clock)
    tz = os.environ.get("TZ") or local_zone_name()
    kind = "weekly" if style == "weekly" else ("session" if OLD else "5-hour")
    return "You've hit your %s limit \u00b7 resets %s (%s)" % (kind, clock, tz)


def local_zone_name():
    try:
        target = os.readlink("/etc/localtime")
        if "zoneinfo/" in target:
            return target.split("zoneinfo/", 1)[1]
    except OSError:
        pass
    return "UTC"


def terminal_reset(fmt):
    """Measured: both versions reset the terminal when they exit, after the JSON lines."""
    if fmt == "stream-json":
        try:
            sys.stdout.buffer.write(TERMINAL_RESET.encode())
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            pass


def no_conversation(fmt, resume, started, log):
    """``--resume`` with an id the store does not have. Measured (2.1.197 and 2.1.332,
    offline): no init event; the message on stderr; with json or stream-json output also
    one result event of subtype error_during_execution whose session_id is the id asked
    for (2.1.332 adds "result_index": 0); no terminal reset; exit 1."""
    message = "No conversation found with session ID: %s" % resume
    log["error"] = message
    append_log(log)
    result = {"type": "result", "subtype": "error_during_execution", "duration_ms": 0,
              "duration_api_ms": 0, "is_error": True, "num_turns": 0, "stop_reason": None,
              "session_id": resume, "total_cost_usd": 0,
              "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                        "output_tokens": 0}, "modelUsage": {}, "permission_denials": [],
              "uuid": str(uuid.uuid4()), "errors": [message]}
    if not OLD:
        result["result_index"] = 0
    if fmt in ("stream-json", "json"):
        sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    return 1


def api_error(step, out, session_id):
    """(text, api_error_status, the assistant event's error) of an API error step; a
    usage limit also emits its rate_limit_event, as the real CLI does."""
    mode = step.get("mode")
    if mode == "usage_limit":  # a subscription (OAuth), the API's unified headers present
        reset_at = int(step.get("reset_at", time.time() + 3600))
        limit_type = "seven_day" if step.get("limit_style") == "weekly" else "five_hour"
        out.event({"type": "rate_limit_event", "session_id": session_id, "uuid": str(uuid.uuid4()),
                   "rate_limit_info": {"status": "rejected", "resetsAt": reset_at,
                                       "rateLimitType": limit_type}})
        return limit_message(step, reset_at), 429, "rate_limit"
    if mode == "rate_limit":  # a 429 that gives no reset time
        auth = step.get("auth", "api_key")
        if auth not in ("api_key", "oauth"):
            scenario_fail("auth must be api_key or oauth, not %r" % (auth,))
        if auth == "api_key":  # no rate_limit_event at all
            return ("API Error: Request rejected (429) \u00b7 This request would exceed the rate limit "
                    "for your organization of 50 requests per minute."), 429, "rate_limit"
        out.event({"type": "rate_limit_event", "session_id": session_id, "uuid": str(uuid.uuid4()),
                   "rate_limit_info": {"status": "rejected"}})
        return "API Error: Server is temporarily limiting requests (not your usage limit)", 429, "rate_limit"
    status = step.get("status", 529)
    if status not in (500, 529):
        scenario_fail("status must be 500 or 529, not %r" % (status,))
    # From the CLI's code (2.1.332; a real 5xx cannot be had offline): before it gives
    # up, the CLI retries a 5xx max_retries (10) times, each announced by a system event
    for attempt in range(1, API_MAX_RETRIES + 1):
        out.event({"type": "system", "subtype": "api_retry", "attempt": attempt, "max_retries": API_MAX_RETRIES,
                   "retry_delay_ms": min(500 * 2 ** (attempt - 1), 32000), "error_status": status,
                   "error": "overloaded" if status == 529 else "server_error",
                   "uuid": str(uuid.uuid4()), "session_id": session_id})
    message = "Overloaded" if status == 529 else "Internal server error"
    return ("API Error: %d %s. This is a server-side issue, usually temporary \u2014 try again in a "
            "moment. If it persists, check status.claude.com." % (status, message)), status, "server_error"
