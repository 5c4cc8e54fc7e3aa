"""`es.jit`: the wrapper, its options, the hit path, bound methods and AOT.

Every call runs a function made for the wrapped function's signature: it runs the
guard (`_guard.py`) of its first value's class, or, where the class has several, the
guards its static values look up, each of which checks the call against its key and
calls the key's own `jax.jit` dispatcher, whose C++ checks the avals. A call no guard
serves is keyed (`_key.py`) and looked up; a new key, or a miss at its dispatcher,
goes to the miss path (`_compile.py`)."""

import contextlib
import functools
import inspect
import logging
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any, Final, Generic, get_args, Literal, overload, ParamSpec, TypeVar

import equinox as eqx
import jax.tree_util as jtu

from . import _guard
from ._compile import (
    CacheInfo,
    Call,
    call_in_hand,
    combine,
    CompileInfo,
    Entry,
    Function,
    lower_call,
    NEED_CALL,
    new_entry,
    Rerun,
    rerun,
)
from ._fields import path_to, UnhashableError
from ._jax import api_boundary, GENERATED, hide_frames
from ._key import CyclicValue, GENERIC, Key, key_and_leaves, Layout, Own
from ._report import unhashable_message


hide_frames(__file__)

_P = ParamSpec("_P")
_R = TypeVar("_R")
Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]
_OPTIONS: Final = ("donate", "maxsize", "max_compiles", "warn_after")  # `es.jit`'s

_MSG_DECORATOR_ORDER: Final = """An `es.jit` wrapper has no `__globals__`: it is not a
plain function.
If this comes from `@jaxtyped(...)` above `@es.jit`:
`@jaxtyped` must go below `@es.jit`, not above it.

Write
```
@es.jit
@jaxtyped(typechecker=beartype)
def f(self, x: Float[Array, "n"]) -> Float[Array, "n"]: ...
```
so that the annotations are checked once, while tracing, and a cache-hit call runs
no check at all. Above `@es.jit`, the check would run on every call.
"""
_MSG_CLASSMETHOD: Final = """`@es.jit` cannot wrap a `classmethod`: put
`@classmethod` above it:
```
@classmethod
@es.jit
def f(cls, x): ...
```
"""


# ----------------------------------------------------------------------------------
# A call's values: the function's parameters in order (`_key.Layout`), bound by a
# generated function of the same signature, so that Python binds keywords in C and
# `f(x)`, `f(x, 2.0)`, `f(x, scale=2.0)` are one key. Its defaults are a marker: a
# parameter left out gets the function's default as it is at the call. Each one
# left out is checked, by identity (the same object is the same default; any other
# is read again), to be the object the binder was made with, where the function
# keeps it: its `__defaults__` tuple, an item of its `__kwdefaults__` (a dict that
# changes in place); a partial's `keywords` are compared whole at every call (a key
# added may be a default). When one is not, the binder is made again from the
# function's signature as it is then.

_LEFT_OUT: Final = Own("<the function's default, read at the call>")


def _layout(fn: Callable) -> tuple[Layout, list[inspect.Parameter] | None]:
    """The layout of `fn`'s calls, and its parameters; without a signature, what
    the caller passed, as it passed it."""
    try:  # the callable's own signature (a decorator's defaults are its own)
        params = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        return GENERIC, None
    kinds = [p.kind for p in params]
    only = kinds.count(inspect.Parameter.POSITIONAL_ONLY)
    positional = only + kinds.count(inspect.Parameter.POSITIONAL_OR_KEYWORD)
    at = {k: i for i, k in enumerate(kinds)}
    star = at.get(inspect.Parameter.VAR_POSITIONAL)
    star_star = at.get(inspect.Parameter.VAR_KEYWORD)
    names = tuple(p.name for p in params)
    return Layout(names, positional, star, star_star, only), params


def _keepers(fn: Callable) -> tuple[dict | None, Any]:
    """Where `fn`'s defaults are kept: a partial's keywords, and the function (of a
    method, of a callable's `__call__`, or the one an `es.jit` method wraps) whose
    `__defaults__` and `__kwdefaults__` hold the others."""
    keywords = fn.keywords if isinstance(fn, functools.partial) else None
    g = fn.func if isinstance(fn, functools.partial) else fn
    for _ in range(3):
        if type(g) is types.FunctionType:
            inner = getattr(g, "fn", None) if hasattr(g, "es_jit") else None
            return keywords, inner if type(inner) is types.FunctionType else g
        g = g.__func__ if isinstance(g, types.MethodType) else type(g).__call__
    return keywords, None


def _filled(name: str, d: Any, donating: bool, owns: dict[str, tuple]) -> Any:
    """What a default left out is bound as: itself, keyed, and its arrays traced;
    or, if it cannot be keyed or holds arrays where `donate` would give them away,
    an `Own` marker (one per default object: `owns`, by parameter), for the function
    to fill in, as under `eqx.filter_jit`: never donated."""
    with contextlib.suppress(UnhashableError, CyclicValue):
        if not (key_and_leaves((d,))[1] and donating):
            return d
    if owns.get(name, (None,))[0] is not d:
        owns[name] = (d, Own(f"<the function's own {name}>"))
    return owns[name][1]


def _binder(
    fn: Callable, params: list | None, now: list | None, donating: bool, owns: dict
) -> tuple[str, str, str, list[str], dict[str, Any]]:
    """The parameter lists of the generated functions, those of `params` (`fn`'s
    when wrapped), with the defaults of `now` (`fn`'s now): those that had a
    default when wrapped default to `_es_u`, and, for `_es_strict`, those that have
    one now; the condition on which a call left out a parameter that has no
    default now, or another than the one read here; the lines that fill them in;
    and the names those read."""
    if params is None:
        return "*args, **kwargs", "*args, **kwargs", "", [], {}
    keywords, g = _keepers(fn)
    ns: dict[str, Any] = {"_es_u": _LEFT_OUT}  # what is filled in; `kept`: checked
    kept: dict[str, Any] = {"_es_g": g, "_es_pk": keywords}
    # Where each default is kept, and what it is now: in the function's "pos" or
    # "kw" defaults, or in the partial's "keywords" (first).
    where_now: dict[str, tuple[str, Any]] = {}
    if g is not None:
        kept.update(_es_t=g.__defaults__, _es_kd=g.__kwdefaults__)
        code, pos = g.__code__, g.__defaults__ or ()
        names = code.co_varnames[code.co_argcount - len(pos) : code.co_argcount]
        where_now = {k: ("pos", d) for k, d in zip(names, pos)}
        where_now |= {k: ("kw", d) for k, d in (g.__kwdefaults__ or {}).items()}
    where_now |= {k: ("keywords", d) for k, d in (keywords or {}).items()}
    checks, fills, positional, optional = [], [], [], set()
    if keywords is not None:  # whole: a key added may be a parameter's default
        checks.append(f"len(_es_pk) != {len(keywords)}")
        for j, (k, v) in enumerate(keywords.items()):
            kept[f"_es_k{j}"] = v
            checks.append(f"_es_pk.get({k!r}, _es_u) is not _es_k{j}")
    current = {q.name: q.default for q in now or ()}
    for i, p in enumerate(params):
        d = current.get(p.name, _LEFT_OUT)  # not one now (a partial's keyword gone)
        where, now_d = where_now.get(p.name, (None, _LEFT_OUT))
        if d is _LEFT_OUT and p.name in current:  # an `es.jit` method's: its function's
            d = now_d if where else p.empty
        where = where if now_d is d else None  # a signature of its own: read once
        if d is not p.empty:
            optional.add(p.name)
        if p.default is p.empty:  # required when wrapped (or `*args`): Python binds it
            continue
        if d is p.empty:  # its default taken away: Python's own error
            checks.append(f"{p.name} is _es_u")
        elif d is not _LEFT_OUT:
            ns[f"_es_d{i}"] = _filled(p.name, d, donating, owns)
            fills.append(f"if {p.name} is _es_u: {p.name} = _es_d{i}")
            if where == "pos":
                positional.append(f"{p.name} is _es_u")
            elif where == "kw":
                kept[f"_es_c{i}"] = d
                checks.append(
                    f"{p.name} is _es_u and (_es_g.__kwdefaults__ is not _es_kd "
                    f"or _es_kd.get({p.name!r}, _es_u) is not _es_c{i})"
                )
    if positional:
        left_out = " or ".join(positional)
        checks.append(f"({left_out}) and _es_g.__defaults__ is not _es_t")
    star_star = [p.name for p in params if p.kind is p.VAR_KEYWORD]
    for j, k in enumerate(k for k in keywords or {} if k not in current):
        # A partial's keyword that `**kwargs` takes: in it, unless the caller passed it.
        ns[f"_es_e{j}"] = _filled(k, keywords[k], donating, owns)  # pyright: ignore
        fills += [f"{star_star[0]}.setdefault({k!r}, _es_e{j})"] * bool(star_star)
    # The parameters as written, with `/`, `*`, `*args` and `**kwargs`.
    bare = [p.replace(annotation=p.empty, default=p.empty) for p in params]
    names = str(inspect.Signature(bare))[1:-1].split(", ")
    named = {p.name for p in params if p.default is not p.empty}
    loose = ", ".join(n + "=_es_u" * (n in named) for n in names)
    strict = ", ".join(n + "=_es_u" * (n in optional) for n in names)
    stale = " or ".join(f"({c})" for c in checks)
    return loose, strict, stale, fills, ns | kept


# ----------------------------------------------------------------------------------
# The wrapper.

_MAX_GUARDS: Final = 8  # per lookup value: keys of one class it does not tell apart


class _Slots(dict):
    """A wrapper's guards, by the class of the first value of a call, in the order
    made; what a call of each class runs (`pick`): its one guard, or the function
    that looks its guards up by the call's static values (`_guard.chooser`); and,
    for each entry the general path serves, its calls there and how many make it a
    guard: 1 (its second call), then twice as many each time keys its lookup value
    does not tell apart pushed its guard out, so that more such keys in turn than
    one value holds guards do not write a guard at every call. A key that is not
    pushed out keeps its guard for as long as it is held. (A `dict` that can be
    weakly referred to: its function drops the guards of evicted keys.)"""

    __hash__ = object.__hash__  # pyright: ignore
    __eq__ = object.__eq__  # pyright: ignore[reportAssignmentType]  (by identity)

    def __init__(self) -> None:
        super().__init__()
        self.pick: dict[type | None, Callable] = {}
        self.choosers: dict[type | None, tuple[Callable, Callable, dict]] = {}
        self.held: dict[int, tuple[Any, Any, Callable]] = {}  # by `id(entry)`
        self.waits: dict[int, list[int]] = {}  # by `id(entry)`: [calls, needed]
        self.lock = threading.Lock()  # held for no user code but a static's hash

    def due(self, entry: Entry) -> bool:
        """Whether this call of `entry`, served by the general path, makes its guard."""
        if id(entry) in self.held:
            return False
        wait = self.waits.setdefault(id(entry), [0, 1])
        wait[0] += 1
        if wait[0] < wait[1]:
            return False
        wait[0], wait[1] = 0, 2 * wait[1]
        return True

    def add(self, guard: Callable, values: tuple, chooser: Callable) -> None:
        """Hold `guard`, made from `values`, for the calls of the class of their first
        (their chooser made by `chooser` if need be), under the lookup value of
        `values`; one thread at a time (a guard held twice, or a table lost, would
        never serve)."""
        entry = guard.es_entry  # pyright: ignore[reportFunctionMemberAccess]
        cls = type(values[0]) if values else None
        with self.lock:
            if id(entry) in self.held:
                return
            if cls not in self.choosers:
                self.choosers[cls] = chooser()
            at, choose, table = self.choosers[cls]
            value = at(*values)
            kept = (*table.get(value, ()), guard)
            for old in kept[:-_MAX_GUARDS]:  # pushed out: it waits longer (`due`)
                self._forget(old.es_entry)  # pyright: ignore
            table[value] = kept[-_MAX_GUARDS:]
            self.held[id(entry)] = (cls, value, guard)
            self.setdefault(cls, []).append(guard)
            self.pick[cls] = guard if len(self[cls]) == 1 else choose

    def drop(self, entry: Entry) -> None:
        """Forget an evicted entry, and its guard."""
        with self.lock:
            self.waits.pop(id(entry), None)
            self._forget(entry)

    def _forget(self, entry: Entry) -> None:
        if (held := self.held.pop(id(entry), None)) is None:
            return
        cls, value, guard = held
        table = self.choosers[cls][2]
        table[value] = tuple(g for g in table[value] if g is not guard)
        if not table[value]:
            del table[value]
        self[cls].remove(guard)
        if len(self[cls]) == 1:
            self.pick[cls] = self[cls][0]
        elif not self[cls]:
            del self.pick[cls]

    def clear(self) -> None:
        with self.lock:
            super().clear()
            for d in (self.pick, self.choosers, self.held, self.waits):
                d.clear()


class _Books(functools.partial):
    """What a wrapper and a method bound to an instance both offer: the function's
    books, and `lower`, with the instance (the partial's `args`) bound first."""

    __slots__ = ()

    @property
    def _jit(self) -> "_Jit":
        return self.func.es_jit  # pyright: ignore[reportFunctionMemberAccess]

    def lower(self, *args: Any, **kwargs: Any) -> "Lowered":
        """Lower the call for these arguments ahead of time: JAX's `as_text()` and
        `cost_analysis()`, and `compile()`, whose result takes the wrapper's
        arguments."""
        return Lowered(self._jit, self.args, args, kwargs)

    def cache_info(self) -> CacheInfo:
        """Hits, misses, `maxsize` and the compiled signatures held."""
        return self._jit.f.info()

    def compile_info(self) -> CompileInfo:
        """XLA compiles since the cache was cleared, the programs held now (keys
        whose programs are the same share one), and the seconds spent compiling."""
        return self._jit.f.compile_info()

    def cache_clear(self) -> None:
        """Drop every compiled entry and program, and reset the statistics."""
        self._jit.f.clear()


class _Jit(_Books, Generic[_P, _R]):
    """The wrapper returned by [`eqx_static.jit`][]. Calling it calls a function
    made for the wrapped function's signature (`functools.partial` calls it in C);
    defined in a class body, that function itself becomes the method, so that
    `m(x)` binds nothing."""

    fn: Callable[_P, _R]
    qualname: str
    f: Function
    hot: Callable
    _is_static: bool
    _options: tuple
    _fn_leaves: list
    _fn_check: Callable
    _slots: _Slots
    _params: list[inspect.Parameter] | None
    _owns: dict[str, tuple[Any, Own]]
    _owner: type | None = None
    _name: str | None = None

    def __new__(cls, fn: Any, options: tuple) -> "_Jit":
        """`options`: `es.jit`'s `donate`, `maxsize`, `max_compiles`, `warn_after`."""
        if isinstance(fn, classmethod):
            raise TypeError(_MSG_CLASSMETHOD)
        if is_static := isinstance(fn, staticmethod):
            fn = fn.__func__
        if not callable(fn):
            raise TypeError(
                f"`es.jit` takes a function or method, got {type(fn).__name__}."
            )
        _check_options(*options)
        layout, params = _layout(fn)
        owns: dict[str, tuple[Any, Own]] = {}
        f, fn_leaves = _function(fn, layout, options)
        binder = _binder(fn, params, params, f.donate != "none", owns)
        hot = _hot(f, binder, {"_es_runtime": eqx.EquinoxRuntimeError})
        self = super().__new__(cls, hot)
        functools.update_wrapper(self, fn)  # pyright: ignore[reportArgumentType]
        self.fn, self.qualname, self.hot = fn, f.qualname, hot  # pyright: ignore
        self._is_static, self._options = is_static, options
        self._params, self._owns = params, owns
        hot.__globals__.update(
            _es_general=self._general, _es_again=self._again, _es_fresh=self._fresh
        )
        self._target(f, fn_leaves)
        functools.update_wrapper(hot, fn)  # pyright: ignore[reportArgumentType]
        # What an `es.Module` makes of `module.f` (it reads `es_bind` of a method).
        vars(hot).update(es_jit=self, fn=fn, es_bind=functools.partial(BoundJit, hot))
        for attr in ("cache_info", "cache_clear", "compile_info", "lower"):
            setattr(hot, attr, getattr(self, attr))
        return self

    def _target(self, f: Function, fn_leaves: list) -> None:
        """Call `f`'s cache, with guards of its own, and `fn_leaves` as the leaves of
        the function (a new list: the guards of another key keep theirs)."""
        self.f, self._fn_leaves, self._slots = f, fn_leaves, _Slots()
        f.guard_sets.add(self._slots)
        self.hot.__globals__["_es_pick"] = self._slots.pick
        if f.fn_key is not None:
            self._fn_check = _guard.guard(f.fn_key, (self.fn,), ["fn"], "")

    def _fresh(self) -> None:
        """`es.jit(obj)` sees `obj` as it is at the call, as its eager call does: its
        arrays are read at every call, and where its key changed (a field set with
        `object.__setattr__`, a list in it changed) the call goes to that key's
        cache. (As a method's `self` is checked by its guard.)"""
        leaves = self._fn_check(self.fn)
        if leaves is _guard.MISS:
            self._target(*_function(self.fn, self.f.layout, self._options))
        else:
            self._fn_leaves[:] = leaves

    @property
    def __globals__(self) -> dict[str, Any]:
        # `@jaxtyped(...)` above `@es.jit` reads it first: name the order to use.
        raise AttributeError(_MSG_DECORATOR_ORDER)

    def __set_name__(self, owner: type, name: str) -> None:
        # In the class, the method is the function made for the signature: `m(x)`
        # then calls it with `m` as a plain function is called, binding nothing.
        self._owner, self._name = owner, name
        setattr(owner, name, staticmethod(self.hot) if self._is_static else self.hot)

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        # Only where the wrapper was set on a class after its body ran.
        if obj is None or self._is_static:
            return self
        return types.MethodType(self.hot, obj)

    def __reduce__(self) -> Any:
        # By reference, as functions pickle. A wrapper that cannot be found by name
        # (in `__main__` or a function body, copied by value by cloudpickle) is made
        # again from its function and options, and shares the cache here.
        owner, where = self._owner, getattr(self.fn, "__module__", None)
        if "<locals>" not in self.qualname and where != "__main__":
            return (getattr, (owner, self._name)) if owner else self.qualname
        return (_Jit, (self.fn, self._options))

    def __deepcopy__(self, memo: dict | None = None) -> "_Jit[_P, _R]":
        return self

    __copy__ = __deepcopy__

    def __repr__(self) -> str:
        return f"<es.jit {self.qualname}>"

    def _again(self, values: tuple, again: Callable) -> Any:
        """A call that left out a default other than the one the generated functions
        were made with: make them again (one thread at a time), from the function's
        signature as it is now, and call `again` (one of them) as the caller did;
        Python's own error if it left out one that has no default now."""
        with _binding:
            now, donating = _layout(self.fn)[1], self._options[0] != "none"
            binder = _binder(self.fn, self._params, now, donating, self._owns)
            made = _hot(self.f, binder, self.hot.__globals__)  # with a new `_es_bind`
            self.hot.__defaults__, self.hot.__code__ = made.__defaults__, made.__code__
            self.hot.__kwdefaults__ = made.__kwdefaults__
            self.hot.__globals__["_es_hot"] = self.hot
        self.f.layout.call(self.hot.__globals__["_es_strict"], values)
        return self.f.layout.call(again, values)

    # The general path, and the guards it leaves for the next calls.

    @api_boundary
    def _general(self, values: tuple) -> Any:
        """A call no guard served: build its key (a call refused here is neither a
        hit nor a miss), find or make its entry, and dispatch. The second call of a
        key makes its guard."""
        __tracebackhide__ = True
        f = self.f
        key, leaves = _key_and_leaves(f, values)
        entry = f.entries.get(key) or new_entry(f, key, leaves)
        if _guard.logger.isEnabledFor(logging.DEBUG):
            self._log_fall_through(values)
        if entry.runs and self._slots.due(entry):
            self._add_guard(entry, values)
        f.general += 1
        if f.maxsize is not None:
            entry.used = next(f.clock)
        leaves = [*self._fn_leaves, *leaves]
        try:  # the call in hand first: a new key enters the dispatcher once
            out = call_in_hand(Call(entry, self.fn, values, leaves))
        except Rerun as e:
            out = self._retry(entry, values, leaves, e)
        finally:
            next(f.calls)  # booked once done: as a hit, or a miss
        return combine(*out) if type(out) is tuple else out

    @api_boundary
    def _retry(self, entry: Entry, values: tuple, leaves: list, e: Any = None) -> Any:
        """A miss at the dispatcher: the same call again, with the call in hand; or
        the rerun JAX's check of invalid values asked for."""
        __tracebackhide__ = True
        call = Call(entry, self.fn, values, leaves)
        return call_in_hand(call) if e is None else rerun(self.f, call, e)

    def _add_guard(self, entry: Entry, values: tuple) -> None:
        params = [f"p_{n}" for n in self.f.argnames]  # called positionally
        again = ", ".join(params) + ("," if len(params) == 1 else "")

        def dispatch(leaves: list[str]) -> list[str]:
            called = ", ".join(["*FN", *leaves] if self._fn_leaves else leaves)
            return [
                *(["ENTRY.used = CLOCK()"] if self.f.maxsize is not None else []),
                "try:",
                f"    out = ENTRY.call({called})",
                f"    if out is NEED: out = RETRY(ENTRY, ({again}), [{called}])",
                f"except RERUN as e: out = RETRY(ENTRY, ({again}), [{called}], e)",
                "finally:",
                "    NEXT()",  # booked once done: as a hit, or a miss
                "return COMBINE(*out) if type(out) is tuple else out",
            ]

        f = self.f
        ns = {
            "NEXT": f.calls.__next__,
            "CLOCK": f.clock.__next__,
            "ENTRY": entry,
            "FN": self._fn_leaves,
            "RETRY": self._retry,
            "COMBINE": combine,
            "NEED": NEED_CALL,
            "RERUN": Rerun,
        }
        name = f.name(entry.key)
        made = _guard.guard(entry.key, values, params, name, dispatch, ns)
        made.es_entry = entry  # pyright: ignore[reportFunctionMemberAccess]
        chooser = functools.partial(_guard.chooser, entry.key, params, name)
        self._slots.add(made, values, chooser)

    def _log_fall_through(self, values: tuple) -> None:
        cls = type(values[0]) if values else None
        tried = self._slots.get(cls, [])
        if len(tried) > 1:  # those its chooser finds
            at, _, table = self._slots.choosers[cls]
            tried = table.get(at(*values), ())
        failed = "; ".join(m for g in tried if (m := _guard.first_failure(g, values)))
        why = f"; the guards of the class failed at {failed}" if failed else ""
        msg, info = "%s: the general path (%d of %d calls so far)%s", self.f.info()
        calls = info.hits + info.misses + 1
        _guard.logger.debug(msg, self.qualname, self.f.general + 1, calls, why)

    # What users read.

    def leaves_of(self, args: tuple, kwargs: dict[str, Any]) -> Call:
        """The call (key and traced leaves), as the general path makes it."""
        if self.f.fn_key is not None:  # the function as it is now, as a call sees it
            self._fresh()
        values = self.hot.__globals__["_es_bind"](*args, **kwargs)  # as a call does
        key, leaves = _key_and_leaves(self.f, values)
        return Call(Entry(key), self.fn, values, [*self._fn_leaves, *leaves])


_binding: Final = threading.RLock()  # one binder made again at a time


def _hot(f: Function, binder: tuple, ns: dict[str, Any]) -> Callable:
    """The function every call runs (the guards of the first value's class, else the
    general path), made in `ns` (where their own names start `_es_`) beside
    `_es_bind`, which binds a call's arguments to its values, and `_es_strict`
    (`_Jit._again`): all with the wrapped function's signature (`_binder`)."""
    params, strict, stale, fills, names = binder
    fresh = "    _es_fresh()\n" if f.fn_key is not None else ""  # `_Jit._fresh`
    args = f.argnames  # the wrapper's layout (`Function.layout`)
    values = ", ".join(args) + ("," if len(args) == 1 else "")
    first = f"_es_type({args[0]})" if args else "None"

    def bound(again: str) -> str:  # the defaults left out, filled in
        check = [f"if {stale}: return _es_again(({values}), {again})"] * bool(stale)
        return "".join(f"    {line}\n" for line in [*check, *fills])

    source = f"""
def _es_hot({params}):
{fresh}{bound("_es_hot")}    try:
        _es_guard = _es_pick.get({first})
        if _es_guard is not None:
            _es_out = _es_guard({values})
            if _es_out is not _es_miss:
                return _es_out
        return _es_general(({values}))
    except _es_runtime as _es_e:
        _es_e.__traceback__ = None  # as `eqx.filter_jit`: the user's frames only
        raise


def _es_bind({params}):
{bound("_es_bind")}    return ({values})


def _es_strict({strict}):
    pass
"""
    # The values filled in before those checked: a call that sees a new check made
    # here sees the new values too.
    ns.update(names, _es_miss=_guard.MISS, _es_type=type)
    exec(compile(source, f"{GENERATED}/{f.qualname}", "exec"), ns)
    # Named as `fn` in tracebacks and errors.
    for made in (ns["_es_hot"], ns["_es_bind"], ns["_es_strict"]):
        made.__code__ = made.__code__.replace(co_name=f.short)
        made.__qualname__ = f.qualname
    return ns["_es_hot"]


def _key_and_leaves(f: Function, values: tuple) -> tuple[Key, list]:
    try:
        return key_and_leaves(values)
    except UnhashableError as e:
        where = _where(f, path_to(values, e.value))
        raise TypeError(unhashable_message(f.qualname, where, e.value)) from None
    except CyclicValue as e:
        raise ValueError(
            f"`{f.qualname}` got an argument that contains itself: "
            f"{_where(f, e.path)} is the argument again. `es.jit` keys a call by the "
            "structure of its arguments, as `eqx.filter_jit` does, so that structure "
            "must be finite: break the cycle before the call."
        ) from None


def _where(f: Function, path: str | None) -> str:
    """A path `[i]...` (the i-th value of the call) as the user wrote it: `y['a']`,
    `self.layers[0]`, `kwargs['scale']`."""
    if path is None:
        return "an argument"
    head, _, rest = path[1:].partition("]")
    return f"{f.argnames[int(head)]}{rest}"


def _check_options(donate: Any, *counts: Any) -> None:
    if donate not in get_args(Donate):
        raise ValueError(
            "`es.jit(donate=...)` must be one of "
            f"{', '.join(map(repr, get_args(Donate)))}; got {donate!r}."
        )
    for name, v in zip(_OPTIONS[1:], counts):
        if v is not None and (type(v) is not int or v < 1):
            what = "compiled entries" if name == "maxsize" else "XLA compiles"
            raise ValueError(
                f"`{name}` must be None or a positive int, got {v!r}: "
                f"`es.jit({name}=...)` counts {what}."
            )


# The functions, as `eqx.filter_jit` keeps its caches: a plain function's for as
# long as the function lives (wrapping it again finds it), any other callable's (a
# module, `eqx.filter_grad(f)`) by its key, for the process.
_by_function: Final = weakref.WeakKeyDictionary[Callable, dict[tuple, Function]]()
_by_key: Final[dict[tuple, Function]] = {}
_functions_lock: Final = threading.Lock()


def _function(fn: Callable, layout: Layout, options: tuple) -> tuple[Function, list]:
    """The `Function` of `fn` with these options, shared; and `fn`'s own leaves."""
    fn_key, fn_leaves = None, []
    if type(fn) is not types.FunctionType:
        try:
            fn_key, fn_leaves = key_and_leaves((fn,))
        except (UnhashableError, CyclicValue):  # its own, unshared
            return Function(fn, None, 0, layout, options), []
    with _functions_lock:
        caches = _by_key if fn_key is not None else _by_function.setdefault(fn, {})
        identity = options if fn_key is None else (fn_key, options)
        f = caches.get(identity)
        if f is None:
            f = caches[identity] = Function(fn, fn_key, len(fn_leaves), layout, options)
    return f, fn_leaves


# ----------------------------------------------------------------------------------
# Methods.


class BoundJit(_Books):
    """An [`eqx_static.jit`][] method bound to an instance, as an attribute of an
    `es.Module` reads.

    A pytree, as Equinox's `BoundMethod` is: its leaves are the instance's, so it
    can be passed through `jax.jit` or `eqx.filter_grad`, or stored in a field. A
    `functools.partial` made in C, so that reading `module.f` walks nothing."""

    __slots__ = ()

    @property
    def __self__(self) -> Any:
        return self.args[0]

    __func__ = _Books._jit

    @property
    def __wrapped__(self) -> Any:
        return self.__func__.fn

    def __reduce__(self) -> Any:
        return (_rebind, (self.__func__, self.__self__))

    def __eq__(self, other: object) -> bool:
        if type(other) is not BoundJit:
            return False
        return other.func is self.func and other.__self__ is self.__self__

    def __hash__(self) -> int:
        return hash((id(self.func), id(self.__self__)))

    def __repr__(self) -> str:
        name = self.__func__.qualname
        return f"<bound es.jit {name} of {type(self.__self__).__qualname__}>"


def _rebind(wrapper: Any, obj: Any) -> BoundJit:
    """`m.f` again: `wrapper` is the wrapper, or the function made for it that a
    class holds (found by name when unpickled)."""
    return BoundJit(getattr(wrapper, "hot", wrapper), obj)


jtu.register_pytree_with_keys(
    BoundJit,
    lambda b: (((jtu.GetAttrKey("__self__"), b.args[0]),), b.func),
    lambda func, children: BoundJit(func, *children),
    lambda b: ((b.args[0],), b.func),
)


# ----------------------------------------------------------------------------------
# Ahead of time: `wrapper.lower(*args).compile()`, as `eqx.filter_jit` offers it,
# with a compiled callable that takes the arguments `lower` took. Lowering traces
# with a `jax.jit` of its own: it books no call, and an AOT compile is the caller's
# own, not one of the function's cached programs.


class Lowered:
    """A call lowered ahead of time by [`eqx_static.jit`][]'s `lower`: JAX's
    `as_text()`, `cost_analysis()` and `compile()`.

    !!! example

        ```python
        import jax.numpy as jnp
        import eqx_static as es

        @es.jit
        def f(x, y):
            return x * y

        compiled = f.lower(jnp.ones(3), jnp.ones(3)).compile()
        assert (compiled(jnp.ones(3), 2 * jnp.ones(3)) == 2).all()
        ```
    """

    def __init__(self, wrapper: _Jit, bound: tuple, args: tuple, kwargs: dict):
        # `bound` is `(m,)` for `m.f.lower(x)`: the compiled call takes `x`.
        call = wrapper.leaves_of((*bound, *args), kwargs)
        self.lowered = self._jax = lower_call(wrapper.f, call)
        self._wrapper, self._key, self._bound = wrapper, call.entry.key, bound

    def as_text(self, *args: Any, **kwargs: Any) -> str:
        """JAX's `as_text`."""
        return self._jax.as_text(*args, **kwargs)

    def cost_analysis(self) -> Any:
        """JAX's `cost_analysis`."""
        return self._jax.cost_analysis()

    def compile(self, compiler_options: dict[str, Any] | None = None) -> "Compiled":
        """Compile; the result is called with the same arguments as the wrapper."""
        compiled = self.lowered.compile(compiler_options=compiler_options)
        return Compiled(compiled, self._wrapper, self._key, self._bound)


class Compiled:
    """A call compiled ahead of time; call it with the wrapper's arguments.

    Arguments with other static values or tree structure than the lowered ones
    raise `TypeError`; avals are checked by JAX.

    !!! example

        ```python
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            scale: float

            @es.jit
            def __call__(self, x):
                return self.scale * x

        m = Model(scale=2.0)
        compiled = Model.__call__.lower(m, jnp.ones(2)).compile()
        assert (compiled(m.with_dynamic(scale=3.0), jnp.ones(2)) == 3.0).all()
        bound = m.__call__.lower(jnp.ones(2)).compile()  # `m` is bound
        assert (bound(jnp.ones(2)) == 2.0).all()
        ```
    """

    def __init__(self, compiled: Any, wrapper: _Jit, key: Key, bound: tuple):
        self.compiled = self._jax = compiled
        self._wrapper, self._key, self._bound = wrapper, key, bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._wrapper.leaves_of((*self._bound, *args), kwargs)
        if call.entry.key != self._key:
            raise TypeError(
                f"This compiled `{self._wrapper.qualname}` was lowered for other "
                "static values or tree structure than these arguments have. Lower "
                "it again for them, or call the `es.jit` wrapper, which compiles as "
                "needed."
            )
        out = self.compiled(*call.leaves)
        return combine(*out) if type(out) is tuple else out

    as_text, cost_analysis = Lowered.as_text, Lowered.cost_analysis


# ----------------------------------------------------------------------------------


@overload
def jit(
    fn: Callable[_P, _R],
    /,
    *,
    donate: Donate = "none",
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
) -> _Jit[_P, _R]: ...
@overload
def jit(
    fn: None = None,
    /,
    *,
    donate: Donate = "none",
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
) -> Callable[[Callable[_P, _R]], _Jit[_P, _R]]: ...
def jit(
    fn: Any = None,
    /,
    *,
    donate: Donate = "none",
    maxsize: int | None = None,
    max_compiles: int | None = None,
    warn_after: int | None = 8,
    **unknown: Any,
) -> Any:
    """Compile a function or method once per distinct program.

    `es.jit` traces what `eqx.filter_jit` traces (the leaves of the arguments, and of
    a pytree function, for which `eqx.is_array` holds; every other leaf is static),
    and returns what it returns. Its key compares static values by type *and* value
    (`1`, `True` and `1.0` are three keys), binds default arguments first, and is
    shared by the wrappers of one function. A new key is traced, and compiled only if
    the function has not compiled the same program (module, constants, shardings,
    donation and host callbacks) already: changing a static field the program does
    not read costs one trace and no compile.

    **Arguments:**

    - `fn`: the function or method to compile (also a `staticmethod`).
    - `donate`: as in `eqx.filter_jit` (`"none"`, `"all"`, `"all-except-first"`,
        `"warn"`, `"warn-except-first"`): which arrays' buffers XLA may reuse for the
        outputs (`"all"` includes those of `self`).
    - `maxsize`: at most this many compiled signatures, the least recently used
        evicted first; `None` keeps them all.
    - `max_compiles`: raise [`eqx_static.RecompileError`][] rather than make more XLA
        compiles than this (a test-suite guard that says why).
    - `warn_after`: once this many XLA compiles have been made and the same field or
        argument changed at each of the last `warn_after - 1`, log one WARNING on
        `"eqx_static"` saying so (`None`: off).

    **Returns:**

    A wrapper, on the class or an instance, with `cache_info()` (hits and misses),
    `compile_info()` (XLA compiles), `cache_clear()` and `lower(*args)`. Each miss
    after the first logs one INFO line on `"eqx_static"`: what changed, and whether
    it compiled.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)
            name: str = eqx.field(static=True)

            @es.jit
            def __call__(self, x):
                return self.scale * (x**2 if self.square else x)

        m = Model(scale=2.0, square=False, name="a")
        m(jnp.array(3.0))                           # traces and compiles
        m.with_dynamic(scale=5.0)(jnp.array(3.0))   # a hit: scale is an array
        m.with_static(square=True)(jnp.array(3.0))  # traces and compiles
        m.with_static(name="b")(jnp.array(3.0))     # traces: the same program
        assert Model.__call__.cache_info().misses == 3
        assert Model.__call__.compile_info().compiles == 2
        ```
    """
    if unknown:
        raise TypeError(
            f"`es.jit` got unexpected keyword arguments "
            f"{', '.join(map(repr, sorted(unknown)))}; it takes `donate`, `maxsize`, "
            "`max_compiles` and `warn_after`."
        )
    options = (donate, maxsize, max_compiles, warn_after)
    if fn is None:
        return functools.partial(jit, **dict(zip(_OPTIONS, options)))
    return _Jit(fn, options)
