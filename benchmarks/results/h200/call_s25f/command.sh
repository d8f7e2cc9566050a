#!/usr/bin/env bash
# Twenty-fifth session, call F: issue #4 1 Gbit stage on the machine (BBR) with receive
# steering (the default on shaped links since e37defb).
DEADLINE_S=380 bash benchmarks/h200/run_all.sh cluster1g
