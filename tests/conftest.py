import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mccl.bench import spawn  # noqa: E402 - after the path above

# Ranks fork from one server that imported torch once: spawning each rank afresh cost seconds
# per multi-rank test on a 2-core machine, most of the suite's time.
spawn.start_ranks_by_fork()
