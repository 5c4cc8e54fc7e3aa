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
- `<!-- test: cpu (REASON) -->`: the block shows what JAX does on the CPU only; it
  is skipped on other platforms, with REASON;
- `<!-- test: skip (REASON) -->`: never run.

Blocks in other languages (```bash) are not run. A last test builds the site
with `mkdocs build --strict` where the `docs` extra is installed.

What a block shows is checked as in the README (`test_readme.py`): each block
(its fence may carry options for the site, as ```python linenums="1") runs as the
file `model.py` (the name, and the line within the block, that log
lines show as where two programs differ); a line `print(...)  # TEXT` must print
TEXT; a comment `# INFO:eqx_static:MESSAGE` (or `WARNING`) must be logged by the
block it is in, where `…` in MESSAGE stands for any text (a time), and the comment
lines right after it are the next lines of a message of several; a block that
shows a `WARNING` logs those warnings and no other, each once (the storm warning
of `compile-budget.md` is said once); and a ```text block after the marker `<!-- output -->` is what the
block before it printed.
"""

import contextlib
import importlib.util
import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import jax
import pytest
from helpers import SHARING


ROOT = Path(__file__).absolute().parent.parent
DOCS = ROOT / "docs"
_FENCE = re.compile(
    r"(?:^<!-- test: (?P<marker>[^>]*?) -->\n)?^(?P<indent>[ ]*)```python(?: [^\n]*)?\n(?P<code>.*?)^(?P=indent)```",
    re.DOTALL | re.MULTILINE,
)
_OUTPUT = re.compile(
    r"\n+<!-- output -->\n```text\n(.*?)^```", re.DOTALL | re.MULTILINE
)
_PRINTED = re.compile(r"^\s*print\(.*\)\s+# (?P<text>.*)$")
_LOGGED = re.compile(r"^\s*# (?P<line>(?:INFO|WARNING):eqx_static:.*)$")
_COMMENT = re.compile(r"^\s*# (?P<line>.*)$")


class Block(NamedTuple):
    page: str
    index: int
    line: int
    marker: str | None
    code: str
    output: str | None  # the `<!-- output -->` text block that follows it


def _blocks(path: Path) -> list[Block]:
    text = path.read_text()
    page = path.relative_to(DOCS).as_posix()
    out = []
    for i, m in enumerate(_FENCE.finditer(text)):
        indent = len(m.group("indent"))
        code = "\n".join(s[indent:] for s in m.group("code").splitlines())
        line = text.count("\n", 0, m.start("code")) + 1
        output = _OUTPUT.match(text, m.end())
        output = None if output is None else output.group(1)
        out.append(Block(page, i, line, m.group("marker"), code, output))
    return out


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


_ALL = [b for p in _pages() for b in _blocks(p)]


# Pages whose blocks show keys sharing one program (none do on the public path).
_SHOW_SHARING = {"relevance.md", "why-it-compiled.md"}


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
    if marker.startswith("cpu"):
        return None if jax.default_backend() == "cpu" else marker
    if marker.startswith("skip"):
        return marker
    raise ValueError(f"{block.page}:{block.line}: unknown marker {marker!r}")


@contextlib.contextmanager
def _restored_logging():
    root, ours = logging.getLogger(), logging.getLogger("eqx_static")
    handlers, level, our_level = root.handlers[:], root.level, ours.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        ours.setLevel(our_level)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}:{record.name}:{record.getMessage()}")


def _run_block(block: Block, namespace: dict[str, Any]) -> None:
    """Run `block` as `model.py`, and check what it printed and logged against
    its comments and its output block."""
    records, out = _Records(), io.StringIO()
    logger = logging.getLogger("eqx_static")
    logger.addHandler(records)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, "model.py", "exec"), namespace)
    finally:
        logger.removeHandler(records)
    where = f"docs/{block.page}:{block.line}"
    printed = out.getvalue()
    expected = [m["text"] for m in map(_PRINTED.match, block.code.splitlines()) if m]
    if expected:
        assert printed.splitlines() == expected, f"{where}: printed {printed!r}"
    if block.output is not None:
        assert printed.strip() == block.output.strip(), f"{where}: printed {printed!r}"
    patterns = []
    for line in _logged(block.code):
        pattern = ".*?".join(map(re.escape, line.split("…")))
        patterns.append(pattern)
        assert any(re.fullmatch(pattern, s) for s in records.lines), (
            f"{where}: {line!r} was not logged; got {records.lines}"
        )
    shown = [p for p in patterns if p.startswith("WARNING:")]
    if shown:
        warnings = [s for s in records.lines if s.startswith("WARNING:")]
        for line in warnings:
            assert any(re.fullmatch(p, line) for p in shown), (
                f"{where}: logged {line!r}, which the block does not show"
            )
        assert len(warnings) == len(shown), (
            f"{where}: logged {len(warnings)} warnings, the block shows {len(shown)}"
        )


def _logged(code: str) -> list[str]:
    """The messages a block's comments say it logs, each with its next lines."""
    out: list[str] = []
    comment = False  # whether the line before was part of such a message
    for line in code.splitlines():
        if m := _LOGGED.match(line):
            out.append(m["line"])
        elif comment and (m := _COMMENT.match(line)):
            out[-1] += "\n" + m["line"]
        comment = m is not None
    return out


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
                _run_block(block, namespace)
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
    if not SHARING and block.page in _SHOW_SHARING:
        pytest.skip("the page shows keys sharing a program: not on this path")
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
