"""How the PopRun instances of one run exchange a few numbers, agree on their start, and reduce each step.

Every PopRun instance plans its run alone: it resolves ``checkpoint.resume`` from its own view of the run
directory and builds (or loads) its own weights. Before the first step the instances exchange what they
start from (``agree_on_start``), through an ``InstanceGroup`` (below):

- the step (a resumed checkpoint's, else 0) and whether it was resumed: instances that would start from
  different steps stop, every one, in one line naming each instance's start. Such a run would mix two
  trainings on one device-wide gradient reduction, or hang when one instance ran out of steps first;
- a sha256 of the weights (``weights_digest``: every tensor of the state dict, by sorted name, with its
  dtype and shape). With horovod.torch, instance 0's weights are then broadcast to the others
  (``hvd.broadcast_parameters``, as Graphcore's app does), so a fresh start agrees even where equal seeds
  did not give equal weights; a resumed start must already agree, since the optimizer state the checkpoint
  restores is not broadcast. Without horovod (the directory fallback) the weights must agree as they are;
- then, once instance 0 tried to take the run directory's lock, whether each instance is ready
  (``agree_ready``): when instance 0 cannot take it, every instance stops.

Every host call the instances then reduce their share of the step (the runner's ``reduce_metrics``,
runner_common.reduce_over_instances): losses and accuracies
averaged (each instance holds the same number of replicas), sequences, tokens and packs summed, the step's
seconds and the compile seconds the slowest instance's. Without horovod that exchange would go through the
file system every host call; the fallback does not, and a record says how many instances it covers.

The poptorch runner (poptorch_backend.py) calls these as its host collectives (execution/runner.py, Runner).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from .. import jsonin
from ..errors import ConfigError, LaunchError, UserError, one_line
from ..fsutil import atomic_write_text, open_regular
from .popdist_backend import Launch


class InstancesUnreachable(UserError):
    """The instances of a PopRun run could not meet to agree on their start."""


RENDEZVOUS_DIR = ".instances"
"""Where ``DirectoryGroup`` meets, inside the run directory."""
RENDEZVOUS_TIMEOUT_ENV = "IPU_PACKING_RENDEZVOUS_TIMEOUT"
RENDEZVOUS_TIMEOUT_S = 300.0


def rendezvous_timeout() -> float:
    """Seconds an instance waits for the others in ``DirectoryGroup`` (``$IPU_PACKING_RENDEZVOUS_TIMEOUT``,
    else 300: long enough for the slowest host to load the checkpoint and for a network file system to show
    a new file)."""
    value = os.environ.get(RENDEZVOUS_TIMEOUT_ENV)
    if not value:
        return RENDEZVOUS_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError("%s must be a number of seconds, got %r" % (RENDEZVOUS_TIMEOUT_ENV, value))
    if not seconds > 0:
        raise ConfigError("%s must be above 0, got %r" % (RENDEZVOUS_TIMEOUT_ENV, value))
    return seconds


class InstanceGroup:
    """The instances of one PopRun run and how they exchange a few numbers."""

    num_instances = 1
    instance = 0
    transport = ""
    """How the instances exchange, in words (logged at the start)."""
    reduces_metrics = False
    """Whether ``allgather`` is cheap enough to run every host call (a network collective)."""
    broadcasts = False
    """Whether ``broadcast_parameters`` can send instance 0's weights to the others."""

    def allgather(self, row: Sequence[float], name: str) -> List[List[float]]:
        """Every instance's ``row`` (the same length on all), in instance order; a collective: every
        instance calls it with the same ``name``, in the same order."""
        raise NotImplementedError

    def broadcast_parameters(self, state_dict: Dict[str, Any]) -> bool:
        """Overwrite ``state_dict``'s tensors in place with instance 0's; False where the transport cannot."""
        return False


class HorovodGroup(InstanceGroup):
    """The SDK's ``horovod.torch``, initialised as Graphcore's app does (args.py:44-46)."""

    reduces_metrics = True
    broadcasts = True

    def __init__(self, hvd, launch: "Launch") -> None:
        self.hvd = hvd
        try:
            hvd.init()
        except Exception as exc:  # e.g. a wheel built without MPI, under poprun's mpirun
            raise LaunchError(
                "horovod.torch imports but hvd.init() failed under poprun (%s: %s): install the Poplar SDK's "
                "horovod wheel (built with MPI), or uninstall horovod to meet through the run directory"
                % (type(exc).__name__, one_line(exc)[:160]))
        if (hvd.size(), hvd.rank()) != (launch.num_instances, launch.instance):
            raise LaunchError(
                "horovod reports process %d of %d but popdist instance %d of %d: launch the run with poprun, "
                "which starts one process per instance"
                % (hvd.rank(), hvd.size(), launch.instance, launch.num_instances))
        self.num_instances, self.instance = launch.num_instances, launch.instance
        self.transport = "horovod.torch (collectives over the network)"

    def allgather(self, row: Sequence[float], name: str) -> List[List[float]]:
        import torch

        tensor = torch.tensor([[float(v) for v in row]], dtype=torch.float64)
        gathered = self.hvd.allgather(tensor, name=name)
        return [[float(v) for v in part] for part in gathered.tolist()]

    def broadcast_parameters(self, state_dict: Dict[str, Any]) -> bool:
        self.hvd.broadcast_parameters(state_dict, root_rank=0)
        return True


class DirectoryGroup(InstanceGroup):
    """Meeting through files in ``directory`` (without Horovod): each ``allgather`` is one handshake, so it
    is for the start only. Files left by an earlier run of the same directory are never taken for this one's:

    1. instance i > 0 writes ``<name>.hello.<i>`` = (a fresh nonce, its row);
    2. instance 0, once it has a hello from everyone, writes ``<name>.rows`` = (its own fresh nonce, the
       nonce and row of every instance), and rewrites it while any hello changes;
    3. instance i accepts a ``<name>.rows`` that carries its own nonce, and answers ``<name>.ack.<i>`` =
       instance 0's nonce; instance 0 returns once every instance acknowledged its nonce.

    Each file is written whole and renamed into place. An instance that waits longer than ``timeout``
    seconds raises InstancesUnreachable naming what it did not see."""

    def __init__(self, directory: str, launch: "Launch", timeout: float,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.directory = directory
        self.num_instances, self.instance = launch.num_instances, launch.instance
        self.timeout = timeout
        self.transport = "files in %s (no horovod.torch: needs storage every host shares)" % (directory,)
        self._sleep = sleep

    def _path(self, name: str, kind: str, instance: Optional[int] = None) -> str:
        return os.path.join(self.directory, "%s.%s" % (name, kind) + ("" if instance is None else ".%d" % instance))

    def _write(self, path: str, value: Any) -> None:
        atomic_write_text(path, json.dumps(value))

    @staticmethod
    def _read(path: str, kind: type = dict) -> Any:
        """The JSON value at ``path`` if it is a ``kind``, else None (absent, partial, or foreign: a FIFO or a device
        there is foreign, never opened to block or read without end, fsutil.open_regular)."""
        try:
            with open_regular(path, "r", encoding="utf-8") as f:
                value = jsonin.load(f)
        except (OSError, ValueError, RecursionError, UserError):
            return None
        return value if isinstance(value, kind) else None

    def _unreachable(self, missing: List[int], what: str) -> InstancesUnreachable:
        return InstancesUnreachable(
            "PopRun instance %d %s %s in %s within %.0f s: the run has no horovod.torch, so the instances meet "
            "through files in the run directory; is checkpoint.output_dir on storage every host shares? (or "
            "install the Poplar SDK's horovod wheel, as Graphcore's app does)"
            % (self.instance, what, _instances(missing), self.directory, self.timeout))

    def allgather(self, row: Sequence[float], name: str) -> List[List[float]]:
        os.makedirs(self.directory, exist_ok=True)
        row = [float(v) for v in row]
        nonce = uuid.uuid4().hex
        deadline = time.monotonic() + self.timeout
        pause = 0.005
        others = range(1, self.num_instances)
        if self.instance:
            self._write(self._path(name, "hello", self.instance), {"nonce": nonce, "row": row})
            while True:
                rows = self._read(self._path(name, "rows"))
                if (rows and isinstance(rows.get("nonces"), list) and len(rows["nonces"]) == self.num_instances
                        and rows["nonces"][self.instance] == nonce and isinstance(rows.get("rows"), list)):
                    self._write(self._path(name, "ack", self.instance), rows["nonce"])
                    return rows["rows"]
                if time.monotonic() > deadline:
                    raise self._unreachable([0], "saw no answer of")
                self._sleep(pause)
                pause = min(0.25, pause * 2)
        written = None
        while True:
            hellos = {i: self._read(self._path(name, "hello", i)) for i in others}
            if all(h and "nonce" in h and isinstance(h.get("row"), list) and len(h["row"]) == len(row)
                   for h in hellos.values()):
                table = {"nonce": nonce, "nonces": [nonce] + [hellos[i]["nonce"] for i in others],
                         "rows": [row] + [hellos[i]["row"] for i in others]}
                if table != written:
                    self._write(self._path(name, "rows"), table)
                    written = table
                acked = [i for i in others if self._read(self._path(name, "ack", i), str) == nonce]
                if len(acked) == len(others):
                    return table["rows"]
                missing = [i for i in others if i not in acked]
            else:
                missing = [i for i in others if not hellos[i]]
            if time.monotonic() > deadline:
                raise self._unreachable(missing, "heard nothing from")
            self._sleep(pause)
            pause = min(0.25, pause * 2)


def _instances(indices: List[int]) -> str:
    return ("instance %d" if len(indices) == 1 else "instances %s") % (
        indices[0] if len(indices) == 1 else ", ".join(str(i) for i in indices),)


def import_horovod() -> Optional[Any]:
    """``horovod.torch`` (the Poplar SDK ships a wheel; Graphcore's app requires it), or None."""
    try:
        import horovod.torch as hvd  # noqa: F401  (Poplar SDK / horovod[pytorch])
    except ImportError:
        return None
    return hvd


def instance_group(launch: Optional["Launch"], run_dir: str) -> Optional[InstanceGroup]:
    """How this run's PopRun instances exchange (HorovodGroup where horovod.torch imports, else a
    DirectoryGroup in ``run_dir``), or None for one instance (and for the torch backend: ``launch`` None)."""
    if launch is None or launch.num_instances <= 1:
        return None
    hvd = import_horovod()
    if hvd is not None:
        return HorovodGroup(hvd, launch)
    return DirectoryGroup(os.path.join(run_dir, RENDEZVOUS_DIR), launch, rendezvous_timeout())


class InstancesDisagree(UserError):
    """PopRun instances would start from different steps or weights."""


def weights_digest(state_dict: Dict[str, Any]) -> str:
    """sha256 over every tensor of ``state_dict`` in sorted name order: name, dtype, shape, then the bytes."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        value = state_dict[name]
        if not isinstance(value, torch.Tensor):
            h.update(("%s=%r;" % (name, value)).encode())
            continue
        t = value.detach().cpu().contiguous()
        h.update(("%s:%s:%s;" % (name, str(t.dtype), list(t.shape))).encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_WORDS = 8  # the digest as 8 words of 32 bits: exact in a float64 row


def _digest_words(digest: str) -> List[float]:
    return [float(int(digest[8 * i : 8 * i + 8], 16)) for i in range(_WORDS)]


def _words_digest(words: Sequence[float]) -> str:
    return "".join("%08x" % int(w) for w in words)


def _group(indices: List[int]) -> str:
    return ("instance %d" % indices[0]) if len(indices) == 1 else "instances %s" % ", ".join(str(i) for i in indices)


def _start(resumed: bool, step: int, plural: bool) -> str:
    if resumed:
        return ("resume step %d" if plural else "resumes step %d") % step
    return ("start at step %d" if plural else "starts at step %d") % step


def agree_on_start(group, step: int, resumed: bool, model: torch.nn.Module,
                   log: Callable[[str], None] = lambda m: None) -> None:
    """Exchange (step, resumed, weights digest) with every instance and raise InstancesDisagree (one line
    naming the instances) unless all agree; then, with horovod, broadcast instance 0's weights into
    ``model``. Runs before anything is written."""
    digest = weights_digest(model.state_dict())
    row = [float(step), 1.0 if resumed else 0.0] + _digest_words(digest)
    rows = group.allgather(row, name="ipu_packing.start")
    starts = [(bool(r[1]), int(r[0])) for r in rows]
    if len(set(s for _, s in starts)) > 1:
        parts = []  # type: List[str]
        seen = []  # type: List[Any]
        for start in starts:
            if start not in seen:
                seen.append(start)
                indices = [i for i, s in enumerate(starts) if s == start]
                parts.append("%s %s" % (_group(indices), _start(start[0], start[1], len(indices) > 1)))
        raise InstancesDisagree("PopRun instances disagree on where to start: %s (is checkpoint.output_dir on "
                                "storage every host shares?)" % ", ".join(parts))
    digests = [_words_digest(r[2 : 2 + _WORDS]) for r in rows]
    fresh = not any(resumed for resumed, _ in starts)
    if len(set(digests)) > 1 and not (fresh and group.broadcasts):
        parts = []
        for d in dict.fromkeys(digests):
            parts.append("%s sha256 %s" % (_group([i for i, x in enumerate(digests) if x == d]), d[:12]))
        why = ("each instance resumed its own copy of the checkpoint: is checkpoint.output_dir on storage every "
               "host shares?" if not fresh else
               "equal seeds built different weights, or checkpoint.init_from differs between hosts; with "
               "horovod.torch instance 0's would be broadcast")
        raise InstancesDisagree("PopRun instances disagree on the weights at step %d: %s (%s)"
                                % (step, ", ".join(parts), why))
    if group.broadcasts:
        group.broadcast_parameters(model.state_dict())
        after = weights_digest(model.state_dict())
        log("PopRun: %d instances start at step %d from instance 0's weights (sha256 %s, broadcast through %s)"
            % (group.num_instances, step, after[:12], group.transport))
    else:
        log("PopRun: %d instances start at step %d from the same weights (sha256 %s, checked through %s)"
            % (group.num_instances, step, digest[:12], group.transport))


def agree_ready(group, refused: Optional[UserError]) -> None:
    """After instance 0 tried to take the run directory's lock: raise ``refused`` (this instance's own reason
    not to start), or InstancesDisagree where another instance could not start, so that all stop together."""
    rows = group.allgather([0.0 if refused is not None else 1.0], name="ipu_packing.ready")
    if refused is not None:
        raise refused
    not_ready = [i for i, r in enumerate(rows) if r[0] != 1.0]
    if not_ready:
        raise InstancesDisagree("PopRun %s could not start (%s error line says why): every instance stops"
                                % (_group(not_ready), "its" if len(not_ready) == 1 else "their"))

__all__ = ["DirectoryGroup", "HorovodGroup", "InstanceGroup", "InstancesDisagree", "InstancesUnreachable",
           "RENDEZVOUS_DIR", "agree_on_start", "agree_ready", "import_horovod", "instance_group", "rendezvous_timeout",
           "weights_digest"]
