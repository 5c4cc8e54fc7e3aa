"""Updates: `with_static` / `with_dynamic` (one line, touching only what changes) and
`es.edit` (mutable-looking edits, copied on write), both ending in the checks of
`_module.convert_and_check` and `run_check_inits`."""

import functools
import operator
import types
from collections.abc import Collection, Mapping
from typing import Any, cast, Final, Generic, Literal, NamedTuple, NoReturn, TypeVar

import equinox as eqx
import jax.tree_util as jtu

from ._fields import field_info, FieldInfo, instance_dict, is_module, is_module_type
from ._jax import allow_assignments, forbid_assignments
from ._module import (
    CONTAINERS,
    convert_and_check,
    provide_updates,
    run_check_inits,
    unknown_field_error,
    unwatch,
    watch_reads,
)


_M = TypeVar("_M", bound=eqx.Module)
Kind = Literal["static", "dynamic", "any"]
_OTHER: Final = {"static": "with_dynamic", "dynamic": "with_static"}


class _Set(NamedTuple):
    """A leaf of a trie of dotted paths (dicts of segments): one path's new value."""

    value: Any


def with_static(module: _M, /, **changes: Any) -> _M:
    """Return a copy of `module` with some static fields replaced.

    Static fields, declared `eqx.field(static=True)`, key the compile cache of
    [`eqx_static.jit`][]: the next call compiles once per new combination of values.

    **Arguments:**

    - `module`: any `eqx.Module`.
    - `**changes`: field names, or dotted paths into nested modules and sequences
        (`**{"encoder.act": "tanh"}`), mapped to their new values.

    **Returns:**

    A new instance of the same class, sharing every field not named with `module`,
    which is unchanged. Converters run on the new values, static values must be
    hashable, and the class's `__check_init__` runs on the result.

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

    [`eqx_static.jit`][] traces dynamic fields: changing them never recompiles while
    shapes and dtypes stay the same. Arguments, result and checks are those of
    [`eqx_static.with_static`][]; in addition, a value for a field annotated with a
    jaxtyping array type (such as `Float[Array, "3"]`) must match it.

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


def _trie(changes: Mapping[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = root
        for i, seg in enumerate(parents):
            node = node.setdefault(seg, {})
            if isinstance(node, _Set):
                raise _conflict(".".join(parents[: i + 1]), path)
        if last in node:  # a dict (the paths are distinct): name a path inside it
            raise _conflict(path, next(p for p in changes if p.startswith(f"{path}.")))
        node[last] = _Set(value)
    return root


def _conflict(prefix: str, path: str) -> ValueError:
    return ValueError(
        f"Conflicting updates: {path!r} changes inside {prefix!r}, which is also "
        "replaced as a whole. Name either the whole value or the parts inside it."
    )


def apply_trie(obj: Any, trie: dict, kind: Kind, path: tuple, outer: str) -> Any:
    """Rebuild `obj` with the changes in `trie`, copying only the nodes on the paths.
    `kind` is what the caller may change; `outer`, the kind of the module field that
    holds `obj`, is the kind of anything inside a list, tuple or dict."""
    if is_module(obj):
        info, d = field_info(type(obj)), instance_dict(obj)
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
    if not isinstance(obj, list | tuple | dict):
        shape = getattr(obj, "shape", None)
        what = (
            f"a {obj.dtype}{list(shape)} array"
            if shape is not None and hasattr(obj, "dtype")
            else f"a {type(obj).__name__}"
        )
        raise TypeError(
            f"Cannot follow path segment {next(iter(trie))!r} at {'.'.join(path)!r}: "
            f"the value there is {what}, not a module, list, tuple or dict."
        )
    items: Any = dict(obj) if isinstance(obj, dict) else list(obj)
    segs: dict[Any, str] = {}
    for seg, sub in trie.items():
        key = _container_key(obj, seg, path)
        if key in segs:  # such as "layers.0" and "layers.-2" into a 2-list
            raise ValueError(
                f"Conflicting updates: segments {segs[key]!r} and {seg!r} both name "
                f"the same item of {'.'.join(path)!r}. Name each item once."
            )
        segs[key] = seg
        if not isinstance(sub, _Set):
            items[key] = apply_trie(items[key], sub, kind, (*path, seg), outer)
        elif kind == outer or (
            kind == "static" and _leaf(items[key]) and _leaf(sub.value)
        ):
            items[key] = sub.value
        else:
            raise TypeError(
                f"`with_{kind}` got {'.'.join((*path, seg))!r}, which lies inside a "
                f"{outer} field. Use `{_OTHER[kind]}` for it instead (or `es.edit`, "
                "which takes both kinds)."
            )
    t: Any = type(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_make"):  # a named tuple
        return t._make(items)
    return items if t is dict or t is list else t(items)


def _container_key(obj: Any, seg: str, path: tuple) -> Any:
    where = ".".join((*path, seg))
    if isinstance(obj, dict):
        found = [seg] if seg in obj else [k for k in obj if str(k) == seg]
        if len(found) == 1:  # `"by_id.0"` finds the key `0`
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
        index = len(obj)  # out of range
    if not -len(obj) <= index < len(obj):
        raise IndexError(
            f"Path segment {seg!r} at {where!r} is not a valid index into a "
            f"{type(obj).__name__} of length {len(obj)}."
        )
    return index % len(obj)


def rebuild(
    obj: eqx.Module, info: FieldInfo, values: Mapping[str, Any], direct: Collection[str]
) -> Any:
    """A copy of `obj` with `values` set, converted if `direct`, and checked."""
    old = instance_dict(obj)
    values = convert_and_check(info, values, direct, old)
    new = object.__new__(info.cls)
    instance_dict(new).update(old, **values)
    run_check_inits(info, new)
    return new


def _check_field(
    info: FieldInfo, d: dict, name: str, kind: Kind, path: tuple, value: Any
) -> None:
    """Raise unless `with_<kind>` takes the field `name`: `with_static` a static
    field, or a dynamic one holding a leaf that `es.jit` keys statically (a Python
    bool, a string, a function) for another such; `with_dynamic` a dynamic field."""
    if name not in info.static and name not in info.dynamic:
        takes = [n for n in info.names if _takes(info, d, n, kind)]
        helper = None if kind == "any" else f"with_{kind}"
        raise unknown_field_error(info.cls, name, takes, helper)
    if _takes(info, d, name, kind):
        if not (kind == "static" and name in info.dynamic and not _leaf(value)):
            return
        raise TypeError(
            f"`with_static` got {'.'.join((*path, name))!r}: the dynamic field "
            f"{name!r} of `{info.cls.__qualname__}` holds a Python "
            f"{type(d[name]).__name__}, which `es.jit` keys statically, and "
            "`with_static` replaces it with another such value; got "
            f"{_kind_of(value)}. To store data there, use `with_dynamic`."
        )
    cls, full = info.cls.__qualname__, ".".join((*path, name))
    call = f"**{{{full!r}: ...}}" if path else f"{full}=..."
    if name in info.static:
        what = "static field", "declared `eqx.field(static=True)`"
    else:
        what = "dynamic field", f"holding {_kind_of(d.get(name))}, traced by `es.jit`"
    raise TypeError(
        f"`with_{kind}` got {full!r}, but {name!r} is a {what[0]} of `{cls}` "
        f"({what[1]}). Use `{_OTHER[kind]}({call})` instead (or `es.edit`, which "
        "takes both kinds)."
    )


def _takes(info: FieldInfo, d: dict, name: str, kind: Kind) -> bool:
    if kind == "dynamic":
        return name in info.dynamic
    return kind == "any" or name in info.static or _leaf(d.get(name))


def _leaf(v: Any) -> bool:
    """A value `es.jit` keys statically: not an array, module or container."""
    return not (isinstance(v, list | tuple | dict) or is_module(v) or eqx.is_array(v))


def _kind_of(v: Any) -> str:
    """The kind of `v`, with its article: "an array", "a module", "a float"."""
    if eqx.is_array(v):
        return "an array"
    return "a module" if is_module(v) else f"a {type(v).__name__}"


# `es.edit`: copy on write. A copy of an `es.Module` copies the modules and mutable
# containers a field holds when the field is first read (`es.Module.__getattribute__`
# calls `materialise`); a tuple or list of them, an item when it is first read. A
# copy of another module, whose reads cannot be seen, copies them at once.


class _Copy:
    """An editable copy of one module, with the field values it started from."""

    __slots__ = ("children", "copies", "copy", "original", "pending", "start")

    def __init__(self, original: eqx.Module, copy: eqx.Module, copies: list):
        self.original, self.copy = original, copy
        self.copies = copies  # every copy of the edit
        self.start: dict[str, Any] = {}  # the copy's fields as made, set once made
        self.children: list[_Copy] = []  # copies made of modules inside it
        self.pending: set[str] = set()  # fields that still hold the original's value


def materialise(record: _Copy, copy: Any, name: str) -> None:
    """Copy what the field `name` (all, for `__dict__`) holds, before it is read."""
    if record.copy is not copy:
        return
    d = instance_dict(copy)
    for k in list(record.pending) if name == "__dict__" else [name]:
        if k in record.pending:
            record.pending.discard(k)
            d[k] = record.start[k] = _copy_child(d[k], record)
    if not record.pending:
        unwatch(copy)


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
        return cast(_M, _copy_module(self._module, self._copies).copy)

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
                forbid_assignments(c.copy)
                unwatch(c.copy)
                if not ok:  # nothing is produced: make any use of the copy fail
                    _DICT.__set__(c.copy, Defunct(type(c.copy).__qualname__))


def _copy_module(obj: Any, copies: list[_Copy]) -> _Copy:
    """An editable copy of the module `obj` (see above), recorded in `copies`."""
    copy = object.__new__(type(obj))
    record = _Copy(obj, copy, copies)
    copies.append(record)
    d, od = instance_dict(copy), instance_dict(obj)
    if field_info(type(obj)).stores_arrays:
        d.update(od)
        record.pending = {
            k for k, v in od.items() if type(v) in CONTAINERS or is_module_type(type(v))
        }
        if record.pending:
            watch_reads(copy, functools.partial(materialise, record))
    else:
        d.update({k: _copy_child(v, record) for k, v in od.items()})
    record.start = dict(d)
    allow_assignments(copy)
    return record


def _copy_child(value: Any, parent: _Copy) -> Any:
    """`value`, sharing nothing mutable with the original: a module is copied; a list
    or tuple holding modules or containers copies an item when it is read; a dict or
    a list of leaves is copied now; a tuple holding nothing mutable is shared."""
    if is_module(value):
        record = _copy_module(value, parent.copies)
        parent.children.append(record)
        return record.copy
    t = type(value)
    if t is dict:
        return {k: _copy_child(v, parent) for k, v in value.items()}
    if t is not tuple and t is not list:
        return value
    if _holds_mutable(value):
        return (_EditTuple if t is tuple else _EditList)(value, parent)
    return value if t is tuple else value.copy()  # a list of leaves: copied in C


def _holds_mutable(value: Any) -> bool:
    """Whether a tuple or list holds modules, lists or dicts at any depth (looking at
    the distinct item types first: a tuple of 10,000 arrays is one type)."""
    kinds = set(map(type, value))
    if any(is_module_type(k) or k is list or k is dict for k in kinds):
        return True
    return tuple in kinds and any(_holds_mutable(x) for x in value if type(x) is tuple)


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

    def __getitem__(self, i: Any) -> Any:  # pyright: ignore
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

    def __getitem__(self, i: Any) -> Any:  # pyright: ignore
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        item = list.__getitem__(self, i)
        if id(item) not in self.originals:
            return item
        copy = _copy_child(item, self.parent)
        if copy is not item:
            list.__setitem__(self, i, copy)
        return copy

    def __iter__(self) -> Any:
        return (self[j] for j in range(len(self)))

    def pop(self, i: Any = -1) -> Any:  # pyright: ignore
        item = self[i]
        list.__delitem__(self, i)
        return item


# Inside the block, JAX sees them as the tuple and list they stand for.
jtu.register_pytree_node(
    _EditTuple,
    lambda t: (tuple(t), None),  # pyright: ignore
    lambda _, c: tuple(c),
)
jtu.register_pytree_node(
    _EditList,
    lambda t: (list(t), None),  # pyright: ignore
    lambda _, c: list(c),
)


def _freeze(record: _Copy) -> bool:
    """Validate the copy bottom-up; return whether anything in it changed. Unchanged
    nested copies are swapped back for their originals, so that the result shares
    every unchanged subtree with the module that was edited."""
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
        run_check_inits(info, record.copy)
    return changed


def _restore(value: Any, originals: dict[int, Any], original: Any) -> Any:
    """`value` with unchanged copies replaced by their originals; `original` itself
    if that leaves every item of `value` the same as the item of `original`."""
    if is_module(value):
        return originals.get(id(value), value)
    if type(value) is _EditTuple:  # only the items read can differ
        source = value.source
        new = {j: _restore(x, originals, source[j]) for j, x in value.made.items()}
        if all(new[j] is source[j] for j in new):
            return source
        return tuple(new.get(j, x) for j, x in enumerate(source))
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
    restored = [_restore(value[k], originals, o) for k, o in zip(keys, olds)]
    if same and all(map(operator.is_, restored, olds)):
        return original
    return dict(zip(keys, restored)) if t is dict else t(restored)


# The C-level `__dict__` descriptor, to give a discarded copy a `Defunct` one.
_DICT: Final = eqx.Module.__dict__["__dict__"]


provide_updates(with_static, with_dynamic)
