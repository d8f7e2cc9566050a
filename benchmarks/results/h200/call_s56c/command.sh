#!/usr/bin/env bash
# Fifty-sixth session, call C (run from the repository root): the CUDA tests with the
# library as committed after call B (both of a staged flat all-gather's / reduce-scatter's
# tensors copied piece by piece): call B ran them, but its log did not come back (the device
# tool returns at most 8 files), so everything now goes into one bundle.
set -u
R=/tmp/c; mkdir -p $R
timeout 280 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py \
    tests/test_matrix.py::test_matrix_on_cuda_tensors tests/test_device_staging.py \
    >$R/tests_cuda.log 2>&1; echo "rc=$?" >>$R/tests_cuda.log
tar -czf $OUT/c_results.tar.gz -C $R . && tail -5 $R/tests_cuda.log
