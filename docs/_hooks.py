"""MkDocs hooks for the eqx_static site.

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
