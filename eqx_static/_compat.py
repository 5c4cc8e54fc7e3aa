"""Every private name of Equinox and JAX that `eqx_static` uses, in one place.

Each is checked on import, so that an unsupported release fails here, with the
supported range, rather than somewhere deep in a call."""

from collections.abc import Callable
from typing import Any, Final

import equinox as eqx


SUPPORTED: Final = "equinox >=0.13.3,<0.14"

try:
    # The wrapper attributes that Equinox's flatten keeps (`eqx.module_update_wrapper`).
    from equinox._module._flatten import (  # equinox 0.13.3
        WRAPPER_FIELD_NAMES as WRAPPER_FIELD_NAMES,
    )

    # Equinox lets a module assign its own fields while it is in this set: that is
    # how `__init__` works, and how `es.edit` makes its copies editable.
    from equinox._module._module import (
        _currently_initialising as currently_initialising,  # equinox 0.13
    )

    # What reading a method off a module gives (`module.method`): a pytree.
    from equinox._module._prebuilt import BoundMethod as BoundMethod  # equinox 0.13

except ImportError as e:  # pragma: no cover
    raise ImportError(
        f"eqx_static supports {SUPPORTED}; equinox {eqx.__version__} is installed, "
        f"which lacks a name it needs ({e}). Install a supported equinox: "
        f'`pip install "{SUPPORTED.replace(" ", "")}"`.'
    ) from None

module_eq: Final[Callable[..., Any]] = eqx.Module.__eq__

__all__ = [
    "BoundMethod",
    "SUPPORTED",
    "WRAPPER_FIELD_NAMES",
    "currently_initialising",
    "module_eq",
]
