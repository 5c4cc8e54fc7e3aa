"""Static values are keyed by type and value all the way down: also the keys of a
dict (which JAX keeps in the tree structure, compared with `==`) and the metadata
of a registered pytree (its aux data). `1`, `True` and `1.0` are three entries,
and `0.0` and `-0.0` two, wherever they sit; every result is the eager one."""

import dataclasses

import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np


X = jnp.array([0.5, -1.0, 2.0])


def _first_key(d, x):
    """The dict's key, as an array (its dtype shows its type), and the value."""
    (k,) = d
    return jnp.asarray(k), d[k] * x


def test_dict_keys_are_keyed_by_type():
    """`{1: x}`, `{True: x}` and `{1.0: x}` are equal dicts to Python, with one
    tree structure to JAX: three entries here, each returning its own key's
    type, as the eager call does."""
    f = es.jit(_first_key)
    w = jnp.float32(2.0)
    for k, dtype in ((1, jnp.int32), (True, jnp.bool_), (1.0, jnp.float32)):
        got, want = f({k: w}, X), _first_key({k: w}, X)
        assert got[0].dtype == want[0].dtype == dtype
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1], want[1])
    assert f.cache_info() == es.CacheInfo(0, 3, None, 3)
    assert f({True: w}, X)[0].dtype == jnp.bool_  # still its own entry: a hit
    assert f.cache_info().hits == 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Shifted:
    """A registered dataclass: `w` is a leaf, `shift` metadata (aux data)."""

    w: jax.Array
    shift: float = dataclasses.field(metadata=dict(static=True))


def _shift(p: _Shifted, x):
    return p.w * x + p.shift, jnp.asarray(p.shift, jnp.float32)


def test_register_dataclass_metadata_is_keyed_by_its_bits():
    """A meta field `0.0`, then `-0.0`: equal to Python and to JAX's tree
    structure, two values here. The second call sees `-0.0`, as eagerly."""
    f = es.jit(_shift)
    for shift in (0.0, -0.0):
        p = _Shifted(jnp.float32(2.0), shift)
        got, want = f(p, X), _shift(p, X)
        np.testing.assert_array_equal(got[0], want[0])
        assert np.signbit(got[1]) == np.signbit(want[1]) == np.signbit(shift)
    assert f.cache_info() == es.CacheInfo(0, 2, None, 2)
