"""Every public symbol has a docstring with a runnable example, and it runs."""

import re

import eqx_static as es
import pytest
from helpers import SHARING


_PUBLIC = sorted(es.__all__)
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _examples(obj: object) -> list[str]:
    doc = getattr(obj, "__doc__", None) or ""
    blocks = _BLOCK.findall(doc)
    return [_dedent(b) for b in blocks]


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min(len(s) - len(s.lstrip()) for s in lines if s.strip())
    return "\n".join(s[indent:] for s in lines)


def test_public_api_is_what_the_design_lists():
    assert all(hasattr(es, n) for n in _PUBLIC)
    assert set(_PUBLIC) == {
        "Module",
        "with_static",
        "with_dynamic",
        "edit",
        "jit",
        "CacheInfo",
        "CompileInfo",
        "TracedFieldError",
        "RecompileError",
        "Lowered",
        "Compiled",
        "DivergenceError",
    }


@pytest.mark.parametrize("name", _PUBLIC)
def test_every_public_symbol_has_a_runnable_example(name):
    if not SHARING and name in ("jit", "CompileInfo"):
        pytest.skip("the example shows keys sharing a program: not on this path")
    obj = getattr(es, name)
    examples = _examples(obj)
    assert examples, f"`es.{name}` has no ```python example in its docstring"
    for code in examples:
        exec(compile(code, f"<es.{name} docstring>", "exec"), {"__name__": "__doc__"})
