"""The enums of python/enums.py, with its members in its order."""

from __future__ import annotations

import enum

from ._names import API


# ---- enums (python/enums.py) --------------------------------------------------------------------------


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.IntEnum):
    Running = 0
    Post = 1
    PostAndLoss = 2


class OutputMode(enum.IntEnum):
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class AutoStage(enum.IntEnum):
    SameAsIpu = 0
    AutoIncrement = 1


class DataLoaderMode(enum.IntEnum):
    Sync = 0
    Async = 1
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class MatMulSerializationMode(enum.Enum):
    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class ConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2


for _enum in (ReductionType, MeanReductionStrategy, OutputMode, AutoStage, DataLoaderMode, SharingStrategy,
              MatMulSerializationMode, ConnectionType):
    # python/enums.py's members, in its order (the values are the stand-in's)
    assert list(_enum.__members__) == sorted(
        (m.split(".", 1)[1] for m in API["enum"] if m.split(".", 1)[0] == _enum.__name__),
        key=list(_enum.__members__).index,
    ), _enum
