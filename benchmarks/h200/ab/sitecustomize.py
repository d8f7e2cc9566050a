"""A/B hook for design experiments (benchmarks/h200/ab.sh): every process started with this
folder on PYTHONPATH applies ``MCCL_AB="key=value,..."`` at start-up (keys: mccl_ab.py)."""

import os

if os.environ.get("MCCL_AB"):
    import mccl_ab

    mccl_ab.apply(os.environ["MCCL_AB"])
