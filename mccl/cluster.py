"""``python -m mccl.cluster up|down|status|exec``: emulated cluster CLI (mccl.bench.cluster)."""
from mccl.bench.cluster import main

if __name__ == "__main__":
    raise SystemExit(main())
