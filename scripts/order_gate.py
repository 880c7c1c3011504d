"""Pick the decode plan's launch order from a kernel_bench.py result (device scripts).

    python scripts/order_gate.py KERNEL_BENCH_JSON

Exit status 0 when the order the benchmark ran by default is at least as fast as the other
one over the batches with long sequences among short ones (cases named with "+" or ".."),
1 when the other order is faster (prints both sums), 2 without a usable result.
"""

import json
import sys

try:
    decode = json.load(open(sys.argv[1]))["decode"]
except (OSError, ValueError, KeyError) as exc:
    print(f"order gate: no kernel_bench result ({exc}); order unchanged")
    sys.exit(2)
rows = [d for d in decode if "+" in d["case"] or ".." in d["case"]]
now, other = sum(d["ms"] for d in rows), sum(d["other_order_ms"] for d in rows)
first = rows[0]["extras_first"] if rows else True
print(f"order gate: extras_first={first}: {now:.4f} ms, other order {other:.4f} ms "
      f"over {len(rows)} cases")
sys.exit(0 if now <= other else 1)
