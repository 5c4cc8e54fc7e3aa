"""Degrade, don't break: where JAX's private names change so that each key's own
dispatcher cannot be built, `es.jit` runs each key on a public `jax.jit`, with
sharing off and one warning, and its results, books, budgets and explanations
stay right. (`tests/canary/` says which name changed.)"""

import logging
import os
import shutil
import tomllib
from pathlib import Path

import equinox as eqx
import eqx_static as es
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from eqx_static import _jax
from helpers import (
    free_address,
    no_socket,
    output,
    package_folders,
    ROOT,
    run_python,
    XlaCompiles,
)


@pytest.fixture
def no_dispatcher(monkeypatch):
    """A JAX whose dispatcher is built with other arguments than `_jax` passes."""

    def changed(*args, **kwargs):
        raise TypeError("pjit() takes 10 positional arguments but 9 were given")

    monkeypatch.setattr(_jax, "DISPATCH", True)  # restored afterwards
    monkeypatch.setattr(_jax, "SHARING", True)
    monkeypatch.setattr(_jax, "dispatcher", changed)


class Model(es.Module):
    w: jax.Array
    square: bool = eqx.field(static=True)
    name: str = eqx.field(static=True)  # never read

    @es.jit(max_compiles=3)
    def __call__(self, x):
        return self.w * (x * x if self.square else x)


def test_results_books_and_explanations_on_public_jax_jit(no_dispatcher, caplog):
    Model.__call__.cache_clear()
    x = jnp.arange(3.0)
    compiles = XlaCompiles()
    with pytest.warns(RuntimeWarning, match="its dispatcher cannot be built here"):
        first = Model(jnp.ones(3), False, "a")(x)
    np.testing.assert_array_equal(first, x)
    with caplog.at_level(logging.INFO, logger="eqx_static"):
        calls = [
            Model(jnp.ones(3), False, "a"),  # a hit
            Model(2 * jnp.ones(3), False, "a"),  # a hit: dynamic
            Model(jnp.ones(3), True, "a"),  # compiles
            Model(jnp.ones(3), False, "b"),  # compiles: sharing is off
        ]
        for m in calls:
            np.testing.assert_array_equal(m(x), Model.__call__.fn(m, x))
    assert Model.__call__.cache_info() == es.CacheInfo(2, 3, None, 3)
    assert Model.__call__.compile_info().compiles == compiles.of("__call__") == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "eqx_static"]
    assert "static field 'square' changed False -> True" in lines[0]
    assert "static field 'name' changed 'a' -> 'b'" in lines[1]
    with pytest.raises(es.RecompileError, match="compile 4 exceeds `max_compiles=3`"):
        Model(jnp.ones(3), True, "b")(x)


def test_transformations_on_public_jax_jit(no_dispatcher):
    @es.jit
    def f(x):
        return jnp.sin(x).sum()

    x = jnp.arange(3.0)
    with pytest.warns(RuntimeWarning):
        g = jax.grad(f)(x)
    np.testing.assert_allclose(g, jnp.cos(x))
    np.testing.assert_allclose(jax.vmap(f)(jnp.stack([x, x])), 2 * [jnp.sin(x).sum()])
    assert float(f(x)) == pytest.approx(float(jnp.sin(x).sum()))


@pytest.mark.slow
def test_a_dispatcher_that_behaves_otherwise_degrades_at_the_first_key_with_one_warning():
    """A JAX whose dispatcher keeps its private names but behaves otherwise (here:
    its cache keeps nothing, so the probe call sees three misses, not two): at the
    first key (not at import, which starts no backend), the probe turns the
    per-key dispatchers off with one warning, and calls are right and booked."""
    code = """
import warnings
import equinox  # loaded first, on JAX as it is
import jax._src.pjit as pjit
pjit._get_cpp_global_cache = lambda explicit: pjit.make_jit_cpp_cache(0)
import eqx_static as es
from eqx_static import _jax
import jax.numpy as jnp
f = es.jit(lambda x: 2 * x)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = f(jnp.ones(2))
print("DISPATCH", _jax.DISPATCH, "SHARING", _jax.SHARING, "warnings", len(caught))
print(caught[0].message)
print("RESULT", first.tolist(), f(jnp.ones(2)).tolist(), f.cache_info())
"""
    out = run_python(code=code)
    assert out.returncode == 0, output(out)
    assert "DISPATCH False SHARING False warnings 1" in out.stdout, output(out)
    assert "3 calls of one signature made 3 misses, not 2" in out.stdout, output(out)
    assert "RESULT [2.0, 2.0] [2.0, 2.0] CacheInfo(hits=1, misses=1" in out.stdout


_FIRST_CALLS = {
    "inside jax.jit": "jax.jit(f)(x)",
    "inside jax.vmap": "jax.vmap(f)(jnp.ones((2, 2)))",
    "inside jax.grad": "jax.grad(lambda v: f(v).sum())(x)",
    "under jax.disable_jit": "with jax.disable_jit(): f(x)",
    "with transfers disallowed": "with jax.transfer_guard('disallow'): f(x)",
    "with profile-guided compiles": "jax.config.update('jax_enable_pgle', True); f(x)",
}


@pytest.mark.slow
@pytest.mark.parametrize("first", _FIRST_CALLS.values(), ids=_FIRST_CALLS.keys())
def test_the_first_key_of_a_process_probes_the_dispatcher_as_at_top_level(first):
    """The probe at the first key runs outside the caller's trace and contexts:
    a first call inside `jax.jit`, `vmap` or `grad`, under `disable_jit`, a transfer
    guard or profile-guided compiles keeps the per-key dispatchers (each of these
    turned them off for the process, with a warning)."""
    code = f"""
import warnings
warnings.filterwarnings("error", message="eqx_static")
import jax, jax.numpy as jnp, eqx_static as es
from eqx_static import _jax
f = es.jit(lambda x: x * 2)
x = jnp.ones(2)
{first}
print("DISPATCH", _jax.DISPATCH, _jax.SHARING)
"""
    out = run_python(code=code)
    assert out.returncode == 0, output(out)
    assert "DISPATCH True True" in out.stdout, output(out)


@pytest.mark.slow
@pytest.mark.skipif(bool(no_socket()), reason=str(no_socket()))
def test_importing_starts_no_backend_so_jax_distributed_can_initialize_after():
    """`jax.distributed.initialize()` must run before JAX's backend starts: importing
    the package first (as a script's imports do) starts none."""
    code = f"""
import eqx_static as es
import jax
from jax._src import xla_bridge
print("BACKENDS", len(xla_bridge._backends))
jax.distributed.initialize("{free_address()}", num_processes=1, process_id=0)
f = es.jit(lambda x: 2 * x)
print("RESULT", f(jax.numpy.ones(2)).tolist(), jax.process_count())
"""
    out = run_python(code=code)
    assert out.returncode == 0, output(out)
    assert "BACKENDS 0" in out.stdout and "RESULT [2.0, 2.0] 1" in out.stdout, output(
        out
    )


@pytest.mark.slow
def test_an_equinox_without_its_private_names_gives_the_same_results():
    """Each private name of Equinox and jaxtyping gone (for `_jax`'s look-ups): one
    warning at import naming them, and a module whose instance dictionary holds
    more than its fields (keyed as JAX flattens it), a method read off an
    `es.Module`, `eqx.error_if` and `with_dynamic` still give their results; an
    `es.edit` block raises `FrozenInstanceError`, as the docs say."""
    code = """
import importlib, warnings
import equinox, jax, jaxtyping  # loaded whole first: only `_jax`'s look-ups fail
found = importlib.import_module
def without_equinox_s(name, *args):  # what `_jax` looks up, gone
    if name.startswith(("equinox._", "jaxtyping._")):
        raise ImportError(name)
    return found(name, *args)
importlib.import_module = without_equinox_s
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import eqx_static as es
importlib.import_module = found
import equinox as eqx, jax, jax.numpy as jnp
print("WARNINGS", len(caught), "WRAPPER_FIELD_NAMES" in str(caught[0].message))

class M(es.Module):
    w: jax.Array
    def scaled(self, x):
        return self.w * x

m = M(jnp.ones(2))
object.__setattr__(m, "__doc__", "extra")  # one more entry than its fields
f = es.jit(lambda m, x: m.scaled(x))
print("RESULT", f(m, jnp.ones(2)).tolist(), f(m, jnp.ones(2)).tolist(), f.cache_info())
g = es.jit(lambda x: eqx.error_if(x, x > 0, "positive"))
try:
    g(jnp.ones(()))
except Exception as e:
    print("ERROR", type(e).__name__, "positive" in str(e))
print("UPDATE", float(m.with_dynamic(w=jnp.zeros(2)).w.sum()))
try:  # what degrades: an edit cannot assign
    with es.edit(m) as m2:
        m2.w = jnp.zeros(2)
except Exception as e:
    print("EDIT", type(e).__name__)
"""
    out = run_python(code=code)
    assert out.returncode == 0, output(out)
    assert "WARNINGS 1 True" in out.stdout, output(out)
    assert "RESULT [1.0, 1.0] [1.0, 1.0] CacheInfo(hits=1, misses=1" in out.stdout
    assert "ERROR EquinoxRuntimeError True" in out.stdout, output(out)
    assert "UPDATE 0.0" in out.stdout, output(out)
    assert "EDIT FrozenInstanceError" in out.stdout, output(out)


@pytest.mark.slow
def test_a_jax_without_its_program_printers_stops_sharing_with_one_warning():
    """Where JAX's MLIR module cannot be imported, the sharing check could not read
    a program: at import, sharing is off with one warning saying so, and two keys
    of one program each compile their own, with right results."""
    code = """
import sys, warnings
import jax, equinox  # loaded whole first: only `_jax`'s import fails
sys.modules["jax._src.lib.mlir.ir"] = None  # `from ... import ir` raises ImportError
del sys.modules["jax._src.lib.mlir"].ir
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import eqx_static as es
    from eqx_static import _jax
import jax.numpy as jnp
print("SHARING", _jax.SHARING, "warnings", len(caught))
print(caught[0].message)
f = es.jit(lambda x, tag: 2 * x)
print("RESULT", f(jnp.ones(2), "a").tolist(), f(jnp.ones(2), "b").tolist())
print("COMPILES", f.compile_info().compiles)
"""
    out = run_python(code=code)
    assert out.returncode == 0, output(out)
    assert "SHARING False warnings 1" in out.stdout, output(out)
    assert "MLIR or HLO printer cannot be imported" in out.stdout, output(out)
    assert "RESULT [2.0, 2.0] [2.0, 2.0]\nCOMPILES 2" in out.stdout, output(out)


@pytest.mark.slow
@pytest.mark.parametrize("pyproject", [True, False], ids=["pyproject", "bare"])
def test_a_checkout_that_is_not_installed_imports_with_a_version(tmp_path, pyproject):
    """Put on `sys.path` without being installed (no metadata), the package still
    imports: its version is the checkout's `pyproject.toml`'s, else "unknown".
    The process sees the test environment's packages, less this one's metadata."""
    checkout, packages = tmp_path / "checkout", tmp_path / "site"
    shutil.copytree(ROOT / "eqx_static", checkout / "eqx_static")
    if pyproject:
        shutil.copy(ROOT / "pyproject.toml", checkout)
    packages.mkdir()
    for folder in package_folders():  # the first of a name wins, as on sys.path
        for entry in Path(folder).iterdir():
            mine = entry.name.startswith(("eqx_static", "_editable_impl_eqx_static"))
            if not mine and not (packages / entry.name).exists():
                (packages / entry.name).symlink_to(entry)
    code = "import eqx_static as es; print(es.__file__); print(es.__version__)"
    path = f"{checkout}{os.pathsep}{packages}"
    out = run_python("-S", "-c", code, env={"PYTHONPATH": path}, cwd=tmp_path)
    assert out.returncode == 0, output(out)
    where, version = out.stdout.split()
    assert Path(where).parent == checkout / "eqx_static"
    with open(ROOT / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert version == (declared if pyproject else "unknown")
