"""Relevance-aware keys: `es.jit(depends_on=...)` keys a call on the static fields
of `self` that its trace read, and nothing else.

While such a method traces, `self` and the `es.Module`s nested in it are rebuilt
with a watched instance dictionary. `es.Module.__getattribute__` reports attribute
reads of static fields (`self.sp`, `getattr`, properties); every other route to a
field (`self.__dict__`, `vars`, a flatten by JAX or Equinox, copying) goes through
the watched dictionary, whose bulk accessors count as reading every static field.
The static fields of a nested module that is not an `es.Module` (whose reads
cannot be watched without changing its class) all count as read. A read is
therefore observed precisely or over-approximated; it is never missed. Nothing
is installed on any class.

Each compiled entry is keyed by the values of the fields *its own* trace read: it
is valid for every call that agrees with it there (a guard, as in
`torch.compile`). A call is looked up under each distinct read set seen for the
class, newest first. No lock is held while tracing: a miss traces a private entry
and keys it afterwards, and an entry whose later trace (a new shape) reads a field
outside its key is retired at that read, so that a concurrent call that used it
runs again.
"""

import difflib
import gc
import logging
import types
from collections.abc import Callable, Iterable
from typing import Any, Final

import equinox as eqx
import jax.tree_util as jtu

from ._cache import Entry
from ._explain import diff
from ._fields import field_info, instance_dict, is_module
from ._key import ARRAY_TYPES, children_of, LEAF, LEAVES, MODULE, plan, SEQ, TREE


logger: Final = logging.getLogger("eqx_static")
_DICT: Final = eqx.Module.__dict__["__dict__"]  # get and set, bypassing Equinox


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

    __slots__ = ("allowed", "entry", "late", "method", "modules", "paths", "sealed")

    def __init__(
        self,
        allowed: frozenset[str] | None,
        method: str,
        entry: Entry,
        late: Callable[[str], None],
    ):
        self.allowed = allowed  # None: learn; else raise on anything outside it
        self.method = method
        self.entry = entry
        self.paths: set[str] = set()
        self.modules: list[Any] = []  # the watched modules, for `late_readers`
        self.sealed = False
        self.late = late

    def note(self, path: str) -> None:
        if self.sealed:
            if self.allowed is None and path not in self.paths:
                self.late(path)  # declared fields are in the key: never stale
            return
        if self.allowed is not None and path not in self.allowed:
            raise UndeclaredStaticRead(
                f"{self.method} read the static field {path!r} of `self`, which "
                f"`depends_on={tuple(sorted(self.allowed))}` does not name. Its value "
                "is not part of the compile key, so the result could be stale. Add "
                f'{path!r} to `depends_on`, or use `depends_on="auto"`.'
            )
        entry = self.entry
        if entry.paths is not None and path not in entry.paths and not entry.retired:
            # A keyed entry traced again (a new shape) and read a field its key
            # lacks: retire it now, before this trace can serve anyone else.
            entry.retired = True
            entry.epoch += 1
        self.paths.add(path)


class _Watched(dict):
    """An instance `__dict__` that reports reads of static fields."""

    __slots__ = ("_prefix", "_reads", "_static")

    def _note(self, key: object) -> None:
        if key in self._static:
            self._reads.note(self._prefix + str(key))

    def on_read(self, name: str) -> None:
        """`es.Module.__getattribute__` read `name` off the watched module."""
        if name in self._static:
            self._reads.note(self._prefix + name)

    def _note_all(self) -> None:
        for name in sorted(self._static):
            self._reads.note(self._prefix + name)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
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


def watch(obj: Any, reads: Reads, prefix: str = "") -> None:
    """Make the rebuilt module `obj`, and the modules nested in it, report reads.

    Paths follow the key: a plain list or tuple by position, any other pytree (a
    dict, a named tuple) by position among its leaves, modules as leaves."""
    stack = [(obj, prefix)]
    while stack:
        obj, prefix = stack.pop()
        if not is_module(obj):
            if type(obj) is list or type(obj) is tuple:
                children = obj
            else:
                children = jtu.tree_leaves(obj, is_leaf=is_module)
                if len(children) == 1 and children[0] is obj:
                    continue
            stack += [(x, f"{prefix}{i}.") for i, x in enumerate(children)]
            continue
        p = plan(type(obj))
        d = instance_dict(obj)
        reads.modules.append(obj)
        if not p.stores_arrays:  # not an `es.Module`: its reads cannot be seen
            for name in p.static_names:
                reads.note(prefix + name)
        else:
            w = _Watched(d)
            w._prefix, w._reads, w._static = prefix, reads, p.static
            _DICT.__set__(obj, w)
            d = w
        for name in p.dynamic_names:
            if name in d:
                stack.append((dict.__getitem__(d, name), f"{prefix}{name}."))


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
        children = n[3]
        if children is not plan(n[1]).all_leaves:  # (every field an array: as is)
            children = tuple(map(strip, children))
        return (MODULE, n[1], None, children, n[4], None)
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


def late_readers(jaxpr: Any, modules: list[Any]) -> bool:
    """Whether the traced program keeps a Python callable (a host callback, a
    `custom_vjp` backward rule, ...) that can reach one of the watched `modules`,
    and so could read a static field after the trace. Sub-jaxprs (nested jits,
    `cond`, `scan`) are searched too; a callable that cannot reach them (the rules
    of `jax.nn.relu`, a mesh) is no reader. The search is bounded: past the bound
    the answer is yes."""
    targets = {id(m) for m in modules}
    callables: list[Any] = []
    stack = [jaxpr]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            for v in eqn.params.values():
                _params(v, stack, callables)
    return any(_reaches(c, targets) for c in callables)


def _params(v: Any, jaxprs: list, callables: list) -> None:
    if isinstance(v, tuple | list):
        for x in v:
            _params(x, jaxprs, callables)
        return
    inner = getattr(v, "jaxpr", v)  # a ClosedJaxpr holds a Jaxpr
    if hasattr(inner, "eqns"):
        jaxprs.append(inner)
    elif callable(v) and not isinstance(v, type):
        callables.append(v)


_OPAQUE: Final = (type, types.ModuleType, str, bytes, int, float, bool, type(None))
_BOUND: Final = 20_000  # objects visited per callable before assuming the worst


def _reaches(root: Any, targets: set[int]) -> bool:
    seen = {id(root)}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in targets:
            return True
        if len(seen) > _BOUND:
            return True
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not isinstance(ref, _OPAQUE):
                seen.add(id(ref))
                stack.append(ref)
    return False


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
    """`es.jit(depends_on=...)`: entries keyed on the static fields of `self` that
    their traces read (`"auto"`), or that `depends_on` names."""

    def __init__(self, depends_on: Any, wrapper: Any):
        check_depends_on(depends_on)
        self.wrapper = wrapper
        self.cache = wrapper.cache
        self.declared = (
            tuple(sorted(depends_on)) if isinstance(depends_on, tuple | list) else None
        )
        self.allowed = frozenset(self.declared) if self.declared is not None else None

    # -- look-up ---------------------------------------------------------------

    def read_sets(self, cls: type) -> list[tuple[str, ...]]:
        """The distinct sets of static paths that entries for `cls` are keyed on,
        newest first (with `depends_on=(...)`: that one set)."""
        if self.declared is not None:
            if cls not in self.cache.checked:
                check_declared(self.declared, cls, self.wrapper.qualname)
                self.cache.checked.add(cls)
            return [self.declared]
        return self.cache.learned.get(cls, [])

    def key_on(self, full: tuple, paths: tuple[str, ...]) -> tuple:
        args, names, kw = full
        return (project(args[0], paths), *args[1:]), names, kw

    def lookup(self, full: tuple, leaves: list) -> Entry:
        """A keyed entry valid for the call `full`, or a new private one (keyed once
        its trace says what it read)."""
        cls = full[0][0][1]
        for paths in self.read_sets(cls):
            key = self.key_on(full, paths)
            try:
                entry = self.cache.entries.get(key)
            except TypeError:
                return self.wrapper.entry_for(full, leaves)  # raises, naming it
            if entry is not None and not entry.retired:
                self.cache.touch(key)
                if full != entry.origin:
                    entry.reused = True
                return entry
        if self.declared is not None:
            return self.wrapper.entry_for(
                self.key_on(full, self.declared), leaves, self.declared, full
            )
        return self.wrapper.new_entry(full, leaves)

    # -- calls -----------------------------------------------------------------

    def call(self, args: tuple, full: tuple, leaves: list) -> Any:
        """Call the entry valid for `full`; again if the entry was retired while the
        call ran (another trace found that its key lacks a field)."""
        __tracebackhide__ = True
        if not (full[0] and _is_module_node(full[0][0])):
            return self.wrapper.call_entry(args, full, leaves)
        self._apply_late_reads()
        while True:
            entry = self.lookup(full, leaves)
            epoch = entry.epoch
            out, missed = self.wrapper.run(entry, args, full, leaves)
            if missed or entry.epoch == epoch:
                if not missed:
                    self.hit(entry, full, args)
                return out

    def watch(self, entry: Entry, args: tuple) -> Reads | None:
        if not args or not is_module(args[0]):
            return None
        late = lambda path: self._late_read(entry, path)  # noqa: E731
        reads = Reads(self.allowed, self.wrapper.name(args), entry, late)
        watch(args[0], reads)
        return reads

    def learn(self, entry: Entry, reads: Reads | None, leaves: list, full: tuple):
        """Key `entry` by what its trace read (all static fields of `self` if the
        program keeps a callable that could read one later)."""
        if reads is None:
            return
        if self.declared is not None:
            return
        paths = set(reads.paths)
        try:
            jaxpr = entry.jitted.trace(*leaves).jaxpr.jaxpr
            if late_readers(jaxpr, reads.modules):
                paths = set(static_paths(full[0][0]))
        except Exception:  # could not inspect the program: assume the worst
            paths = set(static_paths(full[0][0]))
        if entry.paths is not None:
            if paths <= set(entry.paths) and not entry.retired:
                return
            paths |= set(entry.paths)
        self._key(entry, tuple(sorted(paths)), full)

    def _key(self, entry: Entry, paths: tuple[str, ...], full: tuple) -> None:
        cls = full[0][0][1]
        with self.cache.lock:
            sets = self.cache.learned.setdefault(cls, [])
            if paths in sets:
                sets.remove(paths)
            sets.insert(0, paths)  # newest first
            entry.paths = paths
            entry.retired = False
            self.cache.rekey(entry, self.key_on(full, paths))

    def _late_read(self, entry: Entry, path: str) -> None:
        """A static field read after tracing ended, by a callable the trace left
        behind (it may run on another thread). If the entry only ever served the
        configuration it was traced for, the value read is right: retire the entry
        and queue the field to be learned. Otherwise the value may be stale:
        refuse."""
        if entry.paths is None or path in entry.paths:
            return  # part of the key: never stale
        if entry.reused:
            raise UndeclaredStaticRead(_MSG_LATE_READ.format(path=path))
        entry.retired = True
        entry.epoch += 1
        self.cache.late.append((entry, path))

    def _apply_late_reads(self) -> None:
        while self.cache.late:
            try:
                entry, path = self.cache.late.pop()
            except IndexError:  # another thread took it
                return
            paths = tuple(sorted({*(entry.paths or ()), path}))
            self._key(entry, paths, entry.origin)

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


# ----------------------------------------------------------------------------------
# A `depends_on` trace that calls another `es.jit` function on `self`.


class Handover:
    """The watched modules a call received from a `depends_on` trace around it.

    Building the call's key read them without reporting (`_key.watched`). If the
    call traces, its rebuilt modules are watched in their place (`rewatch`), so the
    outer trace learns exactly what the inner one read; if it does not trace (its
    own cache was warm), every static field of those modules counts as read."""

    __slots__ = ("args", "done", "seen")

    def __init__(self, args: tuple, seen: list):
        self.args = args
        self.seen = seen
        self.done = False

    def settle(self) -> None:
        if not self.done:
            for d in self.seen:
                d._note_all()


def rewatch(handover: Handover, rebuilt: tuple) -> None:
    """Watch the modules of `rebuilt` (the arguments a trace rebuilt) that stand
    where `handover.args` held watched ones, reporting to the same collectors."""
    stack = list(zip(handover.args, rebuilt))
    while stack:
        old, new = stack.pop()
        if is_module(old):
            if type(new) is not type(old):
                continue
            d, nd = instance_dict(old), instance_dict(new)
            if type(d) is _Watched:
                w = _Watched(nd)
                w._prefix, w._reads, w._static = d._prefix, d._reads, d._static
                _DICT.__set__(new, w)
            for name in plan(type(old)).dynamic_names:
                if name in d and name in nd:
                    stack.append(
                        (dict.__getitem__(d, name), dict.__getitem__(nd, name))
                    )
        elif type(old) in (list, tuple) and type(new) is type(old):
            stack += zip(old, new)
        elif not isinstance(old, ARRAY_TYPES) and old is not None:
            a = jtu.tree_leaves(old, is_leaf=is_module)
            b = jtu.tree_leaves(new, is_leaf=is_module)
            if len(a) == len(b) and (len(a) != 1 or a[0] is not old):
                stack += zip(a, b)
    handover.done = True
