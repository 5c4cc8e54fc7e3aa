"""Every ```python block on the documentation site (`docs/`) runs.

The blocks of one page run in order in one namespace, as a reader would paste
them, and each block is one test. A comment on the line before a block changes
that:

- `<!-- test: pending -->`: the block shows behaviour that is specified but not
  implemented yet; it is skipped with the reason "pending implementation" (remove
  the marker once it runs: `EQX_STATIC_DOCS_RUN_PENDING=1 pytest
  tests/test_docs_site.py` runs these blocks too, to show which ones do);
- `<!-- test: requires MODULE -->`: the block uses another library (flax,
  jax_dataclasses, ...); it runs only where `MODULE` can be imported;
- `<!-- test: skip (REASON) -->`: never run.

Blocks in other languages (```bash) are not run. A last test builds the site
with `mkdocs build --strict` where the `docs` extra is installed.
"""

import contextlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import jax
import pytest


ROOT = Path(__file__).absolute().parent.parent
DOCS = ROOT / "docs"
_FENCE = re.compile(
    r"(?:^<!-- test: (?P<marker>[^>]*?) -->\n)?^(?P<indent>[ ]*)```python\n(?P<code>.*?)^(?P=indent)```",
    re.DOTALL | re.MULTILINE,
)


class Block(NamedTuple):
    page: str
    index: int
    line: int
    marker: str | None
    code: str


def _blocks(path: Path) -> list[Block]:
    text = path.read_text()
    page = path.relative_to(DOCS).as_posix()
    out = []
    for i, m in enumerate(_FENCE.finditer(text)):
        indent = len(m.group("indent"))
        code = "\n".join(s[indent:] for s in m.group("code").splitlines())
        line = text.count("\n", 0, m.start("code")) + 1
        out.append(Block(page, i, line, m.group("marker"), code))
    return out


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


_ALL = [b for p in _pages() for b in _blocks(p)]


def _skip_reason(block: Block) -> str | None:
    marker = block.marker
    if marker is None:
        return None
    if marker == "pending":
        if os.environ.get("EQX_STATIC_DOCS_RUN_PENDING") == "1":
            return None
        return "pending implementation"
    if marker.startswith("requires "):
        module = marker.removeprefix("requires ").strip()
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return f"needs `{module}`"
        return None
    if marker.startswith("skip"):
        return marker
    raise ValueError(f"{block.page}:{block.line}: unknown marker {marker!r}")


@contextlib.contextmanager
def _restored_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


_results: dict[str, dict[int, BaseException | None]] = {}


def _run_page(page: str) -> dict[int, BaseException | None]:
    """Run the page's runnable blocks in order, once; an error stops the page."""
    if page in _results:
        return _results[page]
    results: dict[int, BaseException | None] = {}
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    failed: BaseException | None = None
    # JAX's default promotion, as a reader's session has it (optax mixes a Python
    # float with an int32 count, which the suite's strict setting refuses).
    with _restored_logging(), jax.numpy_dtype_promotion("standard"):
        for block in (b for b in _ALL if b.page == page):
            if _skip_reason(block) is not None:
                continue
            if failed is not None:
                results[block.index] = RuntimeError(
                    f"not run: an earlier block of {page} failed: {failed!r}"
                )
                continue
            try:
                code = compile(block.code, f"<docs/{page}:{block.line}>", "exec")
                exec(code, namespace)
                results[block.index] = None
            except BaseException as e:  # noqa: BLE001 -- reported by the test
                results[block.index] = failed = e
    _results[page] = results
    return results


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in _pages():
        assert path.relative_to(DOCS).as_posix() in nav, path


def test_markers_are_known():
    for block in _ALL:
        _skip_reason(block)


@pytest.mark.parametrize("block", _ALL, ids=[f"{b.page}:{b.line}" for b in _ALL])
def test_block_runs(block: Block):
    reason = _skip_reason(block)
    if reason is not None:
        pytest.skip(reason)
    error = _run_page(block.page)[block.index]
    if error is not None:
        raise error


@pytest.mark.slow
def test_site_builds_strictly(tmp_path: Path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("the `docs` extra is not installed")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr
