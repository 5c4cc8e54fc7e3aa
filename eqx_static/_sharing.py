"""When two keys' programs are provably one program, so that one executable serves
both: by an allow-list of what is known, never by comparing values that could
change later.

Two lowerings are one program when they have the same module (constants in full,
large ones by their bytes' digest; source locations left out; private functions
named by what they compute), the same compile arguments (each one on the list
below, compared as that kind of value; an argument not on the list makes a
program unshareable), and the same host
callbacks, in order: each the *identical* Python function over argument structures
equal as keys compare them. What runs Python on the host is read from the traced
jaxpr, which holds it on every platform (a TPU's lowering holds only opaque
objects): each `pure_callback` or `io_callback` equation JAX lowers, and together
exactly as many as the lowering holds. Anything else (`jax.debug.print`, checkify,
an ordered effect, a primitive this module does not know) makes a program
unshareable, and may be Equinox's error check: such a program is waited for."""

import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from . import _jax
from ._fields import token


class Fingerprint(NamedTuple):
    """What decides whether two lowerings are one program."""

    digest: bytes  # the module, named canonically, constants in full, no locations
    arguments: tuple  # the allow-listed compile arguments
    callbacks: tuple  # (function, `in_tree` token) per host callback, kept alive


# Every compile argument of JAX 0.8 - 0.12 (`tests/canary/test_jax_lowering.py`):
# those compared with `==` (`spmd_lowering`: 0.8); those shareable only when empty
# or None; and debug information, not part of what runs (`host_callbacks`: read
# from the jaxpr, compared one by one).
_SAME: Final = frozenset(
    "backend committed context_mesh global_in_avals global_out_avals in_layouts "
    "out_layouts in_shardings out_shardings intermediate_shardings kept_var_idx "
    "num_devices tuple_args unordered_effects donated_invars compiler_options_kvs "
    "device_list platforms shape_poly_state auto_spmd_lowering pmap_nreps "
    "spmd_lowering".split()
)
_EMPTY: Final = frozenset("ordered_effects mut keepalive".split())
_IGNORED: Final = frozenset("all_args_info pgle_profiler host_callbacks".split())
_ARGUMENTS: Final = _SAME | _EMPTY | _IGNORED


def host_callbacks(lowering: Any, jaxpr: Any) -> tuple[tuple | None, bool]:
    """(function, `in_tree` token) of each host callback of a lowering, read from
    the jaxpr it was lowered from, or None unless every host callback is so
    accounted for (`jax.debug.print`, checkify, a kind JAX adds later are not);
    and whether the program may then hold Equinox's error check, which may raise
    only as its results are waited for."""
    found = None if lowering is None else _jax.callbacks_in(jaxpr)
    held = None if found is None else _jax.compile_arguments(lowering)["host_callbacks"]
    if found is None or len(found) != len(held or ()):
        return None, True
    try:
        callbacks = tuple((function, token(tree)) for function, tree in found)
    except TypeError:  # an `in_tree` that cannot be a key
        return None, True
    checks = (getattr(f, "__module__", None) == _jax.ERROR_CHECKS for f, _ in found)
    return callbacks, any(checks)


def fingerprint(
    lowering: Any, callbacks: tuple | None
) -> "Callable[[], Fingerprint | None] | None":
    """None if the program is not one this module can prove the same as another,
    by its compile arguments or `callbacks` (its `host_callbacks`); else what
    computes its fingerprint (None if its module has no digest): the module's
    digest is the cost, paid once another program may be the same."""
    if lowering is None or callbacks is None or not _jax.SHARING:
        return None
    compared = []
    # Sorted by name: names are distinct, so no two values are compared.
    for name, value in sorted(_jax.compile_arguments(lowering).items()):
        if name == "shape_poly_state":  # compared by what it says (by identity in JAX)
            try:
                dims = tuple(value.dim_vars)
                value = (dims, value.uses_dim_vars, value.has_platform_index_argument)
            except AttributeError:
                value = None
        if name in _SAME and value is not None:
            compared.append((name, value))
        elif name not in _IGNORED and (name not in _EMPTY or value):
            return None  # unknown, None, an ordered effect, a mutable array, ...
    arguments = tuple(compared)

    def computed() -> Fingerprint | None:
        program = digest(lowering.stablehlo())
        return None if program is None else Fingerprint(program, arguments, callbacks)

    return computed


def same_program(a: Fingerprint, b: Fingerprint) -> bool:
    """Each callback the identical function over equal argument structures: both
    keys then run the same Python. (Equinox's `error_if` stages one callback object
    per set of messages, from its own jitted helper, so its programs pass this too.)"""
    if a.digest != b.digest or len(a.callbacks) != len(b.callbacks):
        return False
    try:
        same = a.arguments == b.arguments
    except Exception:  # a comparison that cannot be made: not the same
        return False
    pairs = zip(a.callbacks, b.callbacks)
    return same and all(fa is fb and ta == tb for (fa, ta), (fb, tb) in pairs)


# ----------------------------------------------------------------------------------
# The module text, canonical. JAX may emit one private function twice under two
# names, depending on what the process traced before (jax#40312): each function is
# named by a hash of its text, with the names it calls so replaced, so that whether
# two programs are one depends on the programs only, the same on every process.

# A constant as printed: in full, or elided (a large one that is not a splat).
_CONSTANT: Final = re.compile(rb"dense(?:_resource)?<[^>]*>")
# A symbol (`@name`, `@"name"`), or a string literal, matched whole so that a symbol
# inside one is not: the printer escapes quotes in strings, which never span lines.
_SYMBOL: Final = re.compile(rb'"[^"\n]*"|@([A-Za-z_$.][\w$.\-]*|"[^"\n]*")')
_ASM: Final = {"binary": True, "enable_debug_info": False, "large_elements_limit": None}


def structure(module: Any) -> bytes:
    """A digest of an MLIR module (a lowering's `stablehlo()`) with its constants
    masked (their types kept) and source locations left out: printed with large
    constants elided, so that their values are neither printed nor hashed."""
    text = module.operation.get_asm(**_ASM | {"large_elements_limit": 0})
    return hashlib.sha256(_CONSTANT.sub(b"dense<>", text)).digest()


def digest(module: Any) -> bytes | None:
    """A digest of the module: its attributes (not its name), its public functions
    by name, every private one by what it computes. None for a module of a form JAX
    does not emit (a top-level operation without a name, functions that call each
    other in a cycle, which XLA cannot run): such a program is not shared."""
    module.operation.verify()  # once: each function below is printed unverified
    top, texts, public = hashlib.sha256(), {}, []
    attributes = module.operation.attributes
    for i in range(len(attributes)):
        if attributes[i].name != "sym_name":  # the program's name: the function's
            top.update(f"{attributes[i].name}={attributes[i].attr}\0".encode())
    for op in module.body.operations:
        attrs = op.operation.attributes
        if "sym_name" not in attrs:
            return None
        name = _jax.string_value(attrs["sym_name"]).encode()
        texts[name] = _text(op.operation)
        # A symbol that is not a function (`sdy.mesh`) has no visibility: public.
        visibility = attrs["sym_visibility"] if "sym_visibility" in attrs else None
        if visibility is None or _jax.string_value(visibility) == "public":
            public.append(name)
    named: dict[bytes, bytes | None] = {}

    def canonical(name: bytes) -> bytes:
        if name not in named:
            # None while being named: a call back into it from another is a cycle
            named[name] = None

            def rename(r: bytes) -> bytes | None:
                return _SELF if r == name else canonical(r) if r in texts else None

            text = _renamed(texts[name], rename)
            named[name] = b"@" + hashlib.sha256(text).hexdigest().encode()
        if (new := named[name]) is None:
            raise _CycleError
        return new

    try:
        for name in public:
            top.update(b"public\0" + name + canonical(name))
    except _CycleError:
        return None
    return top.digest()


# A large constant is hashed from its bytes, not printed in hexadecimal (ten times
# slower): the printer elides each one of more than `_LIMIT` elements, and the walk
# finds them, in an order the text fixes (equal texts: the same operations).
_LIMIT: Final = 16
_ELIDED: Final = b"dense_resource<__elided__>"
# The tensors' element types whose constants the bindings can read: reading one of
# another type (complex) aborts the process.
_ELEMENT_TYPE: Final = re.compile(rb"tensor<(?:[\d?]+x)*([^>]*)>")
_READABLE: Final = re.compile(rb"u?i\d+|bf16|f\d+(?:E\w+)?|index")


def _text(op: Any) -> bytes:
    """A function's text, its large constants elided and their bytes' digest added;
    in full where the walk does not find one constant for each elided."""
    asm = functools.partial(op.get_asm, **_ASM, assume_verified=True)
    text = asm(large_elements_limit=_LIMIT)
    if _ELIDED not in text:
        return text
    if not all(map(_READABLE.fullmatch, set(_ELEMENT_TYPE.findall(text)))):
        return asm()
    large = _jax.large_constants(op, _LIMIT)
    h = hashlib.sha256()
    try:  # each one's size, then its bytes; None, or a type with no buffer, raises
        for data in [memoryview(c).cast("B") for c in large]:
            h.update(len(data).to_bytes(8, "little") + data)
    except (ValueError, TypeError, BufferError):
        large = None
    if large is None or len(large) != text.count(_ELIDED):  # or one not found
        return asm()
    return text + b"\n// constants " + h.hexdigest().encode()


_SELF: Final = b"@self"  # a function's own name, in its header


class _CycleError(Exception):
    """Functions that call each other in a cycle (a call into itself is `_SELF`)."""


def _renamed(text: bytes, rename: Callable[[bytes], bytes | None]) -> bytes:
    """`text` with each `@symbol` outside a string literal replaced by
    `rename(symbol)` (kept if None)."""

    def one(m: re.Match) -> bytes:
        new = None if m[1] is None else rename(m[1].strip(b'"'))  # no quote inside
        return m[0] if new is None else new

    return _SYMBOL.sub(one, text)


def same_compiled(a: Any, b: Any) -> bool:
    """What `EQX_STATIC_CHECK_SHARING` compares: two executables' optimized HLO, every
    constant in full, names numbered in order, no source locations. Not the same
    where this JAX cannot print them so."""
    texts = _jax.compiled_texts(a)
    return texts is not None and texts == _jax.compiled_texts(b)
