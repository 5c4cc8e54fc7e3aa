"""Relevance-aware keys: observe which static fields of `self` a trace reads.

While `es.jit(depends_on=...)` traces, `self` and the modules nested in it are
rebuilt with a watched instance dictionary, and their classes carry a data
descriptor per static field. Attribute reads (`self.sp`, `getattr`, properties)
go through the descriptor; every other route to a field (`self.__dict__`, `vars`,
a flatten by JAX or Equinox, copying) goes through the watched dictionary, whose
bulk accessors count as reading every static field. A read is therefore either
observed precisely or over-approximated; it is never missed.
"""

import difflib
import functools
import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any, Final

import equinox as eqx
import jax.tree_util as jtu

from ._cache import Entry
from ._explain import diff
from ._fields import field_info, is_module
from ._key import children_of, LEAF, LEAVES, MODULE, plan, SEQ, TREE


logger: Final = logging.getLogger("eqx_static")


_NO_DEFAULT: Final = object()
_DICT: Final = eqx.Module.__dict__["__dict__"]  # get and set, bypassing Equinox
# Equinox's metaclass call walks the leaves of a new module's arguments to warn about
# transformed functions; `self.method` builds a `BoundMethod(method, self)` that way.
_META_CALL: Final = getattr(type(eqx.Module).__call__, "__code__", None)
_TREE_LEAVES: Final = getattr(jtu.tree_leaves, "__code__", None)


class UndeclaredStaticRead(Exception):  # noqa: N818  (the name is the contract)
    """A method compiled with `es.jit(depends_on=(...))` read a static field of `self`
    that `depends_on` does not name.

    !!! example

        ```python
        import equinox as eqx
        import jax.numpy as jnp
        import pytest
        import eqx_static as es

        class M(es.Module):
            a: bool = eqx.field(static=True)
            b: bool = eqx.field(static=True)

            @es.jit(depends_on=("a",))
            def f(self, x):
                return x + 1 if self.b else x

        with pytest.raises(es.UndeclaredStaticRead, match="'b'"):
            M(a=True, b=False).f(jnp.array(1.0))
        ```
    """


class Reads:
    """The static fields read during one trace, as dotted paths from `self`.

    Once the trace is over the collector is sealed: a read after that comes from a
    Python callable the trace left behind (a `custom_vjp` backward rule, a host
    callback) and goes to `late`, which must keep the cache sound."""

    __slots__ = ("allowed", "late", "method", "paths", "sealed")

    def __init__(
        self,
        allowed: frozenset[str] | None,
        method: str,
        late: Callable[[str], None],
    ):
        self.allowed = allowed  # None: learn; else raise on anything outside it
        self.method = method
        self.paths: set[str] = set()
        self.sealed = False
        self.late = late

    def note(self, path: str) -> None:
        if self.sealed and self.allowed is None and path not in self.paths:
            self.late(path)  # declared fields are in the key: never stale
        if self.allowed is not None and path not in self.allowed:
            raise UndeclaredStaticRead(
                f"{self.method} read the static field {path!r} of `self`, which "
                f"`depends_on={tuple(sorted(self.allowed))}` does not name. Its value "
                "is not part of the compile key, so the result could be stale. Add "
                f'{path!r} to `depends_on`, or use `depends_on="auto"`.'
            )
        self.paths.add(path)


class _Watched(dict):
    """An instance `__dict__` that reports reads of static fields."""

    __slots__ = ("_prefix", "_reads", "_static")

    def _note(self, key: object) -> None:
        if key in self._static:
            self._reads.note(self._prefix + str(key))

    def _note_all(self) -> None:
        for name in sorted(self._static):
            self._reads.note(self._prefix + name)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self._static and not _in_construction_walk():
            self._note(key)
        return dict.get(self, key, default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return dict.setdefault(self, key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        self._note(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        self._note_all()
        return dict.popitem(self)

    def __iter__(self) -> Any:
        self._note_all()
        return dict.__iter__(self)

    def keys(self) -> Any:
        self._note_all()
        return dict.keys(self)

    def values(self) -> Any:
        self._note_all()
        return dict.values(self)

    def items(self) -> Any:
        self._note_all()
        return dict.items(self)

    def copy(self) -> dict:
        self._note_all()
        return dict(dict.items(self))

    def __reduce__(self) -> Any:
        self._note_all()
        return (dict, (dict(dict.items(self)),))

    def __eq__(self, other: object) -> bool:
        self._note_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        self._note_all()
        return dict.__ne__(self, other)

    __hash__ = None  # pyright: ignore[reportAssignmentType]

    def __repr__(self) -> str:
        self._note_all()
        return dict.__repr__(self)

    def __or__(self, other: Any) -> Any:
        self._note_all()
        return dict(dict.items(self)) | other


def _in_construction_walk() -> bool:
    """Whether the caller of `_Watched.get` is Equinox's flatten, run by
    `jtu.tree_leaves` straight from its metaclass call: a walk that only looks for
    transformed functions among the leaves, so the static values it passes over are
    not read. Without this, calling any method of `self` (`self.g(x)`) would count as
    reading every static field. Anything else (an unknown Equinox) is a read."""
    frame = sys._getframe(2)
    for _ in range(8):  # skip wrappers around `get` (a type checker's, say)
        if frame is None:
            return False
        if frame.f_code.co_filename.startswith("<generated_flatten"):
            caller = frame.f_back
            return (
                caller is not None
                and caller.f_code is _TREE_LEAVES
                and caller.f_back is not None
                and caller.f_back.f_code is _META_CALL
            )
        frame = frame.f_back
    return False


class _StaticField:
    """A class-level data descriptor for one static field: plain storage in the
    instance dictionary, and a report when the instance is being watched."""

    __slots__ = ("default", "name")

    def __init__(self, name: str, default: object):
        self.name = name
        self.default = default

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            if self.default is _NO_DEFAULT:
                raise AttributeError(self.name)
            return self.default
        d = _DICT.__get__(obj)
        if type(d) is _Watched:
            d._note(self.name)
        try:
            return dict.__getitem__(d, self.name)
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, obj: object, value: object) -> None:
        dict.__setitem__(_DICT.__get__(obj), self.name, value)

    def __delete__(self, obj: object) -> None:
        dict.__delitem__(_DICT.__get__(obj), self.name)


def install(cls: type) -> None:
    """Put a `_StaticField` on `cls` for each of its static fields (once)."""
    for name in plan(cls).static_names:
        if not isinstance(cls.__dict__.get(name), _StaticField):
            default = cls.__dict__.get(name, _NO_DEFAULT)
            type.__setattr__(cls, name, _StaticField(name, default))


def watch(obj: Any, reads: Reads, prefix: str = "") -> None:
    """Make the rebuilt module `obj`, and the modules nested in it, report reads.

    Paths follow the key (`_key.node`): a plain list or tuple by position, any other
    pytree (a dict, a named tuple) by position among its leaves, modules as leaves."""
    if not is_module(obj):
        if type(obj) is list or type(obj) is tuple:
            children = obj
        else:
            children = jtu.tree_leaves(obj, is_leaf=is_module)
            if len(children) == 1 and children[0] is obj:
                return
        for i, x in enumerate(children):
            watch(x, reads, f"{prefix}{i}.")
        return
    cls = type(obj)
    p = plan(cls)
    install(cls)
    d = _DICT.__get__(obj)
    w = _Watched(d)
    w._prefix, w._reads, w._static = prefix, reads, p.static
    _DICT.__set__(obj, w)
    for name in p.dynamic_names:
        watch(dict.__getitem__(w, name), reads, f"{prefix}{name}.")


# ----------------------------------------------------------------------------------
# Projecting a key onto the static fields that matter.


_MISSING: Final = ("missing",)


def value_at(n: Any, path: str) -> Any:
    """The static value at dotted `path` in the key node `n` of a module, as a
    `(type, value)` pair."""
    *parents, last = path.split(".")
    for seg in parents:
        n = _child(n, seg)
        if n is _MISSING:
            return _MISSING
    if not isinstance(n, tuple) or n[0] != MODULE:
        return _MISSING
    p = plan(n[1])
    if last not in p.static:
        return _MISSING
    i = p.static_names.index(last)
    return (n[5][i], n[2][i])


def _child(n: Any, seg: str) -> Any:
    if n is LEAF or n is None or not isinstance(n, tuple):
        return _MISSING
    if n[0] == MODULE:
        p = plan(n[1])
        return n[3][p.dynamic_names.index(seg)] if seg in p.dynamic else _MISSING
    if n[0] in (SEQ, TREE, LEAVES) and seg.isdigit():
        kids = children_of(n)
        return kids[int(seg)] if int(seg) < len(kids) else _MISSING
    return _MISSING


def strip(n: Any) -> Any:
    """The node without static values: structure and classes only."""
    if n is LEAF or n is None or n[0] not in (MODULE, SEQ, TREE):
        return n
    if n[0] == MODULE:
        return (MODULE, n[1], None, tuple(map(strip, n[3])), n[4], None)
    return (n[0], n[1], tuple(map(strip, n[2])))


def static_paths(n: Any, prefix: str = "") -> Iterable[str]:
    """Every static field path in the node `n`."""
    if n is LEAF or n is None or n[0] not in (MODULE, SEQ, TREE):
        return
    if n[0] == MODULE:
        p = plan(n[1])
        yield from (prefix + s for s in p.static_names)
        for name, c in zip(p.dynamic_names, n[3]):
            yield from static_paths(c, f"{prefix}{name}.")
    else:
        for i, c in enumerate(n[2]):
            yield from static_paths(c, f"{prefix}{i}.")


def project(n: Any, paths: tuple[str, ...]) -> tuple:
    """The key of `self` restricted to the static fields at `paths`."""
    hit = _projections.get(id(n))
    if hit is not None and hit[0] is n and hit[1] == paths:
        return hit[2]  # a memoised instance's node is the same object every call
    out = (strip(n), paths, tuple(value_at(n, p) for p in paths))
    if len(_projections) >= 1024:
        _projections.clear()
    _projections[id(n)] = (n, paths, out)
    return out


# Recent projections by node identity (the node itself is kept, so its id cannot be
# reused while the entry is here). Nodes hold classes and static values only.
_projections: Final[dict[int, tuple]] = {}


# ----------------------------------------------------------------------------------
# Reads that can happen after the trace.


def leaves_callables(jaxpr: Any) -> bool:
    """Whether the traced program keeps Python callables that may run later and
    read `self` then: host callbacks, `custom_vjp` backward rules, `custom_jvp`
    rules. Any callable parameter counts, so the answer errs towards yes."""
    return any(_param_callable(v) for eqn in jaxpr.eqns for v in eqn.params.values())


def _param_callable(v: Any) -> bool:
    if isinstance(v, tuple | list):
        return any(map(_param_callable, v))
    inner = getattr(v, "jaxpr", v)  # a ClosedJaxpr holds a Jaxpr
    if hasattr(inner, "eqns"):
        return leaves_callables(inner)
    return callable(v) and not isinstance(v, type)


# ----------------------------------------------------------------------------------
# The wrapper's side: which entry serves a call, and what traces taught.


_MSG_LATE_READ: Final = (
    "The static field {path!r} of `self` was read after tracing had finished, by a "
    "callable the trace left behind (a `custom_vjp` backward rule or a host "
    "callback), and this compiled entry has served calls in which {path!r} may "
    'differ. `depends_on="auto"` cannot vouch for such reads: name the field in '
    "`depends_on=(...)`, or use the default `es.jit`."
)


class Relevance:
    """`es.jit(depends_on=...)`: keys projected on the static fields of `self` that
    matter, named or learned."""

    def __init__(self, depends_on: Any, wrapper: Any):
        check_depends_on(depends_on)
        self.wrapper = wrapper
        self.cache = wrapper.cache
        self.declared = (
            tuple(depends_on) if isinstance(depends_on, tuple | list) else None
        )
        self.allowed = frozenset(self.declared) if self.declared is not None else None

    def call(self, args: tuple, key: Any, leaves: list) -> Any:
        __tracebackhide__ = True
        # Relevance keys change as traces teach which fields matter: one call at a
        # time per cache, so that no call looks up an entry another is re-keying.
        with self.cache.lock:
            self._apply_late_reads()
            try:
                return self.wrapper.call_entry(args, key, leaves, self)
            finally:
                self._apply_late_reads()

    def generations(self, full: tuple) -> list[tuple[str, ...]]:
        """The sets of static paths of `self` that keys have been projected on,
        oldest first: `depends_on` itself, or what traces taught, growing."""
        first = full[0][0] if full[0] else None
        if not _is_module_node(first):
            return [()]
        cls = first[1]  # pyright: ignore[reportOptionalSubscript]
        if self.declared is None:
            return self.cache.learned.setdefault(cls, [()])
        if cls not in self.cache.checked:
            check_declared(self.declared, cls, self.wrapper.qualname)
            self.cache.checked.add(cls)
        return [self.declared]

    def project(self, full: tuple, paths: tuple[str, ...]) -> tuple:
        args, names, kw = full
        if not args or not _is_module_node(args[0]):
            return full
        return (project(args[0], paths), *args[1:]), names, kw

    def entry_for(self, full: tuple, leaves: list) -> tuple[Entry, tuple]:
        """The entry for a call's full key: projected onto the relevant static
        fields (newest learned set first, then older ones, whose entries stay
        valid), or created."""
        generations = self.generations(full)
        newest = None
        for paths in reversed(generations):
            key = self.project(full, paths)
            newest = newest or key
            try:
                entry = self.cache.entries.get(key)
            except TypeError:
                return self.wrapper.entry_for(full, leaves), full  # raises, naming it
            if entry is not None:
                self.cache.touch(key)
                if full != entry.origin:
                    entry.reused = True
                return entry, full
        return self.wrapper.entry_for(newest, leaves, generations[-1], full), full

    def watch(self, entry: Entry, args: tuple) -> Reads | None:
        if not args or not is_module(args[0]):
            return None
        late = functools.partial(self._late_read, entry)
        reads = Reads(self.allowed, self.wrapper.name(args), late)
        watch(args[0], reads)
        return reads

    def learn(self, entry: Entry, reads: Reads | None, leaves: list, full: tuple):
        if reads is None or self.declared is not None:
            return
        paths = self._all_if_late(entry, reads, leaves, full)
        if paths <= set(entry.paths):
            return
        generations = self.cache.learned.setdefault(full[0][0][1], [()])
        union = tuple(sorted(set(generations[-1]) | paths))
        if union != generations[-1]:
            generations.append(union)
        entry.paths = union
        self.cache.rekey(entry, self.project(full, union))

    def _all_if_late(
        self, entry: Entry, reads: Reads, leaves: list, full: tuple
    ) -> set[str]:
        """What a trace read, or every static field of `self` when the program keeps
        Python callables that could read one after the trace (their reads would
        come too late to key this entry)."""
        try:
            late = leaves_callables(entry.jitted.trace(*leaves).jaxpr.jaxpr)
        except Exception:  # could not inspect the program: assume the worst
            late = True
        return set(static_paths(full[0][0])) if late else reads.paths

    def _late_read(self, entry: Entry, path: str) -> None:
        """A static field read after tracing ended, by a callable the trace left
        behind. If the entry only ever served the configuration it was traced for,
        the value read is right: queue the field to be learned. Otherwise refuse."""
        if path in entry.paths:
            return  # part of the key: never stale
        if entry.reused:
            raise UndeclaredStaticRead(_MSG_LATE_READ.format(path=path))
        self.cache.late.append((entry, path))

    def _apply_late_reads(self) -> None:
        while self.cache.late:
            entry, path = self.cache.late.pop()
            if path in entry.paths:
                continue
            generations = self.cache.learned.setdefault(entry.origin[0][0][1], [()])
            union = tuple(sorted(set(generations[-1]) | {path}))
            if union != generations[-1]:
                generations.append(union)
            entry.paths = union
            self.cache.rekey(entry, self.project(entry.origin, union))

    def hit(self, entry: Entry, full: tuple, args: tuple) -> None:
        if full != entry.origin and logger.isEnabledFor(logging.DEBUG):
            phrases = diff(entry.origin, full, self.wrapper._argnames)
            logger.debug(
                "%s: no compile: %s, which no trace of it read",
                self.wrapper.name(args),
                "; ".join(phrases),
            )


def _is_module_node(n: Any) -> bool:
    return isinstance(n, tuple) and n[0] == MODULE


def check_declared(paths: tuple[str, ...], cls: type, name: str) -> None:
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


def check_depends_on(depends_on: Any) -> None:
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
