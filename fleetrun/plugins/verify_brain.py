"""Built-in ``verify_brain`` plugin: ``brain = "question"`` verifiers.

Asks a model served over HTTP (Ollama by default, or any OpenAI-compatible server)
about a task's work. Configured by the ``[brain]`` table of ``config.toml`` or of a
tasks file (the tasks file's keys win)::

    [brain]
    url = "http://127.0.0.1:11434"   # default
    model = "qwen2.5-coder:14b"      # required; a verifier's model = overrides it
    api = "ollama"                   # or "openai"
    ollama_endpoint = "generate"     # or "chat" (api = "ollama" only)
    api_key_env = "OPENAI_API_KEY"   # api = "openai": the variable holding a bearer key
    timeout_s = 120                  # the verifier's own timeout_s wins if smaller
    max_diff_bytes = 60000           # the diff is cut to this, with a note

The model is shown the task prompt, the task's diff and the question, and told to
answer with a first line of exactly ``PASS`` or ``FAIL: reason``
(:func:`fleetrun.diffutil.parse_reply` is the strict rule). A brain that cannot judge
is an ERROR, never a PASS and never the agent's failure: a permanent one (no model, a
bad ``[brain]``, an unset key, an HTTP 4xx such as an unknown model, a redirect) sends
the task to a human at once; a transient one (a refused connection, an HTTP 5xx, 408 or
429, a timeout, a broken or malformed reply, an empty reply or one without a verdict)
is asked again after a backoff. A FAIL's reply is the verdict's output, so it reaches
the retry prompt.

The request runs in a daemon thread inside the handle, so the hook returns at once;
the thread touches no hook and no ledger, only git (to read the diff) and the socket.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ..exceptions import UsageError, UsageErrors
from ..hookimpl import hookimpl

# the diff (git), the verdict and threads are imported where a verifier runs: `status`
# loads this plugin for its fleetrun_configure and needs none of them
if TYPE_CHECKING:
    import urllib.error
    import urllib.request

    from ..config import Config
    from ..reports import Verdict

#: :data:`fleetrun.reports.PERMANENT`, without importing the reports where no verifier runs
PERMANENT = "permanent"
DEFAULT_URL = "http://127.0.0.1:11434"
DEFAULT_TIMEOUT_S = 120.0
KEEP_BYTES = 64 * 1024
MAX_REPLY_BYTES = 4 << 20  # a reply larger than this is not read (and not a verdict)
INTRO = (
    "You are reviewing the work a coding agent did on one task. You are shown the task, "
    "the changes the agent made, and a question about them."
)


def _str(v: Any) -> Optional[str]:
    return None if isinstance(v, str) and v.strip() else "must be a non-empty string"


def _positive(v: Any) -> Optional[str]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        return "must be a positive number"
    return None


def _positive_int(v: Any) -> Optional[str]:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        return "must be a positive whole number of bytes"
    return None


def _choice(*choices: str) -> Callable[[Any], Optional[str]]:
    def check(v: Any) -> Optional[str]:
        return None if v in choices else f"must be one of {', '.join(repr(c) for c in choices)}"

    return check


def _url(v: Any) -> Optional[str]:
    if not isinstance(v, str) or not v.startswith(("http://", "https://")):
        return "must be an http:// or https:// URL"
    return None


#: The keys of ``[brain]`` and their checks.
KEYS: dict[str, Callable[[Any], Optional[str]]] = {
    "url": _url,
    "model": _str,
    "api": _choice("ollama", "openai"),
    "ollama_endpoint": _choice("generate", "chat"),
    "api_key_env": _str,
    "timeout_s": _positive,
    "max_diff_bytes": _positive_int,
}


@hookimpl
def fleetrun_task_keys(config: Config) -> list[Any]:
    """The verifier kind "brain" this plugin runs: here, on the supervising machine
    (a peer's attempt's work is fetched back first). Without this plugin
    (``-p no:verify_brain``) a tasks file that uses it does not validate."""
    from ..taskkeys import kind_text_check
    from ..taskspec import KeyDecl

    return [
        KeyDecl(
            "brain", (str,), where="verify_kind", doc="question for the local model", check=kind_text_check, runs="here"
        )
    ]


@hookimpl(trylast=True)
def fleetrun_config_keys(config: Config) -> list[Any]:
    """``[brain]`` of config.toml, with the checks of a tasks file's ``[brain]``."""
    from ..config import ConfigKey

    return [ConfigKey("brain", key, check=check) for key, check in KEYS.items()]


def problems(table: Any) -> list[tuple[str, str]]:
    """(key, what is wrong) for every bad key of a ``[brain]`` table."""
    if not isinstance(table, dict):
        return [("brain", "must be a table")]
    import difflib

    out = []
    for key, value in table.items():
        check = KEYS.get(key)
        if check is None:
            close = difflib.get_close_matches(key, list(KEYS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(KEYS)})"
            out.append((key, f"unknown key{hint}"))
            continue
        msg = check(value)
        if msg:
            out.append((key, msg))
    return out


def _errors(table: Any, sources: list[Path], invocation_dir: Path) -> list[UsageError]:
    """UsageErrors for ``table``'s problems, located in the first of ``sources`` that
    sets the key (``[brain]`` of a tasks file or of config.toml)."""
    from ..collect import display_path
    from ..tomlfile import map_lines

    found: dict[str, tuple[str, int]] = {}
    for src in sources:
        try:
            text = src.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        lines = map_lines(text)
        for key in table if isinstance(table, dict) else {}:
            if ("table", "brain", key) in lines.lines and key not in found:
                found[key] = (display_path(src, invocation_dir), lines.lines[("table", "brain", key)])
    errs = []
    for key, msg in problems(table):
        where = found.get(key)
        errs.append(
            UsageError(
                msg,
                file=where[0] if where else None,
                line=where[1] if where else None,
                key=f"brain.{key}" if key != "brain" else "brain",
            )
        )
    return errs


def _raise(errs: list[UsageError]) -> None:
    if len(errs) == 1:
        raise errs[0]
    if errs:
        raise UsageErrors(errs)


@hookimpl(trylast=True)
def fleetrun_configure(config: Config) -> None:
    """A bad ``[brain]`` in config.toml stops ``run``, ``work``, ``queue`` and ``validate``
    before anything starts (other verbs, like ``status``, still work)."""
    if config.getoption("verb") not in ("run", "work", "queue", "validate"):
        return
    table = config.setting("brain", None, None)
    if table is None:
        return
    _raise(_errors(table, [config.home / "config.toml"], config.invocation_dir))


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    """The same check once the tasks files' own ``[brain]`` tables are merged in; and a
    warning when a ``brain`` verifier has no model anywhere."""
    from ..queueing import warn_tasks

    table = config.setting("brain", None, None)
    if table is not None:
        sources = [Path(f) for f in (config.getoption("files") or [])] + [config.home / "config.toml"]
        _raise(_errors(table, sources, config.invocation_dir))
    model = (table or {}).get("model") if isinstance(table, dict) else None
    # each once per cause and verifier number, at its first task, with how many more
    found: dict[tuple[int, bool], tuple[Any, Any, int]] = {}
    for t in items:
        for i, v in enumerate(t.verify):
            if v.kind != "brain":
                continue
            if not (v.model or model) or table is None:
                cause = (i, not (v.model or model))
                first, step, count = found.get(cause, (t, v, 0))
                found[cause] = (first, step, count + 1)
    for (i, no_model), (first, step, count) in found.items():
        # without a model it fails; with one, the default endpoint is right only with a local ollama
        what = (
            "a brain verifier needs a model: set [brain] model (config.toml or the tasks file) or model = on the "
            "verifier; without one it fails"
            if no_model
            else f"no [brain] is configured (config.toml, the project file or the tasks file): the verifier asks "
            f"{DEFAULT_URL}"
        )
        warn_tasks(config, first, count, f"verify #{i + 1}", what, line=step.line or first.line)


# ---------------------------------------------------------------------------------


def request_for(settings: dict[str, Any], model: str, prompt: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(url, JSON body, headers) of the request for the configured API."""
    base = str(settings.get("url") or DEFAULT_URL).rstrip("/")
    api = settings.get("api", "ollama")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    messages = [{"role": "user", "content": prompt}]
    if api == "openai":
        url = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
        env = settings.get("api_key_env")
        if env:
            key = os.environ.get(env)
            if not key:
                raise BrainError(f"api_key_env names {env}, which is not set", PERMANENT)
            headers["Authorization"] = f"Bearer {key}"
        return url, {"model": model, "messages": messages, "stream": False}, headers
    if settings.get("ollama_endpoint", "generate") == "chat":
        return base + "/api/chat", {"model": model, "messages": messages, "stream": False}, headers
    return base + "/api/generate", {"model": model, "prompt": prompt, "stream": False}, headers


def reply_text(api: str, endpoint: str, data: Any) -> str:
    """The model's answer in a decoded response body; BrainError if it has none.

    The body is untrusted: each step of the path to the answer must be an object (or
    the list ``choices``) and the answer a string (null is an empty answer).
    """
    from .. import untrusted  # here: the operator's verbs load this plugin, not a brain's reply

    try:
        if api == "openai":
            choices = untrusted.obj(data, "brain reply").get("choices")
            if not isinstance(choices, list) or not choices:
                raise untrusted.Malformed("brain reply: choices: expected a non-empty list")
            msg = untrusted.obj(
                untrusted.obj(choices[0], "brain reply: choices[0]").get("message"), "brain reply: choices[0].message"
            )
            key, where = "content", msg
        elif endpoint == "chat":
            where = untrusted.obj(untrusted.obj(data, "brain reply").get("message"), "brain reply: message")
            key = "content"
        else:
            where, key = untrusted.obj(data, "brain reply"), "response"
    except untrusted.Malformed:
        raise BrainError("brain reply has no answer in it: " + _snippet(data)) from None
    if key not in where:
        raise BrainError("brain reply has no answer in it: " + _snippet(data))
    text = where[key]
    if text is None:
        return ""
    try:
        return untrusted.clean_text(text, f"brain reply: {key}", MAX_REPLY_BYTES)
    except untrusted.Malformed as e:
        raise BrainError(f"brain reply has no text answer ({untrusted.reason_of(e)}): {_snippet(data)}") from None


def _snippet(data: Any) -> str:
    try:
        dumped = json.dumps(data)
    except (ValueError, RecursionError, TypeError):
        dumped = repr(type(data))
    return dumped[:200]


def parse_brain_reply(api: str, endpoint: str, raw: bytes) -> str:
    """A brain's HTTP 200 body -> the answer text. Pure; for each API's shape.

    :raises BrainError: the body is too large, not JSON, or has no text answer (the
        message is the FAIL reason).
    """
    if len(raw) > MAX_REPLY_BYTES:
        raise BrainError(f"brain reply is larger than {MAX_REPLY_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        snippet = raw[:200].decode("utf-8", "replace")
        raise BrainError(f"brain returned malformed JSON: {snippet!r}") from None
    return reply_text(api, endpoint, data)


class BrainError(Exception):
    """The brain could not be asked, or did not answer; the message is the ERROR's reason.

    :ivar error: :data:`~fleetrun.reports.TRANSIENT` (it may answer next time: the
        default) or :data:`~fleetrun.reports.PERMANENT` (not until someone fixes it).
    """

    def __init__(self, message: str, error: str = "transient") -> None:
        super().__init__(message)
        self.error = error


def _http_error_detail(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read(4096).decode("utf-8", "replace")
    except Exception:
        body = ""
    detail = body.strip()
    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            err = err.get("message")
        if isinstance(err, str) and err:
            detail = err
    except ValueError:
        pass
    detail = " ".join(detail.split())[:300]
    return detail or str(e.reason or "")


def _location(e: urllib.error.HTTPError) -> str:
    from .. import untrusted

    loc = e.headers.get("Location") if e.headers is not None else None
    return untrusted.reason_of(ValueError(loc), 200) if loc else "nowhere"


def _opener(url: str) -> urllib.request.OpenerDirector:
    """urllib's opener; a model on this machine is never reached through an HTTP proxy
    (``http_proxy`` set for the outside world would otherwise catch 127.0.0.1 too).

    It follows no redirect: urllib's would carry the ``Authorization`` header to
    wherever the brain points, and take that server's answer as the verdict. A 3xx
    reaches :func:`ask` as an HTTPError.
    """
    import urllib.parse
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
            return None

    host = urllib.parse.urlsplit(url).hostname or ""
    if host in ("localhost", "::1") or host.startswith("127."):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())
    return urllib.request.build_opener(NoRedirect())


def ask(settings: dict[str, Any], model: str, prompt: str, timeout: float, said_timeout: Optional[float] = None) -> str:
    """POST the prompt; return the model's reply text. Raises BrainError.

    :param timeout: seconds left for the request.
    :param said_timeout: the timeout to name in a timed-out message (the configured one).
    """
    # imported here: `fleetrun status` and friends never need them
    import http.client
    import socket
    import urllib.error
    import urllib.request

    said = f"brain timed out after {(said_timeout or timeout):g}s"
    url, body, headers = request_for(settings, model, prompt)
    base = str(settings.get("url") or DEFAULT_URL).rstrip("/")
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with _opener(url).open(req, timeout=timeout) as resp:
            raw = resp.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            raise BrainError(
                f"brain redirected to {_location(e)} (HTTP {e.code}); redirects are not followed", PERMANENT
            ) from None
        # a 4xx refuses the request as configured (an unknown model, a bad key): it
        # answers the same next time; a 5xx, 408 or 429 may not
        again = e.code >= 500 or e.code in (408, 429)
        raise BrainError(
            f"brain returned HTTP {e.code}: {_http_error_detail(e)}", "transient" if again else PERMANENT
        ) from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise BrainError(said) from None
        if isinstance(reason, ConnectionRefusedError):
            raise BrainError(f"brain unreachable at {base}: connection refused") from None
        text = getattr(reason, "strerror", None) or str(reason)
        raise BrainError(f"brain unreachable at {base}: {text}") from None
    except (socket.timeout, TimeoutError):
        raise BrainError(said) from None
    except ConnectionError as e:
        raise BrainError(f"brain unreachable at {base}: {e.strerror or e}") from None
    except OSError as e:
        raise BrainError(f"brain request failed: {e}") from None
    except http.client.HTTPException as e:
        raise BrainError(f"brain sent a broken HTTP reply: {type(e).__name__}: {e}") from None
    return parse_brain_reply(settings.get("api", "ollama"), settings.get("ollama_endpoint", "generate"), raw)


class BrainHandle:
    """A brain verifier in flight: the request runs in a daemon thread; ``poll()`` gives
    the Verdict once it is done (or the deadline passed). ``fileno()`` turns readable
    when the thread ends, so the loop wakes at once."""

    def __init__(
        self, verifier: Any, settings: dict[str, Any], task_prompt: str, workspace: Any, prompt_path: Optional[Path]
    ) -> None:
        self.verifier = verifier
        self.settings = settings
        self.task_prompt = task_prompt
        self.workspace = workspace
        self.prompt_path = prompt_path
        self.started = time.monotonic()
        self.timeout = min(float(settings.get("timeout_s", DEFAULT_TIMEOUT_S)), float(verifier.timeout_s))
        self.deadline = self.started + self.timeout
        import threading

        self.verdict: Optional[Verdict] = None
        self._result: Optional[Verdict] = None
        self._lock = threading.Lock()
        self._rfd, self._wfd = os.pipe()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"brain:{verifier.label}", daemon=True)
        self._thread.start()

    # the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            verdict = self._ask()
        except Exception as e:  # anything that stops a verdict is an ERROR, never a crash
            from ..verifying import (
                error_kind_of,  # the loop's stage: not for status and the other verbs
            )

            verdict = self._make(False, f"brain verifier error: {type(e).__name__}: {e}", error=error_kind_of(e))
        with self._lock:
            self._result = verdict
            if not self._closed:
                try:
                    os.write(self._wfd, b"x")
                except OSError:
                    pass

    def _ask(self) -> Verdict:
        model = self.verifier.model or self.settings.get("model")
        if not model:
            return self._make(
                False,
                "no model for the brain: set [brain] model in config.toml "
                "(or the tasks file), or model = on the verifier",
                error=PERMANENT,
            )
        bad = problems(self.settings)
        if bad:
            key, msg = bad[0]
            return self._make(False, f"[brain] {key}: {msg}", error=PERMANENT)
        from ..diffutil import (
            DEFAULT_MAX_DIFF_BYTES,
            NO_VERDICT,
            parse_reply,
            review_prompt,
            task_diff,
        )

        limit = int(self.settings.get("max_diff_bytes", DEFAULT_MAX_DIFF_BYTES))
        diff = task_diff(self.workspace, getattr(self.workspace, "base_ref", None), limit)
        prompt = review_prompt(self.task_prompt, diff, self.verifier.text, INTRO)
        if self.prompt_path is not None:
            try:
                fd = os.open(self.prompt_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(prompt)
            except OSError:
                pass
        left = max(0.05, self.deadline - time.monotonic())
        try:
            reply = ask(self.settings, model, prompt, left, said_timeout=self.timeout)
        except BrainError as e:
            return self._make(False, str(e), output=str(e), error=e.error)
        passed, reason = parse_reply(reply)
        if not passed and reason in ("empty reply", NO_VERDICT):
            # an empty reply, or one without PASS or FAIL first: nothing usable, ask again
            return self._make(False, reason, output=reply, error="transient")
        return self._make(passed, reason, output=reply)

    # the main thread ----------------------------------------------------------------

    def _make(self, passed: bool, reason: str, output: str = "", error: Optional[str] = None) -> Verdict:
        from ..reports import Verdict

        if len(output.encode("utf-8", "replace")) > KEEP_BYTES:
            output = output.encode("utf-8", "replace")[:KEEP_BYTES].decode("utf-8", "ignore")
        return Verdict(
            passed=passed,
            kind="brain",
            label=self.verifier.label,
            reason=reason,
            output=output,
            duration_s=time.monotonic() - self.started,
            error=error,
        )

    def fileno(self) -> int:
        return -1 if self._closed else self._rfd

    def next_deadline(self) -> float:
        return self.deadline

    def _close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._rfd)
                os.close(self._wfd)

    def poll(self) -> Optional[Verdict]:
        if self.verdict is not None:
            return self.verdict
        with self._lock:
            result = self._result
        if result is None:
            if time.monotonic() < self.deadline:
                return None
            # the thread's socket timeout is per read: a server that trickles outlasts it
            result = self._make(
                False,
                f"brain timed out after {self.timeout:g}s",
                output=f"brain timed out after {self.timeout:g}s",
                error="transient",
            )
        self.verdict = result
        self._close()
        return result

    def cancel(self) -> None:
        """Stop waiting; the daemon thread ends by its own timeout and is ignored."""
        self._close()


@hookimpl(trylast=True)
def fleetrun_verify(
    task: Any, verifier: Any, workspace: Any, attempt: Any, config: Config
) -> Optional[Union[BrainHandle, Verdict]]:
    if verifier.kind != "brain":
        return None
    from ..diffutil import local_workspace
    from ..reports import Verdict

    local = local_workspace(config, task, attempt, workspace, verifier)
    if isinstance(local, Verdict):
        return local
    workspace = local
    settings = config.setting("brain", None, None)
    if not isinstance(settings, dict):
        settings = {}
    idx = next((i for i, v in enumerate(task.spec.verify) if v is verifier), 0)
    adir = config.home / "attempts" / attempt.id
    try:
        adir.mkdir(parents=True, exist_ok=True, mode=0o700)
        prompt_path: Optional[Path] = adir / f"brain-{idx + 1}.prompt"
    except OSError:
        prompt_path = None
    return BrainHandle(verifier, dict(settings), task.spec.prompt, workspace, prompt_path)
