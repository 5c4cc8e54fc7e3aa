"""`es.edit`: mutable-looking edits that produce a validated, frozen module."""

import operator
import types
from typing import Any, Final, Generic, TypeVar

import equinox as eqx
import jax.tree_util as jtu

# An edit puts its copies in Equinox's set of modules being initialised, which may
# assign their own fields, for the duration of the block.
from ._compat import currently_initialising as _currently_initialising
from ._fields import (
    Defunct,
    drop_cached,
    field_info,
    instance_dict,
    is_module,
    is_module_type,
)
from ._validate import convert_and_check, run_check_inits


_M = TypeVar("_M", bound=eqx.Module)
_DICT: Final = eqx.Module.__dict__["__dict__"]  # set, bypassing Equinox


class _Copy:
    """An editable copy of one module, with the field values it started from."""

    __slots__ = ("children", "copies", "copy", "original", "pending", "start")

    def __init__(self, original: eqx.Module, copy: eqx.Module, copies: list):
        self.original = original
        self.copy = copy
        self.start: dict[str, Any] = {}  # the copy's fields as made, set once made
        self.children: list[_Copy] = []  # copies made of modules inside it
        self.copies = copies  # every copy of the edit
        self.pending: set[str] = set()  # fields that still hold the original's value


# Copy on write: an `es.Module` copy copies a field's modules and mutable containers
# when the field is first read (`es.Module.__getattribute__` calls `materialise`),
# and a tuple or list of them copies an item when the item is first read. Copies
# of other modules, whose reads cannot be seen, copy their contents on creation.
_lazy: Final[dict[int, _Copy]] = {}


def materialise(copy: Any, name: str) -> None:
    """Copy what the field `name` of the editable `copy` holds, before it is read
    (every field, for `__dict__`)."""
    record = _lazy.get(id(copy))
    if record is None or record.copy is not copy:
        return
    names = list(record.pending) if name == "__dict__" else [name]
    d = instance_dict(copy)
    for k in names:
        if k in record.pending:
            record.pending.discard(k)
            d[k] = record.start[k] = _copy_child(d[k], record)
    if not record.pending:
        _lazy.pop(id(copy), None)


class edit(Generic[_M]):  # noqa: N801  (used like a function: `with es.edit(m)`)
    """Edit a module as if it were mutable; get a frozen, validated module back.

    Inside the block, assign fields of the yielded copy, static or dynamic, and
    fields of modules nested in it (those are editable copies too, as are the lists
    that hold them). Copies are made on write: entering copies the module itself
    only, and a nested module is copied when it is first reached, so an edit of one
    leaf costs the modules on its path, not the whole tree. On exit, the new values
    go through the same checks as [`eqx_static.with_static`][] and
    [`eqx_static.with_dynamic`][] (converters,
    hashable static values, jaxtyping annotations, `__check_init__`), and the copy
    becomes an ordinary frozen module. Unchanged nested modules are the original
    objects, shared, not copies. If the block raises, or a check fails, the
    original module is untouched.

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
            bias: float
            square: bool = eqx.field(static=True)

        m = Outer(inner=Inner(scale=1.0), bias=0.0, square=False)
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
        return _copy_module(self._module, self._copies)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        ok = False
        try:
            if exc_type is None:
                _freeze(self._copies[0])
                ok = True
        finally:
            for c in self._copies:
                _currently_initialising.remove(c.copy)
                _lazy.pop(id(c.copy), None)
                if not ok:  # nothing is produced: make any use of the copy fail
                    defunct = Defunct()
                    defunct.cls = type(c.copy).__qualname__
                    _DICT.__set__(c.copy, defunct)


def _copy_module(obj: Any, copies: list[_Copy]) -> Any:
    """An editable copy of the module `obj`: of an `es.Module`, copy on write; of
    another module, with everything mutable in it copied now."""
    copy = object.__new__(type(obj))
    record = _Copy(obj, copy, copies)
    copies.append(record)
    d, od = instance_dict(copy), instance_dict(obj)
    if field_info(type(obj)).stores_arrays:
        d.update(od)
        record.pending = {k for k, v in od.items() if _may_hold_mutable(v)}
        if record.pending:
            _lazy[id(copy)] = record
    else:
        for name, value in od.items():
            d[name] = _copy_child(value, record)
    record.start = dict(d)
    _currently_initialising.add(copy)
    return copy


def _may_hold_mutable(value: Any) -> bool:
    t = type(value)
    return t in _CONTAINERS or is_module_type(t)


def _copy_child(value: Any, parent: _Copy) -> Any:
    """`value` made editable without sharing anything mutable with the original:
    a module is copied; a list or tuple holding modules or containers becomes one
    that copies an item when it is read; a list of leaves or a dict is copied now.
    Tuples holding nothing mutable are shared."""
    if is_module(value):
        n = len(parent.copies)
        copy = _copy_module(value, parent.copies)
        parent.children.append(parent.copies[n])
        return copy
    t = type(value)
    if t is dict:
        return {k: _copy_child(v, parent) for k, v in value.items()}
    if t is not tuple and t is not list:
        return value
    if _holds_mutable(value):
        return (_EditTuple if t is tuple else _EditList)(value, parent)
    return value if t is tuple else value.copy()  # a list of leaves: copied in C


class _EditTuple(tuple):
    """A tuple of modules or containers inside an edit: item `i` is copied when
    first read, and the same copy is returned after that."""

    source: tuple  # the original tuple
    parent: _Copy
    made: dict[int, Any]  # index -> the copy handed out

    def __new__(cls, items: tuple, parent: _Copy) -> "_EditTuple":
        self = super().__new__(cls, items)
        self.source, self.parent, self.made = items, parent, {}
        return self

    def __getitem__(self, i: Any) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        j = operator.index(i)
        j = j + len(self) if j < 0 else j
        if j not in self.made:
            self.made[j] = _copy_child(tuple.__getitem__(self, i), self.parent)
        return self.made[j]

    def __iter__(self) -> Any:
        return (self[j] for j in range(len(self)))


class _EditList(list):
    """A list of modules or containers inside an edit: an item of the original is
    replaced by its copy when first read."""

    def __init__(self, items: list, parent: _Copy):
        super().__init__(items)
        self.parent = parent
        self.originals = {id(x) for x in items}

    def __getitem__(self, i: Any) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        item = list.__getitem__(self, i)
        if id(item) in self.originals:
            copy = _copy_child(item, self.parent)
            if copy is not item:
                list.__setitem__(self, i, copy)
            return copy
        return item

    def __iter__(self) -> Any:
        return (self[j] for j in range(len(self)))

    def pop(self, i: Any = -1) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        item = self[i]
        list.__delitem__(self, i)
        return item


def _holds_mutable(value: Any) -> bool:
    """Whether a container holds modules, lists or dicts at any depth (which need
    copies too). The distinct item types are looked at first: a tuple of 10,000
    arrays is one type."""
    items = value.values() if type(value) is dict else value
    kinds = set(map(type, items))
    if any(is_module_type(k) or k is list or k is dict for k in kinds):
        return True
    return tuple in kinds and any(_holds_mutable(x) for x in items if type(x) is tuple)


_CONTAINERS: Final = frozenset({list, tuple, dict})


def _freeze(record: _Copy) -> bool:
    """Validate the copy bottom-up; return whether anything in it changed.

    Unchanged nested copies are swapped back for their originals, so that the
    result shares every unchanged subtree with the module that was edited.
    """
    kept = [c for c in record.children if not _freeze(c)]
    originals = {id(c.copy): c.original for c in kept}
    d, start = instance_dict(record.copy), record.start
    before = instance_dict(record.original)
    assigned = {k for k, v in d.items() if k not in start or v is not start[k]}
    for k in start.keys() - assigned:
        d[k] = _restore(start[k], originals, before.get(k))
    info = field_info(type(record.copy))
    # Assigned fields, and containers changed in place (their numbers are stored as
    # arrays and checked too; converters run on assigned values only).
    new = {
        k: d[k]
        for k in info.names
        if k in d and (k in assigned or d[k] is not before.get(k))
    }
    d.update(convert_and_check(info, new, assigned, before))
    changed = d.keys() != before.keys() or any(d[k] is not before[k] for k in d)
    if changed:
        drop_cached(d, info)
        run_check_inits(info, record.copy)
    return changed


def _restore(value: Any, originals: dict[int, Any], original: Any) -> Any:
    """`value` with unchanged copies replaced by their originals; `original` itself
    if that leaves every item of `value` the same as the item of `original`."""
    if is_module(value):
        return originals.get(id(value), value)
    if type(value) is _EditTuple:  # only the items read can differ
        source = value.source
        changed = {}
        for j, item in value.made.items():
            item = _restore(item, originals, source[j])
            if item is not source[j]:
                changed[j] = item
        if not changed:
            return source if source is original else tuple(source)
        items = list(source)
        for j, item in changed.items():
            items[j] = item
        return tuple(items)
    if type(value) is _EditList:
        value = list(list.__iter__(value))
    if type(value) not in (list, tuple, dict) or value is original:
        return value
    items, orig_items = _items(value), _items(original)
    same_shape = type(original) is type(value) and _keys(original) == _keys(value)
    if not same_shape:
        orig_items = [None] * len(items)
    # Pair each item with its original, so that nested containers are restored too.
    restored = [
        _restore(v, originals, o) for v, o in zip(items, orig_items, strict=True)
    ]
    if same_shape and all(a is b for a, b in zip(restored, orig_items, strict=True)):
        return original
    if isinstance(value, dict):
        return dict(zip(value.keys(), restored, strict=True))
    return type(value)(restored)


def _items(x: Any) -> list:
    if type(x) is dict:
        return list(x.values())
    return list(x) if type(x) in (list, tuple) else []


def _keys(x: Any) -> list:
    return list(x) if type(x) is dict else list(range(len(_items(x))))


# Inside the block, JAX sees them as the tuple and list they stand for.
jtu.register_pytree_node(_EditTuple, lambda t: (tuple(t), None), lambda _, c: tuple(c))  # pyright: ignore[reportArgumentType]
jtu.register_pytree_node(_EditList, lambda t: (list(t), None), lambda _, c: list(c))  # pyright: ignore[reportArgumentType]
