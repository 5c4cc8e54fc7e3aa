"""Updates: `with_static` / `with_dynamic` (one line, touching only what changes),
and `es.edit` (mutable-looking edits, copied on write). Both end in the same
checks (`_module.convert_and_check`, `run_check_inits`)."""

import functools
import operator
import types
from collections.abc import Collection, Mapping
from typing import Any, Final, Generic, Literal, TypeVar

import equinox as eqx
import jax.tree_util as jtu

from ._compat import currently_initialising
from ._module import (
    convert_and_check,
    Defunct,
    drop_cached,
    editing,
    field_info,
    FieldInfo,
    instance_dict,
    is_module,
    is_module_type,
    run_check_inits,
    unknown_field_error,
)


_M = TypeVar("_M", bound=eqx.Module)
Kind = Literal["static", "dynamic", "any"]


class _Set:
    """A trie leaf: the new value for one path."""

    __slots__ = ("value",)

    def __init__(self, value: object):
        self.value = value


_Trie = dict[str, Any]  # values: a nested `_Trie`, or a `_Set` leaf


def with_static(module: _M, /, **changes: Any) -> _M:
    """Return a copy of `module` with some static fields replaced.

    Static fields are those declared with `eqx.field(static=True)`; they are part of
    the compile key of [`eqx_static.jit`][], so the next compiled call recompiles
    once for each new combination of values.

    **Arguments:**

    - `module`: any `eqx.Module`.
    - `**changes`: field names, or dotted paths into nested modules and sequences
        (`**{"encoder.act": "tanh"}`), mapped to their new values.

    **Returns:**

    A new instance of the same class. `module` is unchanged, and every field not
    named shares its value with `module`. Converters run on the new values, static
    values must be hashable, and the class's `__check_init__` runs on the result.

    !!! example

        ```python
        import equinox as eqx
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

        m = Model(scale=2.0, square=False)
        m2 = es.with_static(m, square=True)
        assert m2.square and not m.square and m2.scale is m.scale
        ```
    """
    return _update(module, changes, "static")


def with_dynamic(module: _M, /, **changes: Any) -> _M:
    """Return a copy of `module` with some dynamic (traced) fields replaced.

    Dynamic fields are traced by [`eqx_static.jit`][], so changing them never
    recompiles, as long as shapes and dtypes stay the same.

    **Arguments:**

    - `module`: any `eqx.Module`.
    - `**changes`: field names, or dotted paths into nested modules and sequences
        (`**{"layers.0.weight": w}`), mapped to their new values.

    **Returns:**

    A new instance of the same class; see [`eqx_static.with_static`][] for the
    guarantees. A value for a field annotated with a jaxtyping array type (such as
    `Float[Array, "3"]`) is checked against its shape and dtype.

    !!! example

        ```python
        import equinox as eqx
        import eqx_static as es

        class Model(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

        m = Model(scale=2.0, square=False)
        assert es.with_dynamic(m, scale=3.0).scale == 3.0
        ```
    """
    return _update(module, changes, "dynamic")


def _update(module: _M, changes: Mapping[str, Any], kind: Kind) -> _M:
    if not is_module(module):
        raise TypeError(
            f"`with_{kind}` takes an `eqx.Module`, got {type(module).__name__}."
        )
    if any("." in k for k in changes):
        return apply_trie(module, _trie(changes), kind, (), kind)
    info = field_info(type(module))  # the common case: fields of `module` itself
    d = instance_dict(module)
    for name, value in changes.items():
        _check_field(info, d, name, kind, (), value)
    return rebuild(module, info, changes, changes)


def _trie(changes: Mapping[str, Any]) -> _Trie:
    root: _Trie = {}
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = root
        for i, seg in enumerate(parents):
            child = node.setdefault(seg, {})
            if isinstance(child, _Set):
                raise _conflict(".".join(parents[: i + 1]), path)
            node = child
        if last in node:  # only a dict can be there: the keys are distinct
            raise _conflict(path, _a_path_inside(path, node[last]))
        node[last] = _Set(value)
    return root


def _a_path_inside(prefix: str, node: "_Trie | _Set") -> str:
    while isinstance(node, dict):
        seg, node = next(iter(node.items()))
        prefix = f"{prefix}.{seg}"
    return prefix


def _conflict(prefix: str, path: str) -> ValueError:
    return ValueError(
        f"Conflicting updates: {path!r} changes inside {prefix!r}, which is also "
        "replaced as a whole. Name either the whole value or the parts inside it."
    )


_OTHER: Final = {"static": "with_dynamic", "dynamic": "with_static"}


def apply_trie(
    obj: Any, trie: _Trie, kind: Kind, path: tuple[str, ...], outer: str
) -> Any:
    """Rebuild `obj` with the changes in `trie`, copying only the nodes on the paths.

    `kind` is what the caller may change; `outer` is the kind of the module field
    that holds `obj`, which is the kind of anything inside a list, tuple or dict."""
    if is_module(obj):
        return _apply_module(obj, trie, kind, path)
    if isinstance(obj, list | tuple | dict):
        return _apply_container(obj, trie, kind, path, outer)
    seg = next(iter(trie))
    shape = getattr(obj, "shape", None)
    what = (
        f"a {obj.dtype}{list(shape)} array"  # pyright: ignore[reportAttributeAccessIssue]
        if shape is not None and hasattr(obj, "dtype")
        else f"a {type(obj).__name__}"
    )
    raise TypeError(
        f"Cannot follow path segment {seg!r} at {'.'.join(path)!r}: the value there "
        f"is {what}, not a module, list, tuple or dict."
    )


def _apply_module(obj: eqx.Module, trie: _Trie, kind: Kind, path: tuple) -> Any:
    info = field_info(type(obj))
    d = instance_dict(obj)
    values, direct = {}, set()
    for seg, sub in trie.items():
        if isinstance(sub, _Set):
            _check_field(info, d, seg, kind, path, sub.value)
            values[seg] = sub.value
            direct.add(seg)
        else:
            _check_field(info, d, seg, "any", path, None)
            field_kind = "static" if seg in info.static else "dynamic"
            values[seg] = apply_trie(d[seg], sub, kind, (*path, seg), field_kind)
    return rebuild(obj, info, values, direct)


def rebuild(
    obj: eqx.Module, info: FieldInfo, values: Mapping[str, Any], direct: Collection[str]
) -> Any:
    """A copy of `obj` with `values` set: converters for the `direct` ones, checks
    for all, then the class's own `__check_init__` and field type checks."""
    old = instance_dict(obj)
    values = convert_and_check(info, values, direct, old)
    new = object.__new__(info.cls)
    d = instance_dict(new)
    d.update(old)
    d.update(values)
    drop_cached(d, info)
    run_check_inits(info, new)
    return new


def _check_field(
    info: FieldInfo, d: dict, name: str, kind: Kind, path: tuple, value: Any
) -> None:
    """Whether the helper `with_<kind>` takes the field `name`: `with_static` a
    declared static field, or a dynamic one holding what `es.jit` keys statically
    (a Python bool, a string, a function: a non-array leaf); `with_dynamic` a
    dynamic field. The error says what the field holds and which helper takes it."""
    if name not in info.static and name not in info.dynamic:
        takes = [n for n in info.names if kind == "any" or _takes(info, d, n, kind)]
        raise unknown_field_error(
            info.cls, name, takes, None if kind == "any" else f"with_{kind}"
        )
    if kind == "any" or _takes(info, d, name, kind):
        if kind == "static" and name in info.dynamic and not _leaf(value):
            raise TypeError(_leaf_message(info.cls, name, d[name], value, path))
        return
    full = ".".join((*path, name))
    call = f"**{{{full!r}: ...}}" if path else f"{full}=..."
    if name in info.static:
        what = "static field", "declared `eqx.field(static=True)`"
    else:
        what = "dynamic field", f"holding {_describe(d.get(name))}, traced by `es.jit`"
    raise TypeError(
        f"`with_{kind}` got {full!r}, but {name!r} is a {what[0]} of "
        f"`{info.cls.__qualname__}` ({what[1]}). Use `{_OTHER[kind]}({call})` "
        "instead (or `es.edit`, which takes both kinds)."
    )


def _takes(info: FieldInfo, d: dict, name: str, kind: Kind) -> bool:
    if kind == "dynamic":
        return name in info.dynamic
    return name in info.static or _leaf(d.get(name))


def _leaf(v: Any) -> bool:
    """A value `es.jit` keys statically: not an array, module or container."""
    return not (isinstance(v, list | tuple | dict) or is_module(v) or eqx.is_array(v))


def _describe(v: Any) -> str:
    if eqx.is_array(v):
        return "an array"
    return "a module" if is_module(v) else f"a {type(v).__name__}"


def _leaf_message(cls: type, name: str, old: Any, new: Any, path: tuple) -> str:
    full = ".".join((*path, name))
    return (
        f"`with_static` got {full!r}: the dynamic field {name!r} of "
        f"`{cls.__qualname__}` holds a Python {type(old).__name__}, which `es.jit` "
        f"keys statically, and `with_static` replaces it with another such value; "
        f"got {_describe(new)}. To store data there, use `with_dynamic`."
    )


def _apply_container(obj: Any, trie: _Trie, kind: Kind, path: tuple, outer: str) -> Any:
    items = dict(obj) if isinstance(obj, dict) else list(obj)
    segs: dict[Any, str] = {}
    for seg, sub in trie.items():
        key = _container_key(obj, seg, path)
        if key in segs:  # such as "layers.0" and "layers.-2" into a 2-list
            raise _same_item(path, segs[key], seg)
        segs[key] = seg
        if isinstance(sub, _Set):
            static_leaf = kind == "static" and _leaf(items[key]) and _leaf(sub.value)  # pyright: ignore[reportArgumentType,reportCallIssue]
            if kind not in ("any", outer) and not static_leaf:
                raise _container_kind_error(kind, outer, (*path, seg))
            items[key] = sub.value  # pyright: ignore[reportArgumentType,reportCallIssue]
        else:
            child = items[key]  # pyright: ignore[reportArgumentType,reportCallIssue]
            new = apply_trie(child, sub, kind, (*path, seg), outer)
            items[key] = new  # pyright: ignore[reportArgumentType,reportCallIssue]
    if isinstance(obj, dict):
        return type(obj)(items) if type(obj) is not dict else items
    if isinstance(obj, list):
        return items if type(obj) is list else type(obj)(items)
    if hasattr(obj, "_make"):  # namedtuple
        return type(obj)._make(items)  # pyright: ignore[reportAttributeAccessIssue]
    return type(obj)(items)


def _same_item(path: tuple, seg1: str, seg2: str) -> ValueError:
    where = ".".join(path)
    return ValueError(
        f"Conflicting updates: segments {seg1!r} and {seg2!r} both name the same "
        f"item of {where!r}. Name each item once."
    )


def _container_kind_error(kind: Kind, outer: str, path: tuple) -> TypeError:
    full = ".".join(path)
    return TypeError(
        f"`with_{kind}` got {full!r}, which lies inside a {outer} field. Use "
        f"`{_OTHER[kind]}` for it instead (or `es.edit`, which takes both kinds)."
    )


def _container_key(obj: Any, seg: str, path: tuple) -> Any:
    where = ".".join((*path, seg))
    if isinstance(obj, dict):
        if seg in obj:
            return seg
        found = [k for k in obj if str(k) == seg]  # `"by_id.0"` finds the key `0`
        if len(found) == 1:
            return found[0]
        raise KeyError(
            f"No key {seg!r} at {where!r}; the keys are {list(obj)!r}."
            if not found
            else f"Path segment {seg!r} at {where!r} names several keys: {found!r}."
        )
    if hasattr(obj, "_fields") and seg in obj._fields:
        return obj._fields.index(seg)
    try:
        index = int(seg)
    except ValueError:
        index = None
    if index is None or not -len(obj) <= index < len(obj):
        raise IndexError(
            f"Path segment {seg!r} at {where!r} is not a valid index into a "
            f"{type(obj).__name__} of length {len(obj)}."
        ) from None
    return index % len(obj)


# ----------------------------------------------------------------------------------
# `es.edit`.


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
# when the field is first read (`es.Module.__getattribute__` calls `materialise`
# through `_module.editing`), and a tuple or list of them copies an item when the
# item is first read. Copies of other modules, whose reads cannot be seen, copy
# their contents on creation.
def materialise(record: _Copy, copy: Any, name: str) -> None:
    """Copy what the field `name` of the editable `copy` holds, before it is read
    (every field, for `__dict__`)."""
    if record.copy is not copy:
        return
    names = list(record.pending) if name == "__dict__" else [name]
    d = instance_dict(copy)
    for k in names:
        if k in record.pending:
            record.pending.discard(k)
            d[k] = record.start[k] = _copy_child(d[k], record)
    if not record.pending:
        editing.pop(id(copy), None)


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
                currently_initialising.remove(c.copy)
                editing.pop(id(c.copy), None)
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
            editing[id(copy)] = functools.partial(materialise, record)
    else:
        for name, value in od.items():
            d[name] = _copy_child(value, record)
    record.start = dict(d)
    currently_initialising.add(copy)
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
