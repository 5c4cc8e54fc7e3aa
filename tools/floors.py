"""Print each runtime dependency of `pyproject.toml` pinned to its declared lower
bound (`name==version`), as pip constraints: the floors that CI and
`tools/versions.sh` test.

    python tools/floors.py > floors.txt && pip install -c floors.txt -e ".[test]"
"""

import re
import sys
import tomllib
from pathlib import Path


def floors(pyproject: Path) -> list[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:\[.*\])?\s*>=\s*([^,;\s]+).*", dep)
        if m is None:
            sys.exit(f"no lower bound in {dep!r}: every dependency needs one")
        out.append(f"{m[1]}=={m[2]}")
    return out


if __name__ == "__main__":
    print("\n".join(floors(Path(__file__).resolve().parent.parent / "pyproject.toml")))
