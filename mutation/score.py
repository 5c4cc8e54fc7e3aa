"""Print mutmut's verdicts per module, from the `.meta` files of the last run."""

import json
import pathlib
import sys
from collections import Counter

from mutmut.stats import status_by_exit_code


metas = sorted(pathlib.Path("mutants/eqx_static").glob("*.py.meta"))

total = Counter()
print(f"{'module':<16}{'killed':>8}{'total':>8}{'score':>8}  survived / other")
for meta in metas:
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    codes = {k: v for k, v in codes.items() if v is not None}  # None: not run (MUTANTS)
    c = Counter(status_by_exit_code[code] for code in codes.values())
    # A timeout counts as killed (the mutant hangs a test); "no tests" means the
    # chosen test files never call that function: it counts against the score.
    killed = c["killed"] + c["timeout"]
    n = sum(c.values())
    total.update(c)
    others = {k: v for k, v in c.items() if k not in ("killed", "timeout", "survived")}
    name = meta.name.removesuffix(".py.meta")
    print(
        f"{name:<16}{killed:>8}{n:>8}{100 * killed / max(n, 1):>7.1f}%  {c['survived']} {others or ''}"
    )
    for key, code in sorted(codes.items()):
        if status_by_exit_code[code] not in ("killed", "timeout") and "-v" in sys.argv:
            print(f"    {status_by_exit_code[code]:<12} {key}")
