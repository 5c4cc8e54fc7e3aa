"""`with_static` / `with_dynamic`: one-line updates that touch only what changes."""

from collections.abc import Collection, Mapping
from typing import Any, Final, Literal, TypeVar

import equinox as eqx

from ._fields import (
    drop_cached,
    field_info,
    FieldInfo,
    instance_dict,
    is_module,
    unknown_field_error,
)
from ._validate import convert_and_check, run_check_inits


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
    for name in changes:
        _check_field(info, name, kind, ())
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
    values, direct = {}, set()
    for seg, sub in trie.items():
        if isinstance(sub, _Set):
            _check_field(info, seg, kind, path)
            values[seg] = sub.value
            direct.add(seg)
        else:
            _check_field(info, seg, "any", path)
            field_kind = "static" if seg in info.static else "dynamic"
            child = instance_dict(obj)[seg]
            values[seg] = apply_trie(child, sub, kind, (*path, seg), field_kind)
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


def _check_field(info: FieldInfo, name: str, kind: Kind, path: tuple) -> None:
    if name in info.static:
        _check_kind(info.cls, name, "static", kind, path)
    elif name not in info.dynamic:
        raise unknown_field_error(info.cls, name, info.names)
    else:
        _check_kind(info.cls, name, "dynamic", kind, path)


def _check_kind(cls: type, name: str, field_kind: str, kind: Kind, path: tuple):
    if kind == "any" or field_kind == kind:
        return
    full = ".".join((*path, name))
    call = f"**{{{full!r}: ...}}" if path else f"{full}=..."
    raise TypeError(
        f"`with_{kind}` got {full!r}, but {name!r} is a {field_kind} field of "
        f"`{cls.__qualname__}`. Use `{_OTHER[kind]}({call})` instead (or "
        "`es.edit`, which takes both kinds)."
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
            if kind not in ("any", outer):
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
