"""What the divergence check (`_diverge`) uses of JAX's distributed runtime: its
key-value store (`jax._src.distributed.global_state.client`) and the processes a
lowering's devices belong to. Without the store the check is off, with one warning
(`tests/test_diverge.py`); without the processes of a lowering, it cannot tell a
program that spans processes from one that does not."""

import jax
import jax.numpy as jnp
import pytest
from eqx_static import _jax
from helpers import no_socket, output, run_python


def test_a_lowering_names_the_processes_of_its_devices():
    lowering = _jax.lowering_of(jax.jit(jnp.sin).trace(jnp.ones(3)).lower())
    assert lowering is not None
    indices = getattr(lowering._device_list, "process_indices", None)
    assert indices == {0}, "JAX changed: a lowering's device list has no processes"
    assert not _jax.spans_processes(lowering)


def test_without_jax_distributed_there_is_no_store_and_no_warning():
    assert _jax.kv_store() is None  # pyproject: any warning is an error
    assert _jax._store_lost == []


_STORE = """
import socket
import jax
from jax.errors import JaxRuntimeError
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
jax.distributed.initialize(
    coordinator_address=address, num_processes=1, process_id=0,
    coordinator_bind_address=address, initialization_timeout=30,
)
from eqx_static import _jax
client = _jax.kv_store()
assert client is not None, "no store"
client.key_value_set("t/1/000001", "b")
client.key_value_set("t/1/000000", "a")
client.wait_at_barrier("t/1", 1000)
assert sorted(client.key_value_dir_get("t/1/")) == [
    ("t/1/000000", "a"), ("t/1/000001", "b")], "a directory's listing"
client.key_value_delete("t/1/")
assert client.key_value_dir_get("t/1/") == [], "a directory deleted whole"
client.key_value_delete("t/never")  # a key never set: nothing to delete
for absent in (lambda: client.key_value_try_get("t/x"),
               lambda: client.blocking_key_value_get("t/x", 100)):
    try:
        absent()
    except JaxRuntimeError:
        pass
    else:
        raise AssertionError("an absent key is not an error")
client.key_value_set("t/y", "=")
assert client.blocking_key_value_get("t/y", 100) == "="
try:
    client.key_value_set("t/y", "again")
except JaxRuntimeError:
    pass
else:
    raise AssertionError("a key set twice is overwritten")
jax.distributed.shutdown()
print("STORE OK")
"""


@pytest.mark.slow
def test_the_key_value_store_does_what_the_check_needs():
    """A one-process job: records in a directory, listed in order and deleted as
    one; a barrier; an absent key an error (`JaxRuntimeError`), at once or after a
    timeout; a key set twice refused (the first timed-out process's message stays)."""
    if reason := no_socket():
        pytest.skip(reason)
    result = run_python(code=_STORE, timeout=120)
    assert "STORE OK" in result.stdout, (
        f"JAX changed: its key-value store behaves otherwise\n{output(result)}"
    )
