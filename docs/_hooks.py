"""MkDocs hooks for the eqx_static site.

`benchmarks/results/scaling.svg`, drawn by `benchmarks/run.py --plot` beside the
JSON it plots, is added to the site as `assets/scaling.svg`, the image
`benchmarks.md` shows (the docs directory holds no copy of it).

`api.md` lists, in `<!-- api-if-defined: NAME -->` comments, public names that
only newer versions of the package define. This hook turns each comment into a
`::: eqx_static.NAME` entry when the package beside `mkdocs.yml` (the one
mkdocstrings documents) has the name, and drops it otherwise, so that
`mkdocs build --strict` passes on both sides of the change that adds it.
"""

import importlib
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files


_SCALING = Path(__file__).resolve().parent.parent / "benchmarks/results/scaling.svg"
_MARKER = re.compile(r"^<!-- api-if-defined: (\w+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, *, config: Any, **kwargs: Any) -> str:
    if not _MARKER.search(markdown):
        return markdown
    root = str(Path(config.config_file_path).parent)
    if root not in sys.path:
        sys.path.insert(0, root)  # as mkdocstrings' default `paths: [.]`
    package = importlib.import_module("eqx_static")

    def entry(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"::: eqx_static.{name}" if hasattr(package, name) else ""

    return _MARKER.sub(entry, markdown)


def on_files(files: Files, *, config: Any) -> Files:
    files.append(
        File.generated(config, "assets/scaling.svg", abs_src_path=str(_SCALING))
    )
    return files
