"""Collective algorithms as plain functions over a Channel and flat numpy buffers.

They know nothing of torch.distributed or sockets, so they can be tested with in-memory fake
peers. See ``base.Channel`` for the contract.
"""
