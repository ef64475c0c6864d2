"""How fast the ledger recovers from processes killed with SIGKILL.

Builds tests/c/ledger_test.c optimised (no sanitizers) and prints its kill-storm
figures: 100 holders killed at random moments (mid-reservation, mid-release,
mid-reclaim under the region lock) while a survivor keeps allocating; the
longest wait of an allocation that needs a dead holder's bytes, and the
longest single call of the survivor.  Goals (issue 3): under 10 ms, and no stall over 100 ms.

    python benchmarks/kill_recovery.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CC = os.environ.get("CC", "cc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "ledger_test"
        src, base = ROOT / "shim" / "src", ROOT / "base"
        subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-O2", f"-I{ROOT / 'shim' / 'include'}",
                        f"-I{src}", f"-I{base}", "-o", str(binary), str(ROOT / "tests" / "c" / "ledger_test.c"),
                        *(str(src / f) for f in ("limits.c", "region.c", "slot_owner.c", "ledger.c", "log.c")),
                        *(str(base / f) for f in ("clock.c", "identity.c", "robust.c", "create.c", "number.c")),
                        "-lpthread"], check=True)
        for run in range(args.runs):
            scratch = Path(tmp) / f"run{run}"
            scratch.mkdir()
            out = subprocess.run([str(binary), str(scratch), "kill_storm"], capture_output=True,
                                 text=True, check=True).stdout
            print(next(line for line in out.splitlines() if line.startswith("kill storm")))


if __name__ == "__main__":
    main()
