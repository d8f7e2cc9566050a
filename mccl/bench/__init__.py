"""Measuring instrument for mccl: emulated cluster, link ceiling, collective benchmark, model.

Submodules are imported on demand so that ``import mccl.bench`` stays cheap:
``cluster`` (Linux network namespaces), ``ceiling`` (single-stream TCP payload ceiling),
``runner``/``worker`` (nccl-tests style collective benchmark), ``report`` (table/JSON/PNG),
``model`` (alpha-beta fit and extrapolation), ``train`` (local DDP demo launcher).
"""
