#!/usr/bin/python3
"""docs/grafana/dsnode.json: valid JSON, and every dsnode_* metric its
queries name is one docs/status.md documents (a histogram's _bucket by its
family), so the dashboard cannot drift from /metrics silently."""
import json
import re
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
dash = json.loads((root / "docs/grafana/dsnode.json").read_text())
doc = (root / "docs/status.md").read_text()
known = set(re.findall(r"`(dsnode_[a-z0-9_]+)", doc))
bad = []
n = 0
for p in dash["panels"]:
    for t in p.get("targets", []):
        for name in re.findall(r"\b(dsnode_[a-z0-9_]+)", t["expr"]):
            n += 1
            fam = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in known and fam not in known:
                bad.append(f'panel "{p["title"]}": {name} is not in docs/status.md')
for b in bad:
    print("grafana:", b)
print(f"grafana: {len(dash['panels'])} panels, {n} metric names checked, {len(bad)} unknown")
sys.exit(1 if bad else 0)
