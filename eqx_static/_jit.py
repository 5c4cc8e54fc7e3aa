"""`es.jit`: compile a method once per compile key, and say why it recompiled."""

import difflib
import functools
import inspect
import logging
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import (
    Any,
    Final,
    Generic,
    Literal,
    NamedTuple,
    overload,
    ParamSpec,
    TypeVar,
)

import jax
import jax.tree_util as jtu
from jax._src import traceback_util
from jax.core import Tracer

from ._fields import field_info, is_module
from ._key import (
    _ARR,
    _kinds,
    _memo,
    build_call,
    diff,
    find_unhashable,
    LEAF,
    leaf_origins,
    make_key,
    MODULE,
    x64,
)
from ._relevance import (
    leaves_callables,
    project,
    Reads,
    static_paths,
    UndeclaredStaticRead,
    watch,
)


traceback_util.register_exclusion(__file__)

logger: Final = logging.getLogger("eqx_static")

_P = ParamSpec("_P")
_R = TypeVar("_R")
Donate = Literal["none", "all", "all-except-first"]


class CacheInfo(NamedTuple):
    """Statistics of an [`eqx_static.jit`][] cache, as `functools.lru_cache` reports
    them. A miss is a trace and a compile; `currsize` counts compiled entries.

    !!! example

        ```python
        import jax.numpy as jnp
        import eqx_static as es

        @es.jit
        def double(x):
            return 2 * x

        double(jnp.ones(3))
        double(jnp.ones(3))
        assert double.cache_info() == es.CacheInfo(
            hits=1, misses=1, maxsize=None, currsize=1
        )
        ```
    """

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class TracedFieldError(jax.errors.ConcretizationTypeError):
    """A traced (dynamic) field was used where Python needs a concrete value.

    The message names the field and its class, and suggests declaring the field
    static if it selects program structure.

    !!! example

        ```python
        import jax.numpy as jnp
        import pytest
        import eqx_static as es

        class Model(es.Module):
            scale: float

            @es.jit
            def __call__(self, x):
                return x if self.scale > 0 else -x   # Python `if` on a traced value

        with pytest.raises(es.TracedFieldError, match="'scale'"):
            Model(scale=1.0)(jnp.ones(2))
        ```
    """

    def __init__(self, message: str):  # pyright: ignore[reportMissingSuperCall]
        TypeError.__init__(self, message)


class _Pending(threading.local):
    """Per thread: traces and compiles seen, read back by the call that caused them."""

    def __init__(self):
        self.events = 0  # traces of es.jit functions, and XLA compiles
        self.records: list[tuple[Any, ...]] = []
        self.current: Any = None  # the full key of the call being dispatched


_pending: Final = _Pending()


def _on_duration_event(event: str, duration_secs: float, **kwargs: str | int) -> None:
    # A change of layout (sharding) alone makes `jax.jit` compile again without
    # tracing again: count XLA compiles too, so that such a call is a miss.
    if event == _BACKEND_COMPILE_EVENT:
        _pending.events += 1


_BACKEND_COMPILE_EVENT: Final = "/jax/core/compile/backend_compile_duration"
jax.monitoring.register_event_duration_secs_listener(_on_duration_event)
_MSG_DECORATOR_ORDER: Final = """`@jaxtyped` must go below `@es.jit`, not above it.

Write
```
@es.jit
@jaxtyped(typechecker=beartype)
def f(self, x: Float[Array, "n"]) -> Float[Array, "n"]: ...
```
so that the annotations are checked once, while tracing, and a cache-hit call runs
no check at all. Above `@es.jit`, the check would run on every call.
"""
_MSG_LATE_READ: Final = (
    "The static field {path!r} of `self` was read after tracing had finished, by a "
    "callable the trace left behind (a `custom_vjp` backward rule or a host "
    "callback), and this compiled entry has served calls in which {path!r} may "
    'differ. `depends_on="auto"` cannot vouch for such reads: name the field in '
    "`depends_on=(...)`, or use the default `es.jit`."
)
_SINGLE: Final = "single"
_NO_HEAD: Final = object()
_AMBIGUOUS: Final = "ambiguous"


class _Entry:
    """One compile key without avals: a `jax.jit` whose own dispatch checks the
    avals, and, per aval signature seen, the static part of the output."""

    __slots__ = (
        "jitted",
        "key",
        "origin",
        "paths",
        "reused",
        "template",
        "templates",
        "variants",
    )

    def __init__(self, origin: tuple, key: Any, paths: tuple[str, ...]):
        self.jitted: Any = None
        self.origin = origin  # the full key of the call that created it
        self.key = key  # where it is in the cache
        self.paths = paths  # the static paths of `self` that `key` holds
        self.template: Any = None  # the output template, or _AMBIGUOUS
        self.templates: dict[tuple, Any] = {}  # per input avals, set while tracing
        self.variants: dict[tuple, None] = {}  # signatures booked as misses
        self.reused = False  # served a call whose unread static values differ


class _Jit(Generic[_P, _R]):
    """The wrapper returned by [`eqx_static.jit`][]."""

    def __init__(
        self,
        fn: Callable[_P, _R],
        donate: Donate,
        maxsize: int | None,
        depends_on: Any,
    ):
        self._is_static = isinstance(fn, staticmethod)
        if isinstance(fn, staticmethod):
            fn = fn.__func__
        if not callable(fn):
            raise TypeError(f"`es.jit` takes a function, got {type(fn).__name__}.")
        if maxsize is not None and (not isinstance(maxsize, int) or maxsize < 1):
            raise ValueError(
                f"`maxsize` must be None or a positive int, got {maxsize!r}."
            )
        if donate not in ("none", "all", "all-except-first"):
            raise ValueError(
                f"`donate` must be one of 'none', 'all', 'all-except-first'; "
                f"got {donate!r}."
            )
        _check_depends_on(depends_on)
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._qualname: str = getattr(fn, "__qualname__", repr(fn))
        self._donate = donate
        self._maxsize = maxsize
        self._depends_on = depends_on
        self._declared = (
            tuple(depends_on) if isinstance(depends_on, tuple | list) else None
        )
        self._learned: dict[type, list[tuple[str, ...]]] = {}  # growing sets
        self._checked: set[type] = set()  # classes whose `depends_on` paths exist
        self._late: list[tuple[_Entry, str]] = []  # reads after tracing, to learn
        self._declared_set = (
            frozenset(self._declared) if self._declared is not None else None
        )
        self._argnames = _argnames(fn)
        self._cache: dict[Any, _Entry] = OrderedDict() if maxsize else {}
        self._counts = [0]  # hits
        self._is_method = False  # set when assigned in a class body
        self._misses = 0
        self._lock = threading.RLock()
        self._method, self._call = self._make_call()

    # -- binding ---------------------------------------------------------------

    @property
    def __globals__(self) -> dict[str, Any]:
        # `@jaxtyped(...)` above `@es.jit` reads this first: fail there, and say why.
        if sys._getframe(1).f_globals.get("__name__", "").startswith("jaxtyping"):
            raise TypeError(_MSG_DECORATOR_ORDER)
        raise AttributeError("__globals__")

    def __set_name__(self, owner: type, name: str) -> None:
        # `m(x)` looks `__call__` up on the class and, for a plain function, calls it
        # without binding anything. Installing one for special methods saves the
        # descriptor call on every call. (Equinox leaves special methods unwrapped.)
        self._is_method = not self._is_static
        if name.startswith("__") and name.endswith("__") and not self._is_static:
            setattr(owner, name, self._special_method())

    def _special_method(self) -> Callable:
        method = self._method
        functools.update_wrapper(method, self.fn)
        method.cache_info = self.cache_info  # pyright: ignore[reportFunctionMemberAccess]
        method.cache_clear = self.cache_clear  # pyright: ignore[reportFunctionMemberAccess]
        method.lower = self.lower  # pyright: ignore[reportFunctionMemberAccess]
        method.es_jit = self  # pyright: ignore[reportFunctionMemberAccess]
        return method

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None or self._is_static:
            return self
        return _Bound(self._method, obj)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        __tracebackhide__ = True
        return self._call(args, kwargs)

    # -- the hot path ----------------------------------------------------------

    def _make_call(self) -> tuple[Callable, Callable]:
        """The call paths as closures: no attribute look-ups on a cache hit.

        `method(obj, *args)` is the path of `obj.f(*args)`; when `obj` is a module
        seen before and every other argument is an array, its key is assembled
        without walking anything."""
        cache, counts, slow, pending = (
            self._cache,
            self._counts,
            self._slow_call,
            _pending,
        )
        kinds, memo = _kinds, _memo
        # Relevance and LRU keys are projected or extended: the slow path does that.
        # A donating wrapper must not donate the memo's own device copies.
        always_slow = self._depends_on is not None or self._maxsize is not None
        on_device = self._donate == "none"

        def method(obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            e = memo.get(id(obj))  # `ready(obj)`, inlined
            if (
                e is None
                or e[3] is None
                or kwargs
                or not on_device
                or e[0]() is not obj
                or (e[4] is not None and e[4] is not x64())
            ):
                return call((obj, *args), kwargs)
            for a in args:
                if kinds.get(type(a)) is not _ARR:
                    return call((obj, *args), kwargs)
            leaves = [*e[3], *args]
            key = ((e[1], *((LEAF,) * len(args))), (), ())
            return dispatch(key, leaves, obj, args, kwargs)

        def call(args: tuple, kwargs: dict[str, Any]) -> Any:
            __tracebackhide__ = True
            leaves: list = []
            key = make_key(args, kwargs, leaves, on_device)
            return dispatch(key, leaves, _NO_HEAD, args, kwargs)

        def dispatch(
            key: tuple, leaves: list, head: Any, rest: tuple, kwargs: dict
        ) -> Any:
            __tracebackhide__ = True
            try:
                entry = cache.get(key)
            except TypeError:  # an unhashable static value: the slow path says which
                entry = None
            if entry is None or always_slow:
                args = rest if head is _NO_HEAD else (head, *rest)
                return slow(args, kwargs, key, leaves)
            events = pending.events
            try:
                out = entry.jitted(*leaves)
            finally:
                missed = pending.events != events  # it traced or compiled
                if missed:  # book it, even if the call then failed
                    args = rest if head is _NO_HEAD else (head, *rest)
                    self._after_miss(entry, key, leaves, args, key)
            if not missed:
                counts[0] += 1
            template = entry.template
            return out if template is _SINGLE else _unsplit(out, entry, leaves)

        method.es_jit = self  # pyright: ignore[reportFunctionMemberAccess]
        return method, call

    def _slow_call(self, args: tuple, kwargs: dict, key: Any, leaves: list) -> Any:
        __tracebackhide__ = True
        if self._depends_on is None:
            return self._call_entry(args, key, leaves)
        # Relevance keys change as traces teach which fields matter: one call at a
        # time per wrapper, so that no call looks up an entry another is re-keying.
        with self._lock:
            self._apply_late_reads()
            try:
                return self._call_entry(args, key, leaves)
            finally:
                self._apply_late_reads()

    def _call_entry(self, args: tuple, key: Any, leaves: list) -> Any:
        __tracebackhide__ = True
        entry, key, full = self._entry_for(key, leaves)
        relevance = self._depends_on is not None
        if relevance and full != entry.origin:
            entry.reused = True
        events = _pending.events
        previous, _pending.current = _pending.current, full
        try:
            out = entry.jitted(*leaves)
        finally:
            _pending.current = previous
            missed = _pending.events != events
            if missed:  # even if the call failed after tracing
                self._after_miss(entry, key, leaves, args, full)
        if not missed:
            self._counts[0] += 1
            if relevance and full != entry.origin:
                self._explain_hit(entry, full, args)
        if entry.template is _SINGLE:
            return out
        return _unsplit(out, entry, leaves)

    def _entry_for(self, key: tuple, leaves: list) -> tuple[_Entry, Any, tuple]:
        """The entry for a call's full key: projected onto the relevant static
        fields (`depends_on`; newest learned set first, then older ones, whose
        entries stay valid), extended by the avals (`maxsize`), or created."""
        full = key
        sig = _signature(leaves) if self._maxsize is not None else None
        generations = self._generations(full)
        newest = None
        for paths in reversed(generations):
            key = self._key_on(full, paths, sig)
            newest = newest or key
            try:
                entry = self._cache.get(key)
            except TypeError:
                raise TypeError(_unhashable_message(self._qualname, full)) from None
            if entry is not None:
                if self._maxsize is not None:
                    with self._lock:  # others iterate the cache under the lock
                        if key in self._cache:
                            self._cache.move_to_end(key)  # pyright: ignore[reportAttributeAccessIssue]
                return entry, key, full
        entry = self._new_entry(newest, leaves, full, generations[-1])
        return entry, newest, full

    def _key_on(self, full: tuple, paths: tuple[str, ...], sig: Any) -> Any:
        """The cache key of a call: projected on `paths`, with avals for `maxsize`."""
        key = full if self._depends_on is None else self._project(full, paths)
        return key if sig is None else (key, sig)

    # -- relevance (depends_on) --------------------------------------------------

    def _generations(self, full: tuple) -> list[tuple[str, ...]]:
        """The sets of static paths of `self` that keys have been projected on,
        oldest first: `depends_on` itself, or what traces taught, growing."""
        first = full[0][0] if full[0] else None
        if self._depends_on is None or not _is_module_node(first):
            return [()]
        cls = first[1]  # pyright: ignore[reportOptionalSubscript]
        if self._declared is None:
            return self._learned.setdefault(cls, [()])
        if cls not in self._checked:
            _check_declared(self._declared, cls, self._qualname)
            self._checked.add(cls)
        return [self._declared]

    def _project(self, key: tuple, paths: tuple[str, ...]) -> tuple:
        """The key with `self`'s static values restricted to `paths`."""
        args, names, kw = key
        if not args or not _is_module_node(args[0]):
            return key
        return (project(args[0], paths), *args[1:]), names, kw

    def _learn(self, entry: _Entry, reads: set[str], full: tuple) -> None:
        """A trace of the call `full` read `reads`: if that is more than the entry
        is keyed on, start a larger set of paths for `self`'s class and re-key the
        entry by that call's values. Its other traces read none of the new fields,
        so they hold for any value of them; entries keyed on older, smaller sets
        did not read them either, so they stay, reachable under their own keys."""
        if reads <= set(entry.paths):
            return
        generations = self._learned.setdefault(full[0][0][1], [()])
        paths = tuple(sorted(set(generations[-1]) | reads))
        if paths != generations[-1]:
            generations.append(paths)
        if self._cache.get(entry.key) is entry:
            del self._cache[entry.key]
        sig = next(iter(entry.variants)) if self._maxsize is not None else None
        key = self._key_on(full, paths, sig)  # one signature per entry with maxsize
        self._cache[key] = entry
        entry.key, entry.paths = key, paths

    def _all_if_late(
        self, entry: _Entry, reads: Reads, leaves: list, full: tuple
    ) -> set[str]:
        """What a trace read, or every static field of `self` when the program keeps
        Python callables that could read one after the trace (their reads would
        come too late to key this entry)."""
        try:
            late = leaves_callables(entry.jitted.trace(*leaves).jaxpr.jaxpr)
        except Exception:  # could not inspect the program: assume the worst
            late = True
        return set(static_paths(full[0][0])) if late else reads.paths

    def _late_read(self, entry: _Entry, path: str) -> None:
        """A static field read after tracing ended, by a callable the trace left
        behind (it may run on another thread, while a call holds the lock). If the
        entry only ever served the configuration it was traced for, the value read
        is right: queue the field to be learned, so that no later call reuses the
        entry for another value. Otherwise the value may be stale: refuse."""
        if path in entry.paths:
            return  # part of the key: never stale
        if entry.reused:
            raise UndeclaredStaticRead(_MSG_LATE_READ.format(path=path))
        self._late.append((entry, path))

    def _apply_late_reads(self) -> None:
        while self._late:
            entry, path = self._late.pop()
            self._learn(entry, {path}, entry.origin)

    def _explain_hit(self, entry: _Entry, full: tuple, args: tuple) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            phrases = diff(entry.origin, full, self._argnames)
            logger.debug(
                "%s: no compile: %s, which no trace of it read",
                self._name(args),
                "; ".join(phrases),
            )

    # -- misses ----------------------------------------------------------------

    def _new_entry(
        self, key: Any, leaves: list, full: tuple, paths: tuple[str, ...] = ()
    ) -> _Entry:
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            entry = _Entry(full, key, paths)
            entry.jitted = jax.jit(
                self._traced_fn(full, entry),
                donate_argnums=self._donate_argnums(full, leaves),
            )
            self._cache[key] = entry
            if self._maxsize is not None:
                while len(self._cache) > self._maxsize:  # one signature per entry
                    self._cache.popitem(last=False)  # pyright: ignore[reportCallIssue]
            return entry

    def _traced_fn(self, key: tuple, entry: _Entry) -> Callable:
        fn = self.fn

        relevance = self._depends_on is not None

        def traced(*_es_leaves):
            reads = None
            if relevance:  # rebuild from this call: its unread statics may differ
                args, kwargs = build_call(_pending.current, _es_leaves)
                if args and is_module(args[0]):
                    late = functools.partial(self._late_read, entry)
                    reads = Reads(self._declared_set, self._name(args), late)
                    watch(args[0], reads)
            else:
                args, kwargs = build_call(key, _es_leaves)
            try:
                out = fn(*args, **kwargs)
                dynamic, template = _split(out)  # reads the statics of returned modules
            except TracedFieldError:
                raise
            except Exception as e:
                if "_es_leaves[" not in str(e):
                    raise
                raise self._traced_field_error(e, key, args) from None
            finally:
                if reads is not None:
                    reads.sealed = True
            self._set_template(entry, _avals(_es_leaves), template)
            _pending.records.append((entry, reads))
            _pending.events += 1
            return dynamic

        traced.__name__ = getattr(fn, "__name__", "fn")
        traced.__qualname__ = getattr(fn, "__qualname__", traced.__name__)
        return traced

    def _after_miss(
        self, entry: _Entry, key: Any, leaves: list, args: tuple, full: tuple
    ) -> None:
        """Book a call that traced or compiled: one miss per trace, or one for a
        compile without a trace for a signature not seen before (a new layout of the
        same program). A compile for a signature already traced (say under `vmap`,
        then called directly) adds no entry, so it is no miss."""
        records = _pending.records
        mine = [reads for e, reads in records if e is entry]
        records[:] = [r for r in records if r[0] is not entry]
        sig = _signature(leaves)
        if not mine and entry.variants and sig not in entry.variants:
            mine = [None]
        with self._lock:
            for reads in mine:
                reason = self._reason(entry.origin, sig)
                self._misses += 1
                entry.variants[sig] = None
                if reason is not None:
                    logger.info("%s: compiling (%s", self._name(args), reason)
                if reads is not None and self._declared is None:
                    self._learn(
                        entry, self._all_if_late(entry, reads, leaves, full), full
                    )

    def _set_template(self, entry: _Entry, avals: tuple, template: Any) -> None:
        """Record the static part of the output of a trace. Set while tracing, so
        that a thread whose call JAX served from this trace finds it."""
        with self._lock:
            entry.templates[avals] = template
            if entry.template is None:
                entry.template = template
            elif entry.template is not _AMBIGUOUS and not _equal(
                entry.template, template
            ):
                entry.template = _AMBIGUOUS

    def _reason(self, key: tuple, sig: tuple) -> str | None:
        """`"<n> cached): <what differs from the closest entry>"`, or None."""
        known = [(e.origin, s) for e in self._cache.values() for s in e.variants]
        if not known or not logger.isEnabledFor(logging.INFO):
            return None
        try:
            candidates = [
                (self._diff(k, s, key, sig), k != key) for k, s in known[-64:]
            ]
        except Exception as e:  # an explanation must never break a call
            return f"{len(known)} cached): could not explain: {e!r}"
        best, _ = min(candidates, key=lambda c: (len(c[0]), c[1]))
        reason = "; ".join(best) if best else "same key; JAX dropped its own cache"
        return f"{len(known)} cached): {reason}"

    def _diff(
        self, key: tuple, sig: tuple, new_key: tuple, new_sig: tuple
    ) -> list[str]:
        phrases = diff(key, new_key, self._argnames)
        if phrases or sig == new_sig:
            return phrases
        origins = leaf_origins(new_key, self._argnames)
        return [
            _describe_leaf(o, a, b) for o, a, b in zip(origins, sig, new_sig) if a != b
        ]

    def _name(self, args: tuple) -> str:
        name = getattr(self.fn, "__name__", "fn")
        if self._is_method and args and is_module(args[0]):
            return f"{type(args[0]).__qualname__}.{name}"
        return self._qualname

    def _traced_field_error(self, e: Exception, key: tuple, args: tuple) -> Exception:
        indices = [int(i) for i in re.findall(r"_es_leaves\[(\d+)\]", str(e))]
        origins = leaf_origins(key, self._argnames)
        fields = [origins[i] for i in indices if i < len(origins)]
        fields = [o for o in fields if o.field is not None]
        if not fields:
            return e
        o = fields[0]
        cls = o.cls.__qualname__ if o.cls else "?"
        return TracedFieldError(
            f"{self._name(args)} used the traced field {o.field!r} of `{cls}` "
            f"(at {o.path}) where Python needs a concrete value (`if`, `bool()`, "
            "`int()`, a shape, ...). Dynamic fields are traced, so their values are "
            f"unknown while compiling. If {o.field!r} selects program structure, "
            f"declare it static: `{o.field}: ... = eqx.field(static=True)` (each "
            "new value then compiles once). Otherwise keep it dynamic and use "
            "`jnp.where` or `jax.lax.cond`.\n\nJAX said: " + str(e)
        )

    def _donate_argnums(self, key: tuple, leaves: list) -> tuple[int, ...]:
        if self._donate == "none":
            return ()
        skip = 0
        if self._donate == "all-except-first" and key[0]:
            skip = len(leaf_origins(((key[0][0],), (), ()), ()))
        return tuple(
            i for i, x in enumerate(leaves) if i >= skip and isinstance(x, jax.Array)
        )

    # -- introspection ---------------------------------------------------------

    def cache_info(self) -> CacheInfo:
        """Hits, misses (traces and compiles), `maxsize` and entries held."""
        with self._lock:
            currsize = sum(len(e.variants) for e in self._cache.values())
            return CacheInfo(
                self._counts[0],
                self._misses,
                self._maxsize,
                currsize,
            )

    def cache_clear(self) -> None:
        """Drop every compiled entry and reset the statistics."""
        with self._lock:
            self._cache.clear()
            self._counts[0] = 0
            self._misses = 0

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower the call for these arguments ahead of time; returns JAX's `Lowered`."""
        leaves: list = []
        entry, key, full = self._entry_for(make_key(args, kwargs, leaves), leaves)
        events = _pending.events
        previous, _pending.current = _pending.current, full
        try:
            lowered = entry.jitted.lower(*leaves)
        finally:
            _pending.current = previous
        if _pending.events != events:
            self._after_miss(entry, key, leaves, args, full)
        return lowered


class _Bound(functools.partial):
    """An [`eqx_static.jit`][] wrapper bound to a module instance.

    A `functools.partial`, not a `types.MethodType`: Equinox would wrap a method in a
    `BoundMethod`, whose construction walks every leaf of the module."""

    __slots__ = ()

    @property
    def __self__(self) -> Any:
        return self.args[0]

    @property
    def _jit(self) -> "_Jit":
        return self.func.es_jit  # pyright: ignore[reportFunctionMemberAccess]

    def cache_info(self) -> CacheInfo:
        """See [`eqx_static.jit`][]."""
        return self._jit.cache_info()

    def cache_clear(self) -> None:
        """See [`eqx_static.jit`][]."""
        self._jit.cache_clear()

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lower the call for these arguments; returns JAX's `Lowered`."""
        return self._jit.lower(self.__self__, *args, **kwargs)

    @property
    def __wrapped__(self) -> Callable:
        return self._jit.fn

    def __repr__(self) -> str:
        name = self._jit._qualname
        return f"<bound es.jit {name} of {type(self.__self__).__qualname__}>"


# ----------------------------------------------------------------------------------
# Outputs: arrays leave the compiled function; everything else is kept in a template.


def _split(out: Any) -> tuple[Any, Any]:
    if isinstance(out, jax.Array):
        return out, _SINGLE
    flat, treedef = jtu.tree_flatten(out)
    mask = tuple(isinstance(x, jax.Array) for x in flat)
    dynamic = [x for x, m in zip(flat, mask) if m]
    static = tuple(None if m else x for x, m in zip(flat, mask))
    return dynamic, (treedef, mask, static)


def _unsplit(out: Any, entry: _Entry, leaves: list) -> Any:
    template = entry.template
    if template is _AMBIGUOUS:  # the static output depends on the input avals
        template = entry.templates[_avals(leaves)]
    if template is _SINGLE:
        return out
    treedef, mask, static = template
    it = iter(out)
    return treedef.unflatten([next(it) if m else s for m, s in zip(mask, static)])


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # static outputs whose `==` is not a bool
        return False


def _aval(x: Any) -> tuple:
    """Shape, dtype and weak type: what tracing sees of a leaf."""
    a = jax.typeof(x)
    return (a.shape, a.dtype, getattr(a, "weak_type", False))


def _avals(leaves: Any) -> tuple:
    return tuple(map(_aval, leaves))


def _signature(leaves: list) -> tuple:
    return tuple(map(_aval_key, leaves))


def _aval_key(x: Any) -> tuple:
    """The aval and (for arrays placed explicitly) sharding: what compiling sees."""
    committed = not isinstance(x, Tracer) and getattr(x, "committed", False)
    return (*_aval(x), x.sharding if committed else None)


def _describe_leaf(o: Any, a: tuple, b: tuple) -> str:
    where = (
        f"field {o.path.split('.', 1)[1]!r}"
        if o.field and o.path.startswith("self.")
        else (f"field {o.path!r}" if o.field else f"argument {o.path}")
    )
    for name, i in (("shape", 0), ("dtype", 1), ("weak type", 2)):
        if a[i] != b[i]:
            return f"{where} {name} {a[i]} -> {b[i]}"
    if a[3] != b[3]:
        return f"{where} sharding {_show_sharding(a[3])} -> {_show_sharding(b[3])}"
    return f"{where} changed"


def _show_sharding(s: Any) -> str:
    if s is None:
        return "uncommitted"
    spec = getattr(s, "spec", None)
    return repr(spec) if spec is not None else type(s).__name__


def _argnames(fn: Callable) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(
        p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


def _is_module_node(n: Any) -> bool:
    return isinstance(n, tuple) and n[0] == MODULE


def _check_declared(paths: tuple[str, ...], cls: type, name: str) -> None:
    """Each path of `depends_on` must start at a field of `self`'s class: a static
    field, or a dynamic one that holds the module the rest of the path goes into.
    (What lies deeper depends on the instance, and is not checked.)"""
    info = field_info(cls)
    for path in paths:
        head, _, rest = path.partition(".")
        if (head in info.static and not rest) or (head in info.dynamic and rest):
            continue
        valid = [*info.static_names, *(f"{n}.<...>" for n in info.dynamic_names)]
        close = difflib.get_close_matches(head, info.names, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close and close[0] != head else ""
        raise ValueError(
            f"`{name}` has `depends_on` naming {path!r}, which is not a static field "
            f"of `{cls.__qualname__}` or a path into one of its modules.{hint} Its "
            f"static fields are: {', '.join(map(repr, valid)) or '(none)'}."
        )


def _check_depends_on(depends_on: Any) -> None:
    if depends_on is None or depends_on == "auto":
        return
    if isinstance(depends_on, tuple | list) and all(
        isinstance(p, str) for p in depends_on
    ):
        return
    raise ValueError(
        '`depends_on` must be None, "auto", or a tuple of static field names of '
        f"`self` (dotted paths into nested modules); got {depends_on!r}. For one "
        'field write `depends_on=("name",)`.'
    )


def _unhashable_message(name: str, key: tuple) -> str:
    culprit = find_unhashable(key) or "a static value"
    return (
        f"`{name}` got {culprit}, which is not hashable. Static field values and "
        "non-array arguments key the compilation cache, so they must be hashable: "
        "store a tuple instead of a list, or make an array a dynamic field."
    )


@overload
def jit(
    fn: Callable[_P, _R],
    /,
    *,
    donate: Donate = "none",
    depends_on: Any = None,
    maxsize: int | None = None,
) -> _Jit[_P, _R]: ...


@overload
def jit(
    fn: None = None,
    /,
    *,
    donate: Donate = "none",
    depends_on: Any = None,
    maxsize: int | None = None,
) -> Callable[[Callable[_P, _R]], _Jit[_P, _R]]: ...


def jit(
    fn: Any = None,
    /,
    *,
    donate: Donate = "none",
    depends_on: Any = None,
    maxsize: int | None = None,
) -> Any:
    """Compile a method (or function) once per compile key.

    The key holds the concrete classes of the modules in the arguments, their static
    field values compared by type *and* value (`1`, `True` and `1.0` are three
    entries), the tree structure, and each traced leaf's shape, dtype, weak type and
    sharding. In every module's non-static fields, arrays and Python
    `bool`/`int`/`float`/`complex` are traced, so changing them never recompiles;
    other leaves are static, as under `eqx.filter_jit`. Arguments that are not
    modules follow `eqx.filter_jit`'s rules.

    **Arguments:**

    - `fn`: the function or method to compile (also a `staticmethod`).
    - `donate`: `"none"`, `"all"` or `"all-except-first"`: which array arguments'
        buffers XLA may reuse for the outputs.
    - `depends_on`: which static fields of `self` enter the key. `None` (the
        default): all of them. A tuple of names or dotted paths (`("sp",
        "encoder.act")`): only those; reading any other static field of `self`
        while tracing raises [`eqx_static.UndeclaredStaticRead`][]. `"auto"`: the
        fields that the traces actually read, learned per class; changing a static
        field that no trace read costs no compile. Either way every result equals
        what the default returns: reads that cannot be observed one by one (a
        flatten, `vars(self)`, ...) count as reading every static field.
    - `maxsize`: at most this many compiled entries; the least recently used is
        evicted. `None` (the default) keeps them all.

    **Returns:**

    A wrapper, reachable from the class or from an instance, with `cache_info()`,
    `cache_clear()` and `lower(*args)`. Each miss after the first logs one line at
    INFO on the logger `"eqx_static"`, naming what changed.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

            @es.jit
            def __call__(self, x):
                return self.scale * (x**2 if self.square else x)

        m = Model(scale=2.0, square=False)
        m(jnp.array(3.0))                       # compiles
        m.with_dynamic(scale=5.0)(jnp.array(3.0))   # reuses: scale is traced
        m.with_static(square=True)(jnp.array(3.0))  # compiles: square is static
        assert Model.__call__.cache_info().misses == 2
        ```
    """
    if fn is None:
        return functools.partial(
            jit, donate=donate, depends_on=depends_on, maxsize=maxsize
        )
    return _Jit(fn, donate, maxsize, depends_on)
