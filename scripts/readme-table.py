#!/usr/bin/env python3
"""Rewrite the README's configuration table from VARS in src/config/vars.rs (tests/readme_config.rs
checks that the two agree; run this after adding or changing a variable)."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
src = (root / "src/config/vars.rs").read_text()
table = src[src.index("pub const VARS"):src.index("];", src.index("pub const VARS"))]


def field(block, name):
    m = re.search(name + r':\s*((?:"(?:[^"\\]|\\.)*"\s*)+),', block, re.S)
    if not m:
        sys.exit(f"readme-table: no {name} in {block[:60]!r}")
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))).replace('\\"', '"')


rows = []
for block in table.split("Var {")[1:]:
    rows.append("| `%s` | %s | %s | %s |" % tuple(
        field(block, f) for f in ("name", "accepted", "default", "meaning")))
readme = root / "README.md"
lines = readme.read_text().split("\n")
start = next(i for i, l in enumerate(lines) if l.startswith("| variable |"))
end = start + 2
while end < len(lines) and lines[end].startswith("| `"):
    end += 1
lines[start + 2:end] = rows
readme.write_text("\n".join(lines))
