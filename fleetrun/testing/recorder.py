"""What ``fleeter`` needs around an in-process run: a hook recorder and snapshots of
``sys.modules`` and ``sys.path``, after pytest's ``pytester`` (``HookRecorder``,
``SysModulesSnapshot``, ``SysPathsSnapshot``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import pluggy

from ..hookimpl import hookimpl

if TYPE_CHECKING:
    from ..config import Config


class RecordedCall:
    """One hook call: the hook's keyword arguments as attributes (``call.task``,
    ``call.to_state``...), its name as ``_name``, as in pytester's ``RecordedHookCall``."""

    _name: str

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.__dict__.update(kwargs)
        self._name = name

    def __repr__(self) -> str:
        d = {k: v for k, v in self.__dict__.items() if k != "_name"}
        return f"<RecordedCall {self._name!r}(**{d!r})>"


class HookRecorder:
    """Records every hook call of one plugin manager, from :meth:`attach` until
    :meth:`finish_recording`, through pluggy's ``add_hookcall_monitoring``."""

    def __init__(self) -> None:
        self.calls: list[RecordedCall] = []
        self._pluginmanager: Optional[pluggy.PluginManager] = None
        self._undo: Optional[Callable[[], None]] = None

    def attach(self, pluginmanager: pluggy.PluginManager) -> None:
        """Start recording the calls of ``pluginmanager``'s hooks.

        :param pluginmanager: the run's manager (``config.pluginmanager``).
        """

        def before(hook_name: str, hook_impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
            self.calls.append(RecordedCall(hook_name, dict(kwargs)))

        def after(
            outcome: pluggy.Result[Any],
            hook_name: str,
            hook_impls: Sequence[pluggy.HookImpl],
            kwargs: Mapping[str, Any],
        ) -> None:
            pass

        self._pluginmanager = pluginmanager
        self._undo = pluginmanager.add_hookcall_monitoring(before, after)

    def finish_recording(self) -> None:
        """Stop recording (the calls so far stay)."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def _names(self, names: Union[str, Iterable[str]]) -> list[str]:
        out = names.replace(",", " ").split() if isinstance(names, str) else list(names)
        pm = self._pluginmanager
        if pm is not None:
            # a misspelt name would give an empty list, and a test that passes for nothing
            unknown = [n for n in out if getattr(getattr(pm.hook, n, None), "spec", None) is None]
            if unknown:
                raise ValueError(f"no such hook: {', '.join(unknown)}")
        return out

    def getcalls(self, names: Union[str, Iterable[str]]) -> list[RecordedCall]:
        """The calls of the hooks named, in the order they were made.

        :param names: hook names, comma- or space-separated (``"fleetrun_transition,
            fleetrun_verify"``) or a list.
        :raises ValueError: a name that is no hook of the run.
        """
        wanted = set(self._names(names))
        return [c for c in self.calls if c._name in wanted]

    def getcall(self, name: str) -> RecordedCall:
        """The one call of hook ``name``.

        :raises AssertionError: it was called no times or more than once.
        """
        calls = self.getcalls(name)
        assert len(calls) == 1, f"{name} was called {len(calls)} times, not once: {calls}"
        return calls[0]

    def listnames(self) -> list[str]:
        """The names of the hooks called, in order (one entry per call)."""
        return [c._name for c in self.calls]


class RecorderPlugin:
    """Passed to :func:`fleetrun.main` as a plugin: attaches ``recorder`` to the run's
    manager when the run is configured (the first moment a plugin sees the manager
    that ``main`` builds), so nothing in fleetrun knows about recording."""

    def __init__(self, recorder: HookRecorder) -> None:
        self.recorder = recorder

    @hookimpl(tryfirst=True)
    def fleetrun_configure(self, config: Config) -> None:
        self.recorder.attach(config.pluginmanager)


class SysModulesSnapshot:
    """``sys.modules`` now; :meth:`restore` forgets modules imported since, except
    those ``preserve(name, module)`` keeps, and puts back any that were replaced."""

    def __init__(self, preserve: Optional[Callable[[str, Any], bool]] = None) -> None:
        self._preserve = preserve
        self._saved = dict(sys.modules)

    def restore(self) -> None:
        # key by key rather than clear() and update(): sys.modules is never empty,
        # even for a thread a run left behind
        for name, mod in list(sys.modules.items()):
            if name in self._saved:
                continue
            if self._preserve is not None and self._preserve(name, mod):
                continue
            del sys.modules[name]
        for name, mod in self._saved.items():
            if sys.modules.get(name) is not mod:
                sys.modules[name] = mod


class SysPathsSnapshot:
    """``sys.path`` and ``sys.meta_path`` now; :meth:`restore` puts them back in place
    (the same list objects: others may hold them)."""

    def __init__(self) -> None:
        self.path = list(sys.path)
        self.meta_path = list(sys.meta_path)

    def restore(self) -> None:
        sys.path[:] = self.path
        sys.meta_path[:] = self.meta_path
