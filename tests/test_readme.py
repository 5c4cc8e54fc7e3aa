"""The README's text: every ```python block runs, in order, in one namespace; a line
`print(...)  # TEXT` must print TEXT; a comment `# INFO:eqx_static:MESSAGE` (or
WARNING) must be logged by the block it is in; a ```text block after the marker
`<!-- output -->` is what the block before it prints. The README is one page: its
two commands are the ones `.ci/run` reads, the test command's slow-tier flag is
next to it, and every relative link points to a file of the repository. (The rest
of what the README once held is on the documentation site, whose blocks
`test_docs_site.py` runs; its comparison table is checked by `test_comparison.py`,
its module table by `test_house.py`, its benchmark table by
`test_benchmarks_table.py`.)"""

import contextlib
import io
import logging
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
_FENCE = re.compile(
    r"(?:^(?P<marker><!-- [^>]*-->)\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE,
)
_PRINTED = re.compile(r"^\s*print\(.*\)\s+# (?P<text>.*)$")
_LOGGED = re.compile(r"^\s*# (?P<level>INFO|WARNING):eqx_static:(?P<message>.*)$")


def _fences() -> list[tuple[str | None, str, str]]:
    return [(m["marker"], m["lang"], m["code"]) for m in _FENCE.finditer(README)]


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}:{record.name}:{record.getMessage()}")


def _run(code: str, namespace: dict, name: str) -> tuple[str, list[str]]:
    """Run `code` as the file `model.py` (the name the log lines show, as where the
    programs differ); return what it printed and what it logged on "eqx_static"."""
    records = _Records()
    logger = logging.getLogger("eqx_static")
    logger.addHandler(records)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "model.py", "exec"), namespace)
    finally:
        logger.removeHandler(records)
        logger.setLevel(logging.NOTSET)
    return out.getvalue(), records.lines


def _check_comments(code: str, printed: str, logged: list[str], name: str) -> None:
    expected = [m["text"] for m in map(_PRINTED.match, code.splitlines()) if m]
    if expected:
        assert printed.splitlines() == expected, f"{name}: printed {printed!r}"
    for m in filter(None, map(_LOGGED.match, code.splitlines())):
        line = f"{m['level']}:eqx_static:{m['message']}"
        assert line in logged, f"{name}: {line!r} was not logged; got {logged}"


def test_readme_blocks_run():
    """Every block, the quickstart first: its printed `repr` and `CacheInfo(...)`
    are checked against its comments like every other block's."""
    assert "CacheInfo(hits=" in _section("Quickstart")
    namespace: dict = {"__name__": "__readme__"}
    previous_output = None
    for i, (marker, lang, code) in enumerate(_fences()):
        if lang == "python":
            name = f"<README python block {i}>"
            printed, logged = _run(code, namespace, name)
            _check_comments(code, printed, logged, name)
            previous_output = printed
        elif lang == "text" and marker == "<!-- output -->":
            assert previous_output is not None
            assert previous_output.strip() == code.strip()


def test_the_readme_is_one_page():
    assert len(README.splitlines()) <= 200


def _command(marker: str) -> tuple[str, str]:
    """The first line of the code block after `marker` (as `.ci/run` reads it), and
    the text after that block."""
    after = README.split(f"{marker}\n", 1)[1]
    fence = re.match(r"```\w*\n(?P<line>[^\n]*)\n.*?^```\n", after, re.S | re.M)
    assert fence is not None, marker
    return fence["line"], after[fence.end() :]


def test_the_two_commands_and_the_slow_tier_next_to_them():
    setup, _ = _command("<!-- ci:setup -->")
    assert setup == (
        'python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" '
        "&& .venv/bin/python examples/seed.py"
    )
    test, rest = _command("<!-- ci:test -->")
    assert test == ".venv/bin/python -m pytest -q -n 2"
    next_paragraph = rest.strip().split("\n\n", 1)[0]
    assert "`--slow`" in next_paragraph and "\n" not in next_paragraph


def test_the_readme_s_relative_links_exist():
    links = re.findall(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)", README)
    assert "docs/index.md" in links
    for link in links:
        assert (ROOT / link).exists(), link
