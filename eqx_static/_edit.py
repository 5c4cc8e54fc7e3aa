"""`es.edit`: mutable-looking edits that produce a validated, frozen module."""

import types
from typing import Any, Final, Generic, TypeVar

import equinox as eqx

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

    __slots__ = ("children", "copy", "original", "start")

    def __init__(self, original: eqx.Module, copy: eqx.Module, children: list):
        self.original = original
        self.copy = copy
        self.start: dict[str, Any] = {}  # the copy's fields as made, set once made
        self.children = children


class edit(Generic[_M]):  # noqa: N801  (used like a function: `with es.edit(m)`)
    """Edit a module as if it were mutable; get a frozen, validated module back.

    Inside the block, assign fields of the yielded copy, static or dynamic, and
    fields of modules nested in it (those are editable copies too, as are the lists
    that hold them). On exit, the new values go through the same checks as
    [`eqx_static.with_static`][] and [`eqx_static.with_dynamic`][] (converters,
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
        return _copy_tree(self._module, self._copies)

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
                if not ok:  # nothing is produced: make any use of the copy fail
                    defunct = Defunct()
                    defunct.cls = type(c.copy).__qualname__
                    _DICT.__set__(c.copy, defunct)


def _copy_tree(obj: Any, copies: list[_Copy]) -> Any:
    """Editable copies of the modules in `obj` and of the containers holding them."""
    if is_module(obj):
        copy = object.__new__(type(obj))
        record = _Copy(obj, copy, [])
        copies.append(record)
        d = instance_dict(copy)
        for name, value in instance_dict(obj).items():
            d[name] = _copy_child(value, copies, record)
        record.start = dict(d)
        _currently_initialising.add(copy)
        return copy
    return obj


def _copy_child(value: Any, copies: list[_Copy], parent: _Copy) -> Any:
    """`value` with every module in it copied (editable) and every list and dict in
    it copied, at any depth: an edit never shares a mutable object with the
    original. Tuples holding none of those are shared."""
    if is_module(value):
        n = len(copies)
        copy = _copy_tree(value, copies)
        parent.children.append(copies[n])
        return copy
    t = type(value)
    if t not in _CONTAINERS or (t is tuple and not _holds_mutable(value)):
        return value
    if not _holds_mutable(value):  # a plain list or dict of leaves: one C-level copy
        return value.copy()
    if t is dict:
        return {k: _copy_child(v, copies, parent) for k, v in value.items()}
    return t(_copy_child(v, copies, parent) for v in value)


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
