"""Plugin state kept on the object it belongs to: one slot per type, on an agent or a host.

A plugin that needs per-session state (a todo list, a repeat counter, what a session has
read) asks the session for it instead of keeping a ``WeakKeyDictionary`` of its own::

    @dataclass
    class TodoState:
        items: list[tuple[str, str]] = field(default_factory=list)

    todo = agent.state(TodoState)          # created on first use (TodoState()), then the same object

The slot is created by ``factory`` (default: the type itself, called with no arguments),
lives exactly as long as its owner (dropped with the session or host, no registry to leak
from), and is visible to debug dumps through ``describe()``. A slot that holds a resource (a
process, a socket) gives itself an ``async aclose()``: the owner awaits it when it ends (a
session when it is disposed, a host when it closes, after its sessions), newest slot first,
shielded from cancellation; a failing ``aclose`` is reported on stderr and the rest still close.
A slot whose type sets ``CLOSES_FIRST = True`` holds work that runs inside the others (a
background job's processes live in a command server's sandbox) and closes before all of them,
whichever was made first: under bubblewrap, closing the server ends its pid namespace and, with
it, every process of a job still running there, before the job could end them itself. Per-host state works the same
way through ``host.state(T, factory)``. The type is the key, so a plugin's private class is a
private slot; two plugins never collide unless they share a class on purpose.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from .diag import warn

T = TypeVar("T")

DESCRIBE_MAX = 200  # characters of each slot's repr in a debug dump


def registered(listeners: list[Any], item: Any) -> Callable[[], None]:
    """Append ``item`` to ``listeners``; returns the function that takes it out again (once, and
    harmless after): the shape of every subscribe/watch/answerer registration."""
    listeners.append(item)

    def remove() -> None:
        if item in listeners:
            listeners.remove(item)

    return remove


def reads(*events: type) -> Callable[[T], T]:
    """Declare the event types an observer reads (``@reads(TurnEnd, InboxClaimed)`` on an
    ``agent.subscribe`` observer or a ``dsh_session_event`` implementation): it is then called
    only for events of those types (and their subclasses), the rest never reach it. An observer
    without the declaration sees every event."""

    def mark(observer: T) -> T:
        observer.events = events  # type: ignore[attr-defined]
        return observer

    return mark


V = TypeVar("V")


class ByType(dict[type, V]):
    """Values by an object's concrete type, for a dispatch by ``table[type(obj)]`` (a dict
    subscript, no call, where an ``isinstance`` chain made one call per type asked): a subclass of
    a key takes its nearest base's value, a type that no key is a base of takes ``default`` (each
    found once, then kept)."""

    def __init__(self, entries: dict[type, V], default: V) -> None:
        super().__init__(entries)
        self.default = default

    def __missing__(self, kind: type) -> V:
        found = next((self[base] for base in kind.__mro__[1:] if base in self), self.default)
        self[kind] = found
        return found


class ByEventType(dict[type, tuple[Callable[..., None], ...]]):
    """Event observers, looked up once per concrete event type: ``by_type[type(event)]`` is the
    tuple of those an event of that type reaches (every undeclared observer, and each declared one
    (``reads``) that reads the type or a base of it), in registration order, made on first use
    and kept until the observers change. (A bash turn's eight events met four observers each, and
    each observer asked ``isinstance`` up to six times before returning for the events it ignores:
    ~40 calls a tool turn, bench/profile_prompt.py --bash; the lookup is a dict subscript, no call.)
    The tuple is a snapshot: an observer that (un)subscribes while an event is handed out changes
    the next event's, not this one's."""

    def __init__(self, observers: tuple[Callable[..., None], ...] = ()) -> None:
        super().__init__()
        self.observers: list[Callable[..., None]] = list(observers)

    def add(self, observer: Callable[..., None]) -> Callable[[], None]:
        """Register ``observer``; returns the function that takes it out again (once, harmless after)."""
        self.observers.append(observer)
        self.clear()

        def remove() -> None:
            if observer in self.observers:
                self.observers.remove(observer)
                self.clear()

        return remove

    def __missing__(self, kind: type) -> tuple[Callable[..., None], ...]:
        found = self[kind] = tuple(
            o for o in self.observers if (wants := getattr(o, "events", None)) is None or issubclass(kind, wants))
        return found


class StateSlots:
    """The slots of one owner (an agent or a host)."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: dict[type, Any] = {}

    def get(self, cls: type[T], factory: Callable[[], T] | None = None) -> T:
        """The owner's ``cls`` slot, created by ``factory`` (default ``cls()``) on first use."""
        try:
            return self._slots[cls]  # type: ignore[no-any-return]  # (no typing.cast: a call per lookup, 16 a prompt)
        except KeyError:
            value = (factory or cls)()
            self._slots[cls] = value
            return value

    def describe(self) -> dict[str, str]:
        """``{module.Class: bounded repr}`` of every slot, for ``dsh doctor``/debug dumps."""
        out: dict[str, str] = {}
        for cls, value in self._slots.items():
            text = repr(value)
            out[f"{cls.__module__}.{cls.__qualname__}"] = text if len(text) <= DESCRIBE_MAX else text[:DESCRIBE_MAX] + "…"
        return out

    def __len__(self) -> int:
        return len(self._slots)

    async def aclose(self) -> None:
        """Close every slot that has an ``async aclose()``, newest first, those of a
        ``CLOSES_FIRST`` type before the rest; the slots are dropped."""
        slots, self._slots = list(self._slots.items()), {}
        slots.reverse()
        slots.sort(key=lambda slot: not getattr(slot[0], "CLOSES_FIRST", False))  # stable: newest first within each
        with anyio.CancelScope(shield=True):
            for cls, value in slots:
                close = getattr(value, "aclose", None)
                if close is None:
                    continue
                try:
                    await close()
                except Exception as exc:
                    warn(f"closing the state slot {cls.__module__}.{cls.__qualname__} failed: {exc!r}")


class StateOwner:
    """What an owner of state slots (an agent, a host) offers: ``state`` and ``describe_state``
    over its ``_state`` (a ``StateSlots`` it makes)."""

    __slots__ = ()
    _state: StateSlots

    def state(self, cls: type[T], factory: Callable[[], T] | None = None) -> T:
        """The owner's ``cls`` slot, created by ``factory`` (default ``cls()``) on first use."""
        try:
            return self._state._slots[cls]  # type: ignore[no-any-return]  # the hot path: one call, not two
        except KeyError:
            return self._state.get(cls, factory)

    def describe_state(self) -> dict[str, str]:
        """Every plugin state slot of the owner, bounded reprs (debug dumps)."""
        return self._state.describe()


class Flag:
    """An ``anyio.Event`` that costs a waiter only while someone waits on it unset.

    ``set``/``is_set``/``wait`` behave as the event's (``wait`` on a set flag is a checkpoint).
    Sessions hold a few of these each (idle, tool sources ready); most are set and never
    waited on, and an ``anyio.Event`` with its asyncio event and waiter deque is ~0.8 KiB. On
    asyncio a waiter awaits a future of its own, as an asyncio event's waiter does (a cancel
    scope cancels the waiting task at that await, as at any checkpoint; a cancelled waiter
    takes nothing from the others): no anyio event is made, set and waited through (~12 Python
    calls a prompt, bench/profile_prompt.py). On another backend it is an ``anyio.Event``."""

    __slots__ = ("_set", "_waiters")

    def __init__(self, is_set: bool = False) -> None:
        self._set = is_set
        self._waiters: list[asyncio.Future[None]] | anyio.Event | None = None

    def set(self) -> None:
        if not self._set:
            self._set = True
            waiters, self._waiters = self._waiters, None
            if waiters is None:
                return
            if type(waiters) is list:
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)
            else:
                waiters.set()  # type: ignore[union-attr]

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            await anyio.lowlevel.checkpoint()
            return
        loop = asyncio._get_running_loop()
        if loop is None:  # another anyio backend
            if self._waiters is None:
                self._waiters = anyio.Event()
            await self._waiters.wait()  # type: ignore[union-attr]
            return
        fut = loop.create_future()
        self._hold(fut)
        try:
            await fut
        except BaseException:  # cancelled: this waiter leaves, the others wait on
            self._release(fut)
            raise

    def _hold(self, fut: asyncio.Future[None]) -> None:
        """``fut`` is resolved when the flag is set (asyncio)."""
        waiters = self._waiters
        if waiters is None:
            self._waiters = [fut]
        else:
            waiters.append(fut)  # type: ignore[union-attr]

    def _release(self, fut: asyncio.Future[None]) -> None:
        """``fut`` waits no more (if the flag still holds it)."""
        waiters = self._waiters
        if type(waiters) is list and fut in waiters:
            waiters.remove(fut)
            if not waiters:
                self._waiters = None


async def checkpoint() -> None:
    """``anyio.lowlevel.checkpoint()``: on asyncio a bare yield to the loop, what its ``sleep(0)``
    does, without anyio's backend lookup (~4 calls each) nor sleep's own coroutine around the yield
    (the tool dispatch yields three times per call, bench/profile_prompt.py --bash)."""
    if asyncio._get_running_loop() is None:  # another anyio backend
        await anyio.lowlevel.checkpoint()
    else:
        await _yield()


@types.coroutine
def _yield() -> Generator[None, None, None]:
    """One turn of the asyncio loop: the task is stepped again with the next round of callbacks
    (asyncio.sleep(0)'s own ``__sleep0``; a cancel is delivered here, as at any checkpoint)."""
    yield


async def wait_either(first: Flag, second: Flag) -> None:
    """Return when ``first`` or ``second`` is set (a checkpoint when one already is). On asyncio
    one future waits on both flags, where a cancel scope that the other side cancels would cost
    a scope made, entered and left (~15 Python calls)."""
    if first._set or second._set:
        await anyio.lowlevel.checkpoint()
        return
    loop = asyncio._get_running_loop()
    if loop is None:  # another anyio backend: a task per flag, the first to finish ends both
        async with anyio.create_task_group() as tg:

            async def one(flag: Flag) -> None:
                await flag.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(one, first)
            tg.start_soon(one, second)
        return
    fut = loop.create_future()
    first._hold(fut)
    second._hold(fut)
    try:
        await fut
    finally:  # the flag that was set let go of its waiters; the other still holds this one
        first._release(fut)
        second._release(fut)
