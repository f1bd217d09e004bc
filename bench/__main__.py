"""Run every benchmark once, small enough for a 2-core machine: `python -m bench` (make bench).

Each prints its own side-by-side ratios; run a module by itself for its options and full sizes.
"""

import subprocess
import sys

RUNS = [
    ["-m", "bench.inventory_bench"],
    ["-m", "bench.failfast_bench"],
    ["-m", "bench.start_bench", "--spawns", "20", "--refusals", "5"],
    ["-m", "bench.page_bench", "--nodes", "300", "--offerings", "100", "--renders", "20"],
    ["-m", "bench.culler_bench", "--servers", "200"],
    ["-m", "bench.probe_bench", "--scrapes", "30"],
    ["-m", "bench.turns_bench", "--timeout", "90", "--bound", "20"],
    ["-m", "bench.autoscale_day"],
]


def main() -> int:
    status = 0
    for args in RUNS:
        print(f"\n$ python {' '.join(args)}", flush=True)
        status |= subprocess.call([sys.executable, *args])
    return status


if __name__ == "__main__":
    sys.exit(main())
