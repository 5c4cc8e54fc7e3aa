"""`es.edit`: mutable-looking edits, copied on write, ending in the checks of
`_module.convert_and_check` and `run_check_inits`."""

import operator
from typing import Any, cast, Generic, NoReturn, TypeVar

import equinox as eqx
import jax.tree_util as jtu

from ._fields import DICT, field_info, instance_dict, is_module, is_module_type
from ._jax import allow_assignments, forbid_assignments
from ._module import CONTAINERS, convert_and_check, run_check_inits


_M = TypeVar("_M", bound=eqx.Module)
# An editable copy: the original, the copy, and the copy's fields as made (a field
# copied on its first read is updated there).
_Copy = tuple[Any, Any, dict[str, Any]]


# Copy on write, so that an edit costs what its path holds, not what the module
# holds. A copy of an `es.Module` shares the original's values until a field is
# first read, then copies the modules and mutable containers that field holds (its
# `__dict__` is an `_Unread` until then); a copy of another module, whose reads
# cannot be seen, copies them at once. A tuple or list of modules or containers
# copies an item when it is first read. The copies are listed in the order they
# are made: a copy comes after the one it was read from. `es.Module.__getattribute__`
# asks a `__dict__` that is not a plain dict (an `_Unread`, a `Defunct`) for the
# dict to read, before each read.


class _Unread(dict):
    """The `__dict__` of an `es.edit` copy of an `es.Module` while some of its
    fields (`pending`) still hold the original's values."""

    __slots__ = ("copies", "pending", "start")
    copies: list[_Copy]
    pending: set[str]
    start: dict[str, Any]

    def on_read(self, module: Any, name: str) -> dict:
        """Copy what the field `name` (every field, for `__dict__`) holds; once none
        is pending, give `module` a plain dict."""
        for k in list(self.pending) if name == "__dict__" else [name]:
            if k in self.pending:
                self.pending.discard(k)
                if self[k] is self.start[k]:  # not assigned since: still shared
                    self[k] = self.start[k] = _fresh(self[k], self.copies)
        if self.pending:
            return self
        DICT.__set__(module, d := dict(self))
        return d


class Defunct(dict):
    """The `__dict__` of a copy discarded by a failed `es.edit`: every read raises
    (through `es.Module.__getattribute__`, and Equinox's flatten's `__dict__.get`)."""

    __slots__ = ("cls",)

    def __init__(self, cls: str):
        self.cls = cls

    def on_read(self, *_: Any) -> NoReturn:
        raise RuntimeError(
            f"This `{self.cls}` is the copy made by an `es.edit` block that raised: it "
            "was discarded, and any use of it is an error. The module you edited is "
            "unchanged; edit it again."
        )

    get = __getitem__ = __len__ = on_read


class edit(Generic[_M]):  # noqa: N801  (used like a function: `with es.edit(m)`)
    """Edit a module as if it were mutable; get a frozen, validated module back.

    Inside the block, assign fields, static or dynamic, of the yielded copy and of
    the modules nested in it (editable copies too, as are the lists holding them).
    Copies are made on write: an edit of one leaf copies the modules on its path,
    not the whole tree. On exit, the new values go through the checks of
    [`eqx_static.with_static`][] and [`eqx_static.with_dynamic`][], and the copy
    becomes an ordinary frozen module, sharing every unchanged nested module with
    the original. If the block raises, or a check fails, the original is untouched.

    **Arguments:**

    - `module`: any `eqx.Module`.

    !!! example

        ```python
        import equinox as eqx
        import eqx_static as es

        class Inner(es.Module):
            scale: float

        class Outer(es.Module):
            inner: Inner
            square: bool = eqx.field(static=True)

        m = Outer(inner=Inner(scale=1.0), square=False)
        with es.edit(m) as m2:
            m2.square = True
            m2.inner.scale = 0.5
        assert m2.square and m2.inner.scale == 0.5
        assert not m.square and m.inner.scale == 1.0
        ```
    """

    def __init__(self, module: _M, /):
        if not is_module(module):
            raise TypeError(f"`es.edit` takes an `eqx.Module`, got {type(module)}.")
        self._module = module
        self._copies: list[_Copy] = []

    def __enter__(self) -> _M:
        if self._copies:
            raise RuntimeError("An `es.edit` context cannot be entered twice.")
        return cast(_M, _copy_module(self._module, self._copies))

    def __exit__(self, *exc_info: object) -> None:
        ok = False
        try:
            if exc_info[0] is None:  # the block raised nothing
                _freeze(self._copies)
                ok = True
        finally:
            for _, copy, _ in self._copies:
                forbid_assignments(copy)
                if not ok:  # nothing is produced: make any use of the copy fail
                    DICT.__set__(copy, Defunct(type(copy).__qualname__))


def _copy_module(obj: Any, copies: list[_Copy]) -> Any:
    """An editable copy of the module `obj` (see above), listed in `copies`."""
    copy, start = object.__new__(type(obj)), {}
    copies.append((obj, copy, start))
    d = dict(instance_dict(obj))
    if not field_info(type(obj)).stores_arrays:  # not an `es.Module`: copied now
        d.update({k: _fresh(v, copies) for k, v in d.items()})
    elif pending := {
        k for k, v in d.items() if type(v) in CONTAINERS or is_module_type(type(v))
    }:
        d = _Unread(d)
        d.copies, d.pending, d.start = copies, pending, start
    DICT.__set__(copy, d)
    start.update(d)
    allow_assignments(copy)
    return copy


def _fresh(value: Any, copies: list[_Copy]) -> Any:
    """`value`, sharing nothing mutable with the original: a module is copied; a list
    or tuple holding modules or containers copies an item when it is read; a dict or
    a list of leaves is copied now; a tuple holding nothing mutable is shared."""
    if is_module(value):
        return _copy_module(value, copies)
    t = type(value)
    if t is dict:
        return {k: _fresh(v, copies) for k, v in value.items()}
    if t is not tuple and t is not list:
        return value
    if _holds_mutable(value):
        return (_EditTuple if t is tuple else _EditList)(value, copies)
    return value if t is tuple else value.copy()  # a list of leaves: copied in C


def _holds_mutable(value: Any) -> bool:
    """Whether a tuple or list holds modules, lists or dicts at any depth (looking at
    the distinct item types first: a tuple of 10,000 arrays is one type)."""
    kinds = set(map(type, value))
    if any(is_module_type(k) or k is list or k is dict for k in kinds):
        return True
    return tuple in kinds and any(_holds_mutable(x) for x in value if type(x) is tuple)


class _Lazy:
    """What a lazily copied tuple or list hands out: the copies, each made when first
    read (`__getitem__`), whichever way it is read."""

    def __iter__(self: Any) -> Any:
        return map(self.__getitem__, range(len(self)))

    def __reversed__(self: Any) -> Any:
        return map(self.__getitem__, range(len(self) - 1, -1, -1))

    def __radd__(self: Any, other: Any) -> Any:  # `[x] + m2.layers`
        return other + self[:]

    def __reduce_ex__(self: Any, protocol: Any) -> Any:  # copy, deepcopy, pickle
        return type(self[:]), (self[:],)


class _EditTuple(_Lazy, tuple):
    """A tuple of modules or containers inside an edit: item `i` is copied when
    first read, and the same copy is handed out after that."""

    source: tuple  # the original tuple
    copies: list[_Copy]
    made: dict[int, Any]  # index -> the copy handed out

    def __new__(cls, items: tuple, copies: list[_Copy]) -> "_EditTuple":
        self = super().__new__(cls, items)
        self.source, self.copies, self.made = items, copies, {}
        return self

    def __getitem__(self, i: Any) -> Any:  # pyright: ignore
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        j = operator.index(i)
        j = j + len(self) if j < 0 else j
        if j not in self.made:
            self.made[j] = _fresh(tuple.__getitem__(self, i), self.copies)
        return self.made[j]


class _EditList(_Lazy, list):
    """A list of modules or containers inside an edit: an item of the original is
    replaced by its copy when first read."""

    def __init__(self, items: list, copies: list[_Copy]):
        super().__init__(items)
        self.copies, self.originals = copies, {id(x) for x in items}

    def __getitem__(self, i: Any) -> Any:  # pyright: ignore
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        item = list.__getitem__(self, i)
        if id(item) in self.originals:
            item = _fresh(item, self.copies)
            list.__setitem__(self, i, item)
        return item

    def pop(self, i: Any = -1) -> Any:  # pyright: ignore
        item = self[i]
        list.__delitem__(self, i)
        return item


def _on_copies(f: Any) -> Any:
    """`f`, a C method of `tuple` or `list`, which reads the items as stored, run on
    the copies. A tuple stores the originals; a list stores an item's copy once read,
    and until then the original, equal to its copy: a list's comparisons, `in`,
    `index`, `count` and `repr` need no copies (and `sort` only moves items)."""

    def method(self: Any, *args: Any) -> Any:
        # a list's copies are stored in it as well
        copies = self[:]
        rest = [a[:] if isinstance(a, _Lazy) else a for a in args]  # pyright: ignore
        return f(copies if type(self) is _EditTuple else self, *rest)

    return method


for _cls, _names in [
    (_EditList, "__add__ __mul__ __rmul__ __imul__ copy"),
    (_EditTuple, "__add__ __mul__ __rmul__ __contains__ count index __repr__ __hash__"),
    (_EditTuple, "__eq__ __ne__ __lt__ __le__ __gt__ __ge__"),
]:
    for _name in _names.split():
        setattr(_cls, _name, _on_copies(getattr(_cls.__base__, _name)))


# Inside the block, JAX sees them as the tuple and list they stand for.
for _cls, _as in [(_EditTuple, tuple), (_EditList, list)]:
    jtu.register_pytree_node(
        _cls, lambda t, a=_as: (a(t), None), lambda _, c, a=_as: a(c)
    )


def _freeze(copies: list[_Copy]) -> None:
    """Check every copy, each after the copies read from it (listed after it); swap
    an unchanged copy back for its original, so that the result shares every
    unchanged subtree with the module that was edited."""
    unchanged: dict[int, Any] = {}  # the id of an unchanged copy -> its original
    for original, copy, start in reversed(copies):
        d, before = instance_dict(copy), instance_dict(original)
        if type(d) is _Unread:  # fields never read: no copy is made of them now
            DICT.__set__(copy, d := dict(d))
        assigned = {k for k, v in d.items() if k not in start or v is not start[k]}
        # An assigned value may hold copies too: `m2.a = m2.layers`.
        d.update({k: _restore(v, unchanged, before.get(k)) for k, v in d.items()})
        info = field_info(type(copy))
        # Assigned fields, and containers changed in place (their numbers are stored
        # as arrays and checked too; converters run on assigned values only).
        new = {
            k: d[k]
            for k in info.names
            if k in d and (k in assigned or d[k] is not before.get(k))
        }
        d.update(convert_and_check(info, new, assigned, before))
        if d.keys() == before.keys() and all(d[k] is before[k] for k in d):
            unchanged[id(copy)] = original
        else:
            run_check_inits(info, copy)


def _restore(value: Any, unchanged: dict[int, Any], original: Any) -> Any:
    """`value` with unchanged copies replaced by their originals; `original` itself
    if that leaves every item of `value` the same as the item of `original`."""
    if is_module(value):
        return unchanged.get(id(value), value)
    if type(value) is _EditTuple:  # only the items read can differ
        items = list(value.source)  # in C: a tuple of 1,000 modules, one of them read
        for j, x in value.made.items():
            items[j] = _restore(x, unchanged, items[j])
        same = all(items[j] is value.source[j] for j in value.made)
        return value.source if same else tuple(items)
    if type(value) is _EditList:
        value = list(list.__iter__(value))
    t = type(value)
    if t not in CONTAINERS or value is original:
        return value
    # Pair each item with its original, so that nested containers are restored too.
    keys = list(value) if t is dict else range(len(value))
    same = type(original) is t and keys == (
        list(original) if t is dict else range(len(original))
    )
    olds = [original[k] if same else None for k in keys]
    restored = [_restore(value[k], unchanged, o) for k, o in zip(keys, olds)]
    if same and all(map(operator.is_, restored, olds)):
        return original
    return dict(zip(keys, restored)) if t is dict else t(restored)
