"""A/B hook for design experiments (benchmarks/h200/ab.sh): every process started with this
folder on PYTHONPATH applies ``MCCL_AB="key=value,..."`` at start-up (keys: mccl_ab.py).

The repository root goes on ``sys.path`` first: site runs this before Python adds the
script's or the current folder, so a process whose PYTHONPATH names only this folder (the
ranks that ``multiprocessing`` spawns, on a machine without mccl installed) would otherwise
fail to import mccl here, and Python reports that on stderr and goes on with the defaults."""

import os
import sys

if os.environ.get("MCCL_AB"):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    import mccl_ab

    mccl_ab.apply(os.environ["MCCL_AB"])
