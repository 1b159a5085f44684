"""A lock-order recorder for the concurrency tests: the real locks of real objects, wrapped.

    order = LockOrder()
    order.track(host, "_lock", "host")      # replaces host._lock by a recording wrapper
    ... run threads through the real code ...
    assert order.cycle() is None, order.explain()

Each time a thread takes a named lock while it holds others, the edge `held -> taken` is
recorded (with the stack that took it, the first time). A cycle in that graph is a possible
deadlock even when this run never hit it (two threads taking the same two locks in opposite
orders only deadlock when they interleave just so): the test fails on the order, not on luck.
A reentrant lock taken again by the thread that holds it adds no edge. Locks of the same name
(two movers) are one node: an order between instances of one role is not checked.
"""

from __future__ import annotations

import threading
import traceback


def guarded(fn, errors: list[BaseException], done: threading.Event | None = None):
    """`fn` as a thread's target: an exception it raises goes to `errors` (the test reports them); `done`, if
    given, is set when it ends either way (one thread failing, or the driver finishing, stops the others)."""
    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            if done is not None:
                done.set()
    return run


class LockOrder:
    def __init__(self) -> None:
        self._local = threading.local()
        self._guard = threading.Lock()  # a plain lock of the recorder's own, never tracked
        self.edges: dict[tuple[str, str], str] = {}  # (held, taken) -> where it was first taken
        self.names: set[str] = set()

    def track(self, obj: object, attr: str, name: str) -> None:
        """Replace `obj.<attr>` (a Lock, RLock or Condition) by a recording one. Call it before
        any thread uses the lock (a thread waiting on the old Condition is never woken)."""
        lock = getattr(obj, attr)
        if isinstance(lock, threading.Condition):
            inner = lock._lock  # type: ignore[attr-defined]
            setattr(obj, attr, threading.Condition(_Tracked(self, name, inner)))
        else:
            setattr(obj, attr, _Tracked(self, name, lock))
        self.names.add(name)

    # -- per-thread bookkeeping ----------------------------------------------------------------
    def _held(self) -> list[str]:
        held = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = []
        return held

    def _before(self, name: str) -> None:
        held = self._held()
        if name in held:  # reentrant: the order was recorded when it was first taken
            return
        new = [h for h in dict.fromkeys(held) if (h, name) not in self.edges]
        if new:
            where = "".join(traceback.format_stack(limit=14)[:-2])
            with self._guard:
                for h in new:
                    self.edges.setdefault((h, name), where)

    def _push(self, name: str) -> None:
        self._held().append(name)

    def _pop(self, name: str) -> None:
        held = self._held()
        for i in range(len(held) - 1, -1, -1):
            if held[i] == name:
                del held[i]
                return

    # -- the graph -----------------------------------------------------------------------------
    def cycle(self) -> list[str] | None:
        """A cycle of the lock-order graph (its locks, the first repeated last), else None."""
        graph: dict[str, list[str]] = {}
        for a, b in self.edges:
            graph.setdefault(a, []).append(b)
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        path: list[str] = []

        def visit(n: str) -> list[str] | None:
            state[n] = 1
            path.append(n)
            for m in graph.get(n, []):
                if state.get(m) == 1:
                    return path[path.index(m):] + [m]
                if m not in state and (found := visit(m)) is not None:
                    return found
            path.pop()
            state[n] = 2
            return None

        for n in sorted(graph):
            if n not in state and (found := visit(n)) is not None:
                return found
        return None

    def explain(self) -> str:
        """The cycle (if any) with where each of its edges was first taken."""
        c = self.cycle()
        if c is None:
            return "no cycle; edges: " + ", ".join(f"{a}->{b}" for a, b in sorted(self.edges))
        parts = [f"lock-order cycle: {' -> '.join(c)}"]
        for a, b in zip(c, c[1:]):
            parts.append(f"--- {a} held, {b} taken at:\n{self.edges[(a, b)]}")
        return "\n".join(parts)


class _Tracked:
    """A lock that tells its `LockOrder` before it is taken and after it is let go."""

    def __init__(self, order: LockOrder, name: str, lock) -> None:
        self._order = order
        self._name = name
        self._lock = lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._order._before(self._name)
        ok = self._lock.acquire(blocking, timeout)
        if ok:
            self._order._push(self._name)
        return ok

    def release(self) -> None:
        self._order._pop(self._name)
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    # what `threading.Condition.wait` uses on an RLock (a plain Lock has none: it falls back
    # to acquire / release above)
    def _is_owned(self) -> bool:
        if hasattr(self._lock, "_is_owned"):
            return self._lock._is_owned()
        if self._lock.acquire(False):
            self._lock.release()
            return False
        return True

    def _release_save(self):
        held = self._order._held()
        depth = held.count(self._name)
        for _ in range(depth):
            self._order._pop(self._name)
        if hasattr(self._lock, "_release_save"):
            return self._lock._release_save(), depth
        self._lock.release()
        return None, depth

    def _acquire_restore(self, saved) -> None:
        state, depth = saved
        self._order._before(self._name)
        if hasattr(self._lock, "_acquire_restore"):
            self._lock._acquire_restore(state)
        else:
            self._lock.acquire()
        for _ in range(depth):
            self._order._push(self._name)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
