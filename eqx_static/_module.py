"""`es.Module`: an `eqx.Module` whose static fields are checked and easy to update."""

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any, TYPE_CHECKING, TypeVar

import equinox as eqx
import jax
from jax.core import Tracer

from ._bound import bound_method, BoundJit
from ._compat import currently_initialising
from ._edit import _lazy as edited, materialise
from ._fields import field_info, instance_dict, unknown_field_error
from ._typecheck import check_fields, set_option, Typechecker
from ._update import with_dynamic as _with_dynamic, with_static as _with_static
from ._validate import as_data, convert_and_check, default_dtype


_F = TypeVar("_F", bound=Callable[..., Any])
_Self = TypeVar("_Self", bound="Module")


class _PartialMethod:
    """Binds a function to an instance with `functools.partial`.

    A plain method read off an `eqx.Module` instance becomes an Equinox
    `BoundMethod`, whose construction walks every leaf of the module; a partial
    keeps `module.with_dynamic(...)` O(1) in the size of the model."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., Any]:
        return self.fn if obj is None else functools.partial(self.fn, obj)


class _Number:
    """Shows a 0-d concrete array of JAX's default dtype for its kind (a stored
    Python number, or one that looks exactly like it) as the number."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)

    @staticmethod
    def of(x: Any) -> Any:
        if (
            isinstance(x, jax.Array)
            and not isinstance(x, Tracer)
            and x.ndim == 0
            and x.dtype in _number_dtypes()
        ):
            return _Number(x.item())
        return x


def _number_dtypes() -> tuple:  # read each time: x64 may change
    return tuple(default_dtype(t) for t in (bool, int, float, complex))


class Module(eqx.Module):
    """An `eqx.Module` whose fields are static or dynamic by declaration, with
    checked static fields and one-line updates.

    A field is static if and only if it is declared `eqx.field(static=True)`. Every
    other field is dynamic: data. A Python `bool`/`int`/`float`/`complex` that lands
    in a dynamic field (in `__init__`, as a default, through a converter or an
    update), also inside plain tuples, lists and dicts, is stored as a 0-d JAX
    array of JAX's default dtype for its kind (`float32`, `int32`, `bool`,
    `complex64`), strongly typed, as an optimiser step or deserialisation gives it
    back. So eager code sees what compiled code sees, and [`eqx_static.jit`][]
    (like `eqx.filter_jit`) traces it: changing it never recompiles. A plain default
    that a custom `__init__` leaves unset is set, as a dataclass's `__init__` would
    (a subclass's class attribute or a property is left to be read). The
    consequence to know: a dynamic field is data, so `eqx.filter_grad`
    differentiates it and optax updates it. To keep a number fixed in training,
    keep it out of the optimiser (a filter spec, or `optax.multi_transform` with
    `optax.set_to_zero()`), or declare it static (one compile per value).

    Everything Equinox offers keeps working: custom `__init__`, `__check_init__`,
    converters, abstract fields, `eqx.tree_at`, serialisation, `eqx.filter_*` and
    `eqx.filter_vmap`-stacked ensembles. On top of that:

    - at construction, every static field (`eqx.field(static=True)`) must hold a
        hashable value, because static values key the compilation cache of
        [`eqx_static.jit`][], and a dynamic field annotated with a jaxtyping array
        type must match it (dtype, shape), the same checks as on updates;
    - `module.with_static(**changes)` and `module.with_dynamic(**changes)` return
        updated copies (see [`eqx_static.with_static`][]);
    - with the class option `typecheck=True` (beartype; or `typecheck=<a
        typechecker>`), every annotated field is type-checked in one jaxtyping
        scope at construction, on `with_static`/`with_dynamic` and on exit from
        [`eqx_static.edit`][], so that named dimensions bind across fields.

    !!! example

        ```python
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        import eqx_static as es

        class Scaler(es.Module):
            scale: float
            square: bool = eqx.field(static=True)

            @es.jit
            def __call__(self, x):
                return self.scale * (x**2 if self.square else x)

        s = Scaler(scale=2.0, square=False)
        assert isinstance(s.scale, jax.Array) and s.scale.dtype == jnp.float32
        print(s)                                  # Scaler(scale=2.0, square=False)
        assert s(jnp.array(3.0)) == 6.0
        assert s.with_static(square=True)(jnp.array(3.0)) == 18.0
        assert s.with_dynamic(scale=1.0)(jnp.array(3.0)) == 3.0
        ```

    !!! example "Shape errors caught on construction, on update, and on first call"

        ```python
        import beartype
        import jax.numpy as jnp
        import pytest
        from jaxtyping import Array, Float, TypeCheckError, jaxtyped
        import eqx_static as es

        class Affine(es.Module, typecheck=True):
            w: Float[Array, "n m"]
            b: Float[Array, " n"]

            @es.jit
            @jaxtyped(typechecker=beartype.beartype)
            def __call__(self, x: Float[Array, " m"]) -> Float[Array, " n"]:
                return self.w @ x + self.b

        with pytest.raises(TypeError, match="disagree on dimension 'n'"):
            Affine(jnp.ones((2, 3)), jnp.zeros(4))          # construction

        a = Affine(jnp.ones((2, 3)), jnp.zeros(2))
        with pytest.raises(TypeError, match="disagree on dimension 'n'"):
            a.with_dynamic(b=jnp.zeros(5))                  # update

        with pytest.raises(TypeCheckError):
            a(jnp.ones((3, 1)))                             # first call (traced)
        assert a(jnp.ones(3)).shape == (2,)                 # later hits: no check
        ```
    """

    def __init_subclass__(
        cls, *, typecheck: "bool | Typechecker | None" = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if typecheck is not None:
            set_option(cls, typecheck)

    def __check_init__(self) -> None:
        # At construction only; updates run the same field checks on what they
        # change. Runs last among the `__check_init__`s, after the converters (which
        # Equinox has applied). A field that a custom `__init__` left unset gets its
        # plain default, as a dataclass's own `__init__` would set it; one that reads
        # as something else (a subclass's attribute, a property) is left unset.
        info = field_info(type(self))
        d = instance_dict(self)
        for name, default in info.defaults.items():
            d.setdefault(name, default)
        d.update(convert_and_check(info, {n: d[n] for n in info.names if n in d}, ()))
        check_fields(self)

    def __repr__(self) -> str:
        # A number stored as a 0-d array shows as the number: `Model(scale=2.0)`.
        return eqx.tree_pformat(jax.tree.map(_Number.of, self))

    __check_init__._es_construction_only = True  # pyright: ignore[reportFunctionMemberAccess]

    if not TYPE_CHECKING:

        def __getattribute__(self, name: str, /) -> Any:
            # Equinox's own `__getattribute__`, plus: a copy discarded by a failed
            # `es.edit` refuses every read, an `es.edit` copy copies on write, and a
            # bound method is made without Equinox's walk over every leaf.
            d = instance_dict(self)
            if type(d) is not dict:  # a failed edit's copy: raises, saying why
                d.on_read(name)  # pyright: ignore[reportAttributeAccessIssue]
            if edited and id(self) in edited:  # an `es.edit` copy: copy on write
                materialise(self, name)
            if name == "__dict__":  # Equinox's flatten, on every `jax.tree.map`
                return d
            out = object.__getattribute__(self, name)
            if type(out) is types.MethodType and out.__self__ is self:
                func = out.__func__
                if not (name.startswith("__") and name.endswith("__")):
                    if name != "_abc_impl":
                        return bound_method(func, self)
                elif hasattr(func, "es_jit"):  # an installed `es.jit` special method
                    return BoundJit(func, self)
            return out

        def __setattr__(self, name: str, value: Any) -> None:
            info = field_info(type(self))
            if name in info.dynamic:
                # A converter sees the value as given; `__check_init__` stores its
                # result. (Outside `__init__` and `es.edit`, Equinox refuses below.)
                if name not in info.converters and self in currently_initialising:
                    value = as_data(info.cls, name, value)
                return super().__setattr__(name, value)
            if name in info.static or name.startswith("__"):
                return super().__setattr__(name, value)
            # Equinox would say only "cannot assign to field"; say which fields exist.
            hint = unknown_field_error(info.cls, name, info.names)
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: {hint} Only fields can be assigned, "
                "in `__init__` or inside `es.edit`."
            )

    if TYPE_CHECKING:

        def with_static(self: _Self, **changes: Any) -> _Self:
            """Return a copy with some static fields replaced; see `es.with_static`."""
            ...

        def with_dynamic(self: _Self, **changes: Any) -> _Self:
            """Return a copy with some dynamic fields replaced; see `es.with_dynamic`."""
            ...

    else:
        # Aliased imports: in a class body, a bare `with_static` reads as the method.
        with_static = _PartialMethod(_with_static)
        with_dynamic = _PartialMethod(_with_dynamic)
