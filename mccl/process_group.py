"""The c10d face of mccl: one ProcessGroup subclass.

It validates arguments on the caller's thread (so bad input raises before any byte moves and
the group stays usable), maps each c10d op to an engine job and returns a Work. No sockets and
no ring maths here.
"""

from __future__ import annotations

import functools
import logging
import operator
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.autograd.graph import increment_version

from . import collectives as coll
from . import config
from .algorithms.base import chunk_cap
from .device import Adapter, adapter_for
from .device.cpu import CpuAdapter
from .device.strided import (
    ContiguousHandoff,
    Placement,
    clashing_inputs,
    clashing_outputs,
    needs_copy,
    overlaps_itself,
    plain_copy,
)
from .engine import Engine, Job
from .errors import CollectiveError, setup_error
from .monitor import monitored_barrier
from .ops import Kind, describe, signature, split_digest, wire_dtype, wire_numel
from .reduce import Op, check
from .transport.address import choose_address
from .transport.framing import P2P, Signature
from .transport.mesh import Mesh
from .transport.rendezvous import (
    NO_RANK,
    BoundedStore,
    StoreFailedError,
    agree_members,
    agree_world_size,
    await_give_ups,
    check_claims,
    check_rank,
    claim_rank,
    close_telling,
    connect_mesh,
    cores_per_rank,
    give_up,
    group_hash,
    hosts_the_store,
    leave_word,
    new_incarnation,
    watch_liveness,
)
from .work import LONGEST_TIMEOUT_S, GroupWork, Work, completed_work, timeout_seconds

log = logging.getLogger("mccl")
#: ``_submit``'s default for ``device``: the tensors were not validated yet.
_UNCHECKED = object()

BACKEND_NAME = "mccl"
#: Devices whose blocking ops may run on the caller's thread (see ``_submit``). CUDA: the
#: caller is PyTorch's own thread, and such an op copies on its current stream (O3 holds;
#: ``mccl.device.cuda``). MPS stays on the comm thread: that path is not run on hardware here.
INLINE_DEVICE_TYPES = frozenset({"cpu", "cuda"})
#: How long a failing op waits for its word to a rank still forming the group to reach the
#: store (``_leave_word``): a process that exits on the error took the thread writing it along,
#: and that rank then waited out the group timeout.
WORD_WAIT_S = 2.0
#: Tag reserved for monitored_barrier's p2p messages (user tags are other values).
_MONITOR_TAG = -0x4D43434C

_REDOPS = {
    dist.ReduceOp.SUM: Op.SUM, dist.ReduceOp.AVG: Op.AVG, dist.ReduceOp.PRODUCT: Op.PRODUCT,
    dist.ReduceOp.MIN: Op.MIN, dist.ReduceOp.MAX: Op.MAX, dist.ReduceOp.BAND: Op.BAND,
    dist.ReduceOp.BOR: Op.BOR, dist.ReduceOp.BXOR: Op.BXOR,
}


_REDOP_OF_CODE = {int(k): v for k, v in _REDOPS.items()}


#: Every op moves bytes (reductions check their dtype on top), so any dtype will do, float8
#: and the unsigned types included, except the quantized ones: they carry a scale and zero
#: point besides their bytes.
_QUANTIZED = frozenset(getattr(torch, n) for n in ("qint8", "quint8", "qint32", "quint4x2",
                                                   "quint2x4") if hasattr(torch, n))


def _redop(op) -> Op:
    kind = getattr(op, "op", op)
    if isinstance(kind, dist.ReduceOp.RedOpType):  # per op: an int lookup (pybind's == is slow)
        found = _REDOP_OF_CODE.get(int(kind))
        if found is not None:
            return found
    for k, v in _REDOPS.items():
        if kind == k:
            return v
    raise ValueError(f"mccl does not support reduce op {kind} (supported: SUM, AVG, PRODUCT, "
                     "MIN, MAX, BAND, BOR, BXOR)")


def _seconds(timeout: timedelta) -> float:
    if not isinstance(timeout, timedelta):
        raise TypeError(f"mccl: a process group's timeout must be a datetime.timedelta, got "
                        f"{type(timeout).__name__}")
    timeout_s = timeout.total_seconds()
    if timeout_s <= 0:
        raise ValueError(f"mccl: the process group's timeout must be positive, got "
                         f"{timeout} ({timeout_s:g} s)")
    return min(timeout_s, LONGEST_TIMEOUT_S)


def _master_addr(store) -> str | None:
    addr = os.environ.get("MASTER_ADDR")
    if addr:
        return addr
    s = store
    for _ in range(8):  # unwrap PrefixStores down to the TCPStore
        host = getattr(s, "host", None)
        if isinstance(host, str) and host:
            return host
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    return None


def _drops_coalescing_on_error(method):
    """For the coalesced ops torch's coalescing manager issues at the end of its block, just
    before ``_end_coalescing``: if one raises (bad input), torch skips that call, so the
    coalescing state is dropped here (else every later op would be collected for an end that
    never comes, and none would run inline)."""

    @functools.wraps(method)
    def op(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self._coalesced = None
            raise

    return op


class ProcessGroupMCCL(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run over mccl's TCP rings."""

    supports_splitting = False
    supports_coalescing = False

    def __init__(self, store, rank: int, size: int, timeout: timedelta,
                 group_name: str = "default", global_ranks: Sequence[int] | None = None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._timeout = timeout
        default = not global_ranks  # torch's default group (init_process_group)
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        if len(self._global_ranks) != size:  # not from torch's new_group: group ranks then
            log.debug("group %s: %d global ranks for %d ranks; using group ranks",
                      group_name, len(self._global_ranks), size)
            self._global_ranks = list(range(size))
        self._label = group_name or "default"
        self._group_name = group_name or ""
        timeout_s = _seconds(timeout)
        store = BoundedStore(store, timeout_s)
        self._member = new_incarnation(store, rank) if default else None
        bad_rank = check_rank(rank, size)  # raised below, once the others can hear of it
        me = self._global_ranks[rank] if bad_rank is None else NO_RANK
        socks: dict = {}

        def say(e: BaseException) -> None:
            """Leave word of this rank's failure, except where the store failed: nobody
            could read it there (and torch prints a C++ trace for each failed call)."""
            if not isinstance(e, StoreFailedError):
                leave_word(store, self._label, me, e)

        try:  # a rank that fails here tells the others (give_up), who then stop waiting
            if bad_rank is not None:
                raise bad_rank
            claim_rank(store, self._label, me)
            if default:  # a subgroup's ranks agree on more below (``agree_members``)
                agree_world_size(store, self._label, me, size)
            cfg = config.load()
            config.apply_log_level(cfg.log_level)
            self._cfg = cfg
            address = choose_address(cfg.socket_ifname, _master_addr(store))
            if not default:  # the default group has every rank: no member list to disagree on
                agree_members(store, me, self._global_ranks, self._label, timeout_s)
            # Agreed before any socket opens (it waits for every rank's key, as connecting
            # does).
            cores = cores_per_rank(store, rank, size, self._label, timeout_s,
                                   self._global_ranks)
            cap = chunk_cap(cores)
            log.info("group %s: %.1f cores per rank, ring chunks up to %d KiB", self._label,
                     cores, cap >> 10)
            group_id, socks = connect_mesh(
                store, rank, size, self._label, timeout_s, address, self._global_ranks,
                before_close=say)
            check_claims(store, self._label)
        except Exception as e:
            say(e)  # before a peer sees the sockets close
            close_telling(socks.values(), group_hash(self._label), e)
            self._end()
            if hosts_the_store(me) and not isinstance(e, StoreFailedError):
                # Only the store's host waits for the others to read its word (a rank that
                # waited on a store whose host had left made torch print a C++ trace).
                await_give_ups(store, self._label, size)
            raise setup_error(e) from e.__cause__
        numbered = None if self._global_ranks == list(range(size)) else self._global_ranks
        self._mesh = Mesh(rank, size, group_id, socks, timeout_s, self._label,
                          describe=functools.partial(describe, global_ranks=numbered))
        self._engine = Engine(self._mesh, self._label, cap, self._global_ranks)
        self._store = store
        self._formed_at = time.monotonic()
        self._timeout_s = timeout_s
        self._engine.on_break = _weakly(self._leave_word)
        if default:
            global _default_group
            _default_group = weakref.ref(self)
        self._adapters: dict[str, Adapter] = {}
        self._coalesced: list[Work] | None = None
        self._bound_device: torch.device | None = None

    def _leave_word(self, err: CollectiveError) -> None:
        """The group broke: tell a rank that may still be forming it through the store
        (``give_up``, which its set-up watches), off this thread, as the store may hang or be
        gone, waiting at most ``WORD_WAIT_S`` for it. Its peers' error frames may not reach
        it: where an op sent it data first, the frame waits behind the data, which it reads
        only once formed. Only within the group timeout of this rank's set-up: no rank waits
        to form longer than that."""
        if time.monotonic() - self._formed_at >= self._timeout_s or self._engine.all_formed:
            # (all formed: nobody waits in set-up for the word, and the store's host may have
            # exited after its own error; a call to its store then makes torch print a C++
            # trace)
            return
        culprit = err.peer
        if (culprit is not None and culprit != self._rank and 0 <= culprit < self._size
                and hosts_the_store(self._global_ranks[culprit])):
            # Global rank 0 hosts the store (unless torchrun's agent does): with rank 0 gone
            # nobody can read the word there, and writing it makes torch print a C++ trace.
            return
        note = RuntimeError(f"it formed the group, then an op failed: {err}")
        word = threading.Thread(target=give_up, name=f"mccl-word-{self._label}", daemon=True,
                                args=(self._store, self._label, self._global_ranks[self._rank],
                                      note))
        word.start()
        word.join(WORD_WAIT_S)  # before the op's error reaches its caller (see WORD_WAIT_S)

    # ---- identity ----
    # The same values as the C++ accessors, without a pybind call (a few microseconds each,
    # several per op on the caller's thread).
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    # c10d keeps a group's name on its backends; a Python group has none, so ``group_name``
    # (DeviceMesh, functional collectives, FSDP2) needs these overrides of the C++ virtuals.
    def setGroupName(self, name: str) -> None:  # noqa: N802 - c10d's name
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 - c10d's name
        if not self._group_name:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    @property
    def _device_types(self) -> list[torch.device]:
        """The device types this group serves (c10d's read-only property lists the backends
        registered on a group; a Python group registers none, and torch's state-dict and
        checkpoint helpers pick their device from this list)."""
        devices = [torch.device("cpu")]
        if torch.cuda.is_available():
            devices.append(torch.device("cuda"))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            devices.append(torch.device("mps"))
        return devices

    def _get_backend(self, device=None):
        """A Python group is its own backend for every device (init_process_group(device_id=...)
        asks for one)."""
        return self

    def eager_connect_single_device(self, device=None) -> None:
        return None  # connections are made when the group is created

    def _get_sequence_number_for_group(self) -> int:
        return self._engine.seq

    def _set_sequence_number_for_group(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"ProcessGroupMCCL(rank={self.rank()}, size={self.size()}, group='{self._label}')"

    # ---- validation helpers (caller thread) ----
    def _device_of(self, op: str, tensors: Sequence[torch.Tensor]) -> torch.device | None:
        device = None
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"mccl {op}: expected tensors, got {type(t).__name__}")
            if t.is_nested:
                raise ValueError(f"mccl {op}: nested tensors are not supported")
            if t.layout != torch.strided:
                raise ValueError(f"mccl {op}: only dense tensors are supported here "
                                 f"(all_reduce also takes sparse COO CPU tensors), got "
                                 f"{t.layout}")
            if t.dtype in _QUANTIZED:
                raise TypeError(f"mccl {op}: unsupported dtype {t.dtype} (quantized tensors "
                                "are not supported)")
            if device is None:
                device = t.device
            elif t.device != device:
                raise ValueError(f"mccl {op}: tensors on different devices ({device} and "
                                 f"{t.device})")
        if device is not None and device.type not in ("cpu", "cuda", "mps"):
            raise ValueError(f"mccl {op}: tensors on device '{device}' are not supported "
                             "(cpu, cuda, mps)")
        return device

    def _writable(self, op: str, tensors: Sequence[torch.Tensor],
                  writes: Sequence[bool]) -> None:
        for t, w in zip(tensors, writes, strict=True):
            if w and overlaps_itself(t):
                raise ValueError(f"mccl {op}: the tensor of shape {tuple(t.shape)} and strides "
                                 f"{t.stride()} that receives the result has elements sharing "
                                 "memory (an expanded view); pass one that does not, e.g. "
                                 ".clone()")

    def _copied_into(self, op: str, outs: Sequence[torch.Tensor], read: bool = False,
                     ) -> tuple[list[torch.Tensor], RuntimeError | None]:
        """Outputs that gloo fills with a tensor copy, which autograd sees as an in-place
        write. mccl writes their memory directly, so it makes that write known itself: an
        output that requires grad (in grad mode), or an inference tensor, gets an in-place
        copy of itself first, so torch's own rules apply (a leaf or a view of one is refused,
        a non-leaf's history is replaced, as by gloo's copy), and every other output's version
        counter goes up: a tensor saved for backward and overwritten here fails backward
        instead of giving a wrong gradient. A refused output is not written: the op runs on
        private tensors in place of the outputs (clones where it reads them too, ``read``),
        so every rank completes it and the group stays in step, and its Work then fails with
        the returned error (as on gloo, where only the refusing rank's op fails)."""
        grad = torch.is_grad_enabled()
        checked = {id(t) for t in outs if (grad and t.requires_grad) or t.is_inference()}
        try:
            for t in outs:
                if id(t) in checked:
                    t.copy_(t.detach())
        except RuntimeError as e:
            private = [t.detach().clone() if read else torch.empty_like(t, requires_grad=False)
                       for t in outs]
            return private, RuntimeError(f"mccl {op}: {e}")
        increment_version([t for t in outs if id(t) not in checked])  # copy_ did the others
        return list(outs), None

    def _adapter(self, device: torch.device | None) -> Adapter:
        key = str(device or "cpu")
        a = self._adapters.get(key)
        if a is None:
            a = adapter_for(device or torch.device("cpu"), unified=self._cfg.unified)
            self._adapters[key] = a
        return a

    def _one(self, op: str, tensors) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            return tensors
        if len(tensors) != 1:
            raise ValueError(f"mccl {op}: expects exactly one tensor per call, got {len(tensors)}")
        return tensors[0]

    @staticmethod
    def _int(op: str, what: str, value) -> int:
        """An int argument as torch's C++ groups take it (anything with ``__index__``: a
        numpy integer, a one-element integer tensor); a float or a string is refused, not
        truncated, and a tensor never reaches the ``(peer, tag)`` matching, which would hash
        it by identity."""
        try:
            return operator.index(value)
        except TypeError:
            raise TypeError(f"mccl {op}: {what} must be an int, got {value!r} "
                            f"({type(value).__name__})") from None

    def _root(self, op: str, root: int) -> int:
        root = self._int(op, "the root rank", root)
        if not 0 <= root < self.size():
            raise ValueError(f"mccl {op}: root rank {root} is outside the group of {self.size()}")
        return root

    def _peer(self, op: str, peer: int) -> int:
        peer = self._int(op, "the peer rank", peer)
        if not 0 <= peer < self.size():
            raise ValueError(f"mccl {op}: rank {peer} is outside the group of {self.size()}")
        if peer == self.rank():
            raise ValueError(f"mccl {op}: rank {peer} cannot {op} to/from itself")
        return peer

    def _tag(self, op: str, tag: int) -> int:
        """A p2p tag travels as a signed 32-bit field; one value is mccl's own."""
        tag = self._int(op, "the tag", tag)
        if not -(1 << 31) <= tag < (1 << 31) or tag == _MONITOR_TAG:
            raise ValueError(f"mccl {op}: tag {tag!r} is not supported (an int from -2**31 to "
                             f"2**31 - 1, except {_MONITOR_TAG})")
        return tag

    def _same_dtype(self, op: str, tensors: Sequence[torch.Tensor]) -> None:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) > 1:
            raise TypeError(f"mccl {op}: tensors of mixed dtypes {sorted(map(str, dtypes))}")

    def _real_pairs(self, op: str, redop: Op, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Complex tensors reduce as float views of their (real, imaginary) pairs, as torch's
        own all_reduce hands them over: SUM and AVG are the same element-wise on the pairs;
        the other ops have no complex meaning (torch refuses them too)."""
        if not tensors or not tensors[0].is_complex():
            return tensors
        if any(t.is_conj() for t in tensors):
            raise ValueError(f"mccl {op}: a conjugate view (torch.conj) cannot be reduced in "
                             "place; call .resolve_conj() first")
        if redop not in (Op.SUM, Op.AVG):
            raise TypeError(f"mccl {op}: reduce op {redop.name} is not defined for complex "
                            f"dtype {tensors[0].dtype} (SUM and AVG are)")
        return [torch.view_as_real(t) for t in tensors]

    def _numel_is(self, op: str, what: str, t: torch.Tensor, n: int) -> None:
        if t.numel() != n:
            raise ValueError(f"mccl {op}: {what} has {t.numel()} elements, expected {n}")

    def _root_list(self, op: str, lists, root: int, what: str,
                   like: torch.Tensor) -> list[torch.Tensor]:
        """The root's one-tensor-per-rank list of gather/scatter, checked against ``like``;
        every other rank must pass none."""
        if self.rank() != root:
            if lists and any(len(lst) for lst in lists):
                raise ValueError(f"mccl {op}: only the root (rank {root}) takes a {what}")
            return []
        if len(lists) != 1:
            raise ValueError(f"mccl {op}: the root needs one {what}")
        items = list(lists[0])
        if len(items) != self.size():
            raise ValueError(f"mccl {op}: {what} has {len(items)} tensors, "
                             f"the group has {self.size()} ranks")
        for i, t in enumerate(items):
            self._numel_is(op, f"{what}[{i}]", t, like.numel())
        self._same_dtype(op, items + [like])
        return items

    # ---- submission ----
    def _submit(self, name: str, sig: Signature, body, tensors: list[torch.Tensor],
                reads: list[bool], writes: list[bool], result: list[torch.Tensor],
                collective: bool = True, opts=None, start=None,
                segmented: coll.StagedByRange | None = None,
                device: torch.device | None | object = _UNCHECKED, park=None,
                placements: Sequence[Placement] = (),
                refused: BaseException | None = None) -> Work:
        """``device``: what ``_device_of`` already returned for exactly these ``tensors``
        (spares validating them twice); checked here if not given. ``start(ch, hosts)``: the
        part of the op that only sends, run before ``body`` (``Job.start``).
        ``segmented``: the op's run, whose large tensor a staged hand-off may copy piece by
        piece in the ring's order (all-reduce, flat all-gather and reduce-scatter); told so
        (``stage``) before the op is queued. ``placements``: where
        an input may share memory with an output (the op's in-place layout); an input that
        shares it otherwise is read from a copy (``clashing_inputs``). A result tensor that
        cannot take the result (an expanded view) is something this rank's peers cannot tell:
        the op runs with a private copy in its place, so every rank completes it and the group
        stays in step, and the Work then fails with the ``ValueError``; ``refused``: an error
        found before, that the Work fails the same way."""
        if device is _UNCHECKED:
            device = self._device_of(name, tensors)
        adapter = self._adapter(device)
        strided = any(needs_copy(t) for t in tensors)
        if strided:
            try:
                self._writable(name, tensors, writes)
            except ValueError as e:
                refused = refused or e
                tensors = [t.contiguous() if w and overlaps_itself(t) else t
                           for t, w in zip(tensors, writes, strict=True)]
                strided = any(needs_copy(t) for t in tensors)
        copies = (strided or bool(clashing_inputs(tensors, reads, writes, placements))
                  or bool(clashing_outputs(tensors, writes)))
        if copies:
            segmented = None  # ranges of a flat view: the copy below is made whole
        blocking = opts is not None and getattr(opts, "asyncOp", True) is False
        # A blocking collective runs on the caller's thread when the group is idle: the caller
        # would only wait for the comm thread, and the two hand-offs cost 50-100 us per op on
        # a loaded host (async ops never do: they must not block the caller).
        inline = (collective and self._coalesced is None and blocking
                  and (device is None or device.type in INLINE_DEVICE_TYPES))
        # c10d ops are outside autograd: detached views share storage, and numpy() refuses
        # tensors that require grad (DDP with create_graph=True hands those in).
        handoff = adapter.prepare([t.detach() for t in tensors], reads, writes, inline=inline)
        if copies:
            handoff = ContiguousHandoff(handoff, reads, writes, placements)
        # A staged hand-off may copy a large tensor range by range so its device copies
        # overlap the exchange (CPU hand-offs have no pipeline).
        pipeline = getattr(handoff, "pipeline", None) if segmented is not None else None
        if pipeline is not None:
            w, r, cap = self.size(), self.rank(), self._engine.chunk_cap
            staged = frozenset(
                i for i in segmented.ranged
                if pipeline(lambda i=i: segmented.ranges(tensors, i, w, r, cap), i,
                            segmented.in_bytes))
            if staged:
                segmented.stage(handoff, staged)
        devices = [device] if device is not None and device.type == "cuda" else None
        work = Work(name, result, devices=devices, blocking=blocking, refused=refused)
        job = Job(name, sig, body, work, handoff, collective=collective, start=start,
                  tensors=tensors, park=park)
        self._engine.submit(job, inline=inline)
        if collective:  # (a weak reference: a Work kept after destroy keeps no engine alive)
            engine, seq = weakref.ref(self._engine), job.seq
            work.waiting = lambda: e.waiting_text(seq) if (e := engine()) is not None else ""
        return self._coalesce(work)

    # ---- collectives ----
    def allreduce(self, tensors, opts=None):
        op_name = "all_reduce"
        if isinstance(opts, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
            redop = _redop(opts)
        else:
            redop = _redop(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        given = self._one(op_name, tensors)
        if isinstance(given, torch.Tensor) and given.layout == torch.sparse_coo:
            return self._sparse_allreduce(given, redop, opts)
        device = self._device_of(op_name, [given])
        (t,) = self._real_pairs(op_name, redop, [given])
        check(redop, t.dtype, op_name)
        sig = signature(Kind.ALL_REDUCE, wire_dtype(t), redop, count=t.numel())
        run = coll.AllReduce(redop, self._engine.scratch)
        return self._submit(op_name, sig, run.finish, [t], [True], [True], [given], opts=opts,
                            device=device, start=run.start, segmented=run)

    def _sparse_allreduce(self, t: torch.Tensor, redop: Op, opts) -> Work:
        """A sparse COO gradient (``nn.Embedding(sparse=True)`` under DDP): SUM only and CPU
        only, as gloo's (its CUDA path copies through the host too); the result replaces the
        tensor's indices and values."""
        op_name = "all_reduce"
        if t.device.type != "cpu":
            raise ValueError(f"mccl {op_name}: sparse tensors are reduced on the CPU only, got "
                             f"one on {t.device}; pass t.cpu() and copy the result back")
        if redop is not Op.SUM:
            raise ValueError(f"mccl {op_name}: sparse tensors reduce with SUM only, got "
                             f"{redop.name}")
        # torch hands a complex tensor over as its real view (``view_as_real``). A dense
        # view shares the result with its base; a sparse one that takes other entries does
        # not, so the result is written into the complex base too (gloo writes only the
        # view, and the caller's complex tensor is left unreduced).
        base = t._base if t._is_view() else None
        if base is None or not (base.is_complex() and base.is_sparse):
            base = None
        # the result replaces the tensor's entries, an in-place write autograd must know of
        # (gloo's copy: a leaf that requires grad is refused, as there)
        (t,), refused = self._copied_into(op_name, [t], read=True)
        if refused is not None:
            base = None
        sig = signature(Kind.SPARSE_ALL_REDUCE, t.dtype, redop)
        return self._submit(op_name, sig, lambda ch, h: coll.sparse_all_reduce(ch, t, base),
                            [], [], [], [t], opts=opts, device=None, refused=refused)

    @_drops_coalescing_on_error
    def allreduce_coalesced(self, tensors, opts=None):
        op_name = "all_reduce_coalesced"
        redop = _redop(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        given = list(tensors)
        device = self._device_of(op_name, given)
        self._same_dtype(op_name, given)
        if not given:
            return completed_work(op_name, [])
        check(redop, self._real_pairs(op_name, redop, given[:1])[0].dtype, op_name)
        given, refused = self._copied_into(op_name, given, read=True)
        tensors = self._real_pairs(op_name, redop, given)
        counts = [t.numel() for t in tensors]
        sig = signature(Kind.ALL_REDUCE, wire_dtype(tensors[0]), redop, count=sum(counts),
                        root=split_digest(counts))
        scratch = self._engine.scratch
        flags = [True] * len(tensors)
        return self._submit(op_name, sig,
                            lambda ch, h: coll.all_reduce_many(ch, h, redop, scratch),
                            tensors, flags, flags, given, opts=opts, device=device,
                            refused=refused)

    def broadcast(self, tensors, opts=None):
        op_name = "broadcast"
        if isinstance(opts, int):
            root, tensor_index = opts, 0
        else:
            root = opts.rootRank if opts is not None else 0
            tensor_index = opts.rootTensor if opts is not None else 0
        if tensor_index != 0:
            raise ValueError("mccl broadcast: rootTensor must be 0")
        t = self._one(op_name, tensors)
        root = self._root(op_name, root)
        device = self._device_of(op_name, [t])
        sig = signature(Kind.BROADCAST, wire_dtype(t), root=root, count=wire_numel(t))
        is_root = self.rank() == root
        scratch = self._engine.scratch
        return self._submit(op_name, sig, lambda ch, h: coll.broadcast(ch, h[0], root, scratch),
                            [t], [is_root], [not is_root], [t], opts=opts, device=device)

    def reduce(self, tensors, opts=None):
        op_name = "reduce"
        redop = _redop(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        root = self._root(op_name, opts.rootRank if opts is not None else 0)
        given = self._one(op_name, tensors)
        device = self._device_of(op_name, [given])
        (t,) = self._real_pairs(op_name, redop, [given])
        check(redop, t.dtype, op_name)
        sig = signature(Kind.REDUCE, wire_dtype(t), redop, root, t.numel())
        scratch = self._engine.scratch
        is_root = self.rank() == root
        return self._submit(op_name, sig,
                            lambda ch, h: coll.reduce(ch, h[0], redop, root, scratch),
                            [t], [True], [is_root], [given], opts=opts, device=device)

    def allgather(self, output_tensors, input_tensors, opts=None):
        op_name = "all_gather"
        inp = self._one(op_name, input_tensors)
        outs = self._one(op_name, output_tensors) if not isinstance(output_tensors[0],
                                                                    torch.Tensor) else None
        if outs is None:
            outs = list(output_tensors)
        outs = list(outs)
        if len(outs) != self.size():
            raise ValueError(f"mccl {op_name}: output list has {len(outs)} tensors, "
                             f"the group has {self.size()} ranks")
        self._same_dtype(op_name, outs + [inp])
        self._numel_is(op_name, f"output[{self.rank()}]", outs[self.rank()], inp.numel())
        sig = signature(Kind.ALL_GATHER, wire_dtype(inp), count=sum(wire_numel(o) for o in outs))
        outs, refused = self._copied_into(op_name, outs)
        n = len(outs)
        run = coll.AllGather(flat=False)
        return self._submit(op_name, sig, run.finish, outs + [inp], [False] * n + [True],
                            [True] * n + [False], outs, opts=opts, start=run.start,
                            placements=[(n, self.rank(), 0)], refused=refused)

    def _allgather_flat(self, op_name: str, output: torch.Tensor, inp: torch.Tensor,
                        opts=None):
        self._same_dtype(op_name, [output, inp])
        w = self.size()
        self._numel_is(op_name, "output", output, inp.numel() * w)
        sig = signature(Kind.ALL_GATHER, wire_dtype(inp), count=wire_numel(output))
        (output,), refused = self._copied_into(op_name, [output])
        run = coll.AllGather(flat=True)
        own = self.rank() * inp.numel() * inp.element_size()  # this rank's slot of the output
        return self._submit(op_name, sig, run.finish, [output, inp], [False, True],
                            [True, False], [output], opts=opts, start=run.start,
                            placements=[(1, 0, own)], refused=refused, segmented=run)

    def _allgather_base(self, output, input, opts=None):
        return self._allgather_flat("all_gather_into_tensor", output, input, opts)

    def all_gather_single(self, output, input, opts=None):
        return self._allgather_flat("all_gather_into_tensor", output, input, opts)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """c10d's layout: ``output_lists[rank][i]`` receives that rank's ``input_list[i]``."""
        inputs = list(input_list)
        by_rank = [list(lst) for lst in output_lists]
        if len(by_rank) != self.size() or any(len(lst) != len(inputs) for lst in by_rank):
            raise ValueError("mccl all_gather_coalesced: expected one output list per rank "
                             f"({self.size()}) of {len(inputs)} tensors each, got "
                             f"{[len(lst) for lst in by_rank]}")
        works = [self.allgather([[lst[i] for lst in by_rank]], [inp], opts)
                 for i, inp in enumerate(inputs)]
        return GroupWork("all_gather_coalesced", works)

    @_drops_coalescing_on_error
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError("mccl all_gather_into_tensor_coalesced: "
                             f"{len(outputs)} outputs for {len(inputs)} inputs")
        works = [self._allgather_flat("all_gather_into_tensor", o, i)
                 for o, i in zip(outputs, inputs, strict=True)]
        return GroupWork("all_gather_into_tensor_coalesced", works)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        op_name = "gather"
        root = self._root(op_name, opts.rootRank if opts is not None else 0)
        inp = self._one(op_name, input_tensors)
        is_root = self.rank() == root
        outs = self._root_list(op_name, output_tensors, root, "gather list", inp)
        sig = signature(Kind.GATHER, wire_dtype(inp), root=root, count=wire_numel(inp))
        outs, refused = self._copied_into(op_name, outs)
        n, scratch = len(outs), self._engine.scratch
        return self._submit(op_name, sig,
                            lambda ch, h: coll.gather(ch, h[n], h[:n] if is_root else None, root,
                                                      scratch),
                            outs + [inp], [False] * n + [True], [True] * n + [False],
                            outs if is_root else [], opts=opts,
                            placements=[(n, root, 0)] if is_root else (), refused=refused)

    def scatter(self, output_tensors, input_tensors, opts=None):
        op_name = "scatter"
        root = self._root(op_name, opts.rootRank if opts is not None else 0)
        out = self._one(op_name, output_tensors)
        is_root = self.rank() == root
        ins = self._root_list(op_name, input_tensors, root, "scatter list", out)
        sig = signature(Kind.SCATTER, wire_dtype(out), root=root, count=wire_numel(out))
        n, scratch = len(ins), self._engine.scratch
        return self._submit(op_name, sig,
                            lambda ch, h: coll.scatter(ch, h[n], h[:n] if is_root else None, root,
                                                       scratch),
                            ins + [out], [True] * n + [False], [False] * n + [True], [out],
                            opts=opts, placements=[(root, n, 0)] if is_root else ())

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op_name = "reduce_scatter"
        redop = _redop(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        out = self._one(op_name, output_tensors)
        ins = list(self._one(op_name, input_tensors))
        if len(ins) != self.size():
            raise ValueError(f"mccl {op_name}: input list has {len(ins)} tensors, "
                             f"the group has {self.size()} ranks")
        self._same_dtype(op_name, ins + [out])
        device = self._device_of(op_name, ins + [out])
        self._numel_is(op_name, f"input[{self.rank()}]", ins[self.rank()], out.numel())
        (given,), refused = self._copied_into(op_name, [out])
        *ins, out = self._real_pairs(op_name, redop, ins + [given])
        check(redop, out.dtype, op_name)
        sig = signature(Kind.REDUCE_SCATTER, wire_dtype(out), redop,
                        count=sum(t.numel() for t in ins))
        n = len(ins)
        run = coll.ReduceScatter(redop, self._engine.scratch, flat=False)
        return self._submit(op_name, sig, run.finish, ins + [out], [True] * n + [False],
                            [False] * n + [True], [given], opts=opts, device=device,
                            start=run.start, placements=[(self.rank(), n, 0)],
                            refused=refused)

    def _reduce_scatter_flat(self, op_name: str, output, input, opts):
        redop = _redop(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        device = self._device_of(op_name, [output, input])
        self._same_dtype(op_name, [output, input])
        w = self.size()
        self._numel_is(op_name, "input", input, output.numel() * w)
        (given,), refused = self._copied_into(op_name, [output])
        output, input = self._real_pairs(op_name, redop, [given, input])
        check(redop, output.dtype, op_name)
        sig = signature(Kind.REDUCE_SCATTER, wire_dtype(output), redop, count=input.numel())
        run = coll.ReduceScatter(redop, self._engine.scratch, flat=True)
        own = self.rank() * output.numel() * output.element_size()  # its part of the input
        return self._submit(op_name, sig, run.finish, [output, input], [False, True],
                            [True, False], [given], opts=opts, device=device, start=run.start,
                            placements=[(0, 1, own)], refused=refused, segmented=run)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._reduce_scatter_flat("reduce_scatter_tensor", output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_flat("reduce_scatter_tensor", output, input, opts)

    @_drops_coalescing_on_error
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError("mccl reduce_scatter_tensor_coalesced: "
                             f"{len(outputs)} outputs for {len(inputs)} inputs")
        works = [self._reduce_scatter_flat("reduce_scatter_tensor", o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return GroupWork("reduce_scatter_tensor_coalesced", works)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        op_name = "all_to_all"
        outs, ins = list(output_tensors), list(input_tensors)
        w = self.size()
        if len(outs) != w or len(ins) != w:
            raise ValueError(f"mccl {op_name}: {len(outs)} outputs and {len(ins)} inputs for a "
                             f"group of {w} ranks")
        self._same_dtype(op_name, outs + ins)
        self._numel_is(op_name, f"output[{self.rank()}]", outs[self.rank()],
                       ins[self.rank()].numel())
        sig = signature(Kind.ALL_TO_ALL, wire_dtype(ins[0]) if ins else None)
        outs, refused = self._copied_into(op_name, outs)

        def body(ch, h):
            coll.all_to_all(ch, [coll.as_bytes(t) for t in h[:w]],
                            [coll.as_bytes(t) for t in h[w:]])

        return self._submit(op_name, sig, body, outs + ins, [False] * w + [True] * w,
                            [True] * w + [False] * w, outs, opts=opts,
                            placements=[(w + self.rank(), self.rank(), 0)], refused=refused)

    def _split_rows(self, op_name: str, t: torch.Tensor, splits, what: str) -> list[int]:
        w = self.size()
        rows = t.shape[0] if t.dim() > 0 else t.numel()
        if splits is None or len(splits) == 0:
            if rows % w:
                raise ValueError(f"mccl {op_name}: {what} dim 0 ({rows}) is not divisible by "
                                 f"the group size {w}; pass split sizes")
            return [rows // w] * w
        splits = [self._int(op_name, f"{what} split size", s) for s in splits]
        if len(splits) != w or any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(f"mccl {op_name}: {what} split sizes {splits} do not split dim 0 "
                             f"({rows}) into {w} parts")
        return splits

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        op_name = "all_to_all_single"
        device = self._device_of(op_name, [output, input])
        self._same_dtype(op_name, [output, input])
        out_rows = self._split_rows(op_name, output, output_split_sizes, "output")
        in_rows = self._split_rows(op_name, input, input_split_sizes, "input")
        row_out = output.numel() // max(1, output.shape[0] if output.dim() else 1)
        row_in = input.numel() // max(1, input.shape[0] if input.dim() else 1)
        if output.numel() and input.numel() and row_out != row_in:
            raise ValueError(f"mccl {op_name}: input rows have {row_in} elements, output rows "
                             f"{row_out}")
        if out_rows[self.rank()] != in_rows[self.rank()]:
            raise ValueError(f"mccl {op_name}: this rank sends itself {in_rows[self.rank()]} rows "
                             f"but expects {out_rows[self.rank()]}")
        sig = signature(Kind.ALL_TO_ALL, wire_dtype(input))
        esz = input.element_size()

        def cut(buf, rows, row):
            offs, parts = 0, []
            for r in rows:
                parts.append(buf[offs:offs + r * row * esz])
                offs += r * row * esz
            return parts

        def body(ch, h):
            coll.all_to_all(ch, cut(coll.as_bytes(h[0]), out_rows, row_out),
                            cut(coll.as_bytes(h[1]), in_rows, row_in))

        return self._submit(op_name, sig, body, [output, input], [False, True], [True, False],
                            [output], opts=opts, device=device)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def barrier(self, opts=None):
        sig = signature(Kind.BARRIER)
        scratch = self._engine.scratch
        return self._submit("barrier", sig, lambda ch, h: coll.barrier(ch, scratch),
                            [], [], [], [], opts=opts)

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False):
        """Rank 0 collects a token from every rank within ``timeout`` and names the missing."""
        secs = timeout_seconds(timeout if timeout is not None else self._timeout,
                               f"mccl monitored_barrier(timeout={timeout!r})")
        mesh = self._mesh
        sig = signature(Kind.MONITORED_BARRIER)
        work = self._submit(
            "monitored_barrier", sig,
            lambda ch, h: monitored_barrier(mesh, _MONITOR_TAG, secs, wait_all_ranks),
            [], [], [], [], collective=False)
        work.wait()

    # ---- point to point ----
    def send(self, tensors, dst: int, tag: int = 0):
        op_name = "send"
        t = self._one(op_name, tensors)
        dst = self._peer(op_name, dst)
        tag = self._tag(op_name, tag)
        device = self._device_of(op_name, [t])
        sig = signature(Kind.SEND_RECV, wire_dtype(t))
        mesh = self._mesh
        if not isinstance(self._adapter(device), CpuAdapter):
            # A device tensor takes its turn in the ordered queue, so the hand-off applies;
            # then the send is parked until written, not holding up the ops behind it.
            def park(ch, h, done):
                def written(err):
                    done(None if err is None else mesh.send_failure(dst))

                if mesh.send(dst, P2P, sig, 0, coll.as_bytes(h[0]), tag=tag, on_done=written):
                    done()

            return self._submit(op_name, sig, None, [t], [True], [False], [t], collective=False,
                                device=device, park=park)
        self._engine.check_running(op_name)
        work = Work(op_name, [t])

        engine = self._engine

        def failed(cause: BaseException) -> None:
            """Fail the send; where this rank's own shutdown or abort cut it, or the group's
            failure (which closes the connections), say so, not what the broken socket seems
            to say of the peer. Else the group breaks with ``cause``, as it does where a
            receive or a device tensor's send fails, so the ops issued after this send fail
            with it and the peers hear why (a group that went on would leave its next op
            waiting on a rank that cannot join it)."""
            here, broke = engine.closed_here(), engine.error
            if here is not None:
                work.fail(CollectiveError(f"mccl send to rank {dst}: {here}", op="send"))
            elif broke is not None:
                work.fail(CollectiveError(f"mccl send to rank {dst} failed: the group failed "
                                          f"first: {broke}", op="send", peer=broke.peer))
            else:
                engine.fail_outside(op_name, sig, cause, work)

        def done(err):
            if err is None:
                work.complete()
            else:  # the sender thread's OSError, explained (e.g. no progress for the timeout,
                failed(mesh.send_failure(dst))  # or the report the peer left before closing)

        broken = engine.error  # (its connections close only seconds after it broke)
        if broken is not None:
            work.fail(CollectiveError(f"mccl send to rank {dst} not sent: the group failed "
                                      f"earlier: {broken}", op="send", peer=broken.peer))
            return self._coalesce(work)
        try:
            mesh.check_open(dst)  # no reader watches an idle group: look before sending
            # (a strided or lazy neg/conj view goes out as a plain copy, taken now: a send's
            # snapshot)
            plain = plain_copy(t) if needs_copy(t) else t
            if mesh.send(dst, P2P, sig, 0, coll.as_bytes(plain), tag=tag, on_done=done):
                work.complete()
        except Exception as e:  # noqa: BLE001 - PeerError, or a bug: the Work says which
            failed(e)
        return self._coalesce(work)

    def _coalesce(self, work: Work) -> Work:
        """``work`` joins the open coalescing block, if any."""
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def recv(self, tensors, src: int, tag: int = 0):
        op_name = "recv"
        t = self._one(op_name, tensors)
        return self._post_recv(op_name, t, self._peer(op_name, src), self._tag(op_name, tag))

    def recv_anysource(self, tensors, tag: int = 0):
        op_name = "recv_anysource"
        return self._post_recv(op_name, self._one(op_name, tensors), None,
                               self._tag(op_name, tag))

    def _post_recv(self, op_name: str, t: torch.Tensor, src: int | None, tag: int) -> Work:
        """A receive takes its turn in the queue (for the hand-off of its tensor), then waits
        aside for its message (``Job.park``): ops issued after it are not held up."""
        mesh = self._mesh
        sig = signature(Kind.SEND_RECV, wire_dtype(t))

        def park(ch, h, done):
            mesh.post_recv(src, tag, coll.as_bytes(h[0]), lambda pr: done(source=pr.source),
                           dtype=sig.dtype)

        return self._submit(op_name, sig, None, [t], [False],
                            [True], [t], collective=False, park=park)

    # ---- coalescing ----
    def _start_coalescing(self, device=None) -> None:
        if self._coalesced is not None:
            # torch's coalescing manager never nests; it leaves without _end_coalescing when
            # its block (or the coalesced op it issues at the end) raised: start afresh
            log.debug("mccl: a coalescing block ended without _end_coalescing; starting anew")
        self._coalesced = []

    def _end_coalescing(self, device=None):
        works, self._coalesced = self._coalesced or [], None
        return GroupWork("coalesced", works)

    # ---- lifecycle ----
    def shutdown(self) -> None:
        self._end()
        self._engine.shutdown(abort=False)

    def abort(self) -> None:
        self._end()
        self._engine.shutdown(abort=True)

    def _end(self) -> None:
        if self._member is not None:
            self._member.end()

    def _shutdown(self) -> None:
        self.shutdown()

    def set_timeout(self, timeout: timedelta) -> None:
        """The group timeout from now on, on this rank: for later ops and for the waits of
        ops under way (their silence from a peer is measured against the new value)."""
        timeout_s = _seconds(timeout)
        self._timeout = timeout
        self._mesh.set_timeout(timeout_s)  # the engine's op deadlines read it there


def _weakly(method: Callable[[CollectiveError], None]) -> Callable[[CollectiveError], None]:
    """``method`` called through a weak reference to its object: the engine's hook must not
    keep the group alive, or the group, its engine and its store (whose host keeps the
    master port) outlive ``destroy_process_group`` until the cycle collector runs, and a
    re-init on that port finds it taken."""
    ref = weakref.WeakMethod(method)

    def call(err: CollectiveError) -> None:
        bound = ref()
        if bound is not None:
            bound(err)
    return call


#: ``create`` said once that it ignores ``pg_options``.
_said_options = False
#: This process's default group (``init_process_group``), while it lives.
_default_group: weakref.ref[ProcessGroupMCCL] | None = None


def _known_gone(global_ranks) -> str | None:
    """Why one of ``global_ranks`` is known to be gone, for a group being formed
    (``watch_liveness``): its connection in the default group closed or reset without a BYE.
    Only while the default group is healthy here: after a failure, live ranks close their
    connections without a BYE too (and a subgroup may be aborted while its ranks live on)."""
    pg = _default_group() if _default_group is not None else None
    if pg is None:
        return None
    engine, mesh = pg._engine, pg._mesh
    if engine.error is not None or mesh.closed:
        return None
    for g in global_ranks:
        if g == pg._rank or not 0 <= g < pg._size:
            continue
        why = mesh.peer(g).gone()
        if why is not None:
            return f"global rank {g} is gone ({why}, seen in the default group)"
    return None


watch_liveness(_known_gone)


def create(dist_opts, backend_options=None) -> ProcessGroupMCCL:
    """The creator registered with torch.distributed (extended API). mccl has no backend
    options (gloo ignores them too); one passed in is named once in a warning rather than
    dropped without a word."""
    global _said_options
    if backend_options is not None and not _said_options:
        _said_options = True
        log.warning("mccl takes no backend options: pg_options=%s is ignored (the timeout and "
                    "device come from init_process_group's own arguments)",
                    type(backend_options).__name__)
    return ProcessGroupMCCL(
        dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
        group_name=dist_opts.group_id, global_ranks=dist_opts.global_ranks_in_group,
    )
