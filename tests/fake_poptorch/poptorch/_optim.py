"""The optimizers (python/optim.py): torch's param groups plus an IPU state."""

from __future__ import annotations


import torch

from ._names import Error, _kwargs_of


# ---- optimizers (python/optim.py) ---------------------------------------------------------------------


class Optimizer(torch.optim.Optimizer):
    """poptorch.optim.Optimizer: torch's param groups plus an IPU state ("ipu_state", "ipu_param")."""

    _hyper = ()  # type: Tuple[str, ...]

    def __init__(self, params, **kwargs) -> None:
        unknown = set(kwargs) - set(self._hyper)
        if unknown:
            raise TypeError("poptorch.optim.%s got unexpected arguments %s" % (type(self).__name__, sorted(unknown)))
        self.kwargs = kwargs
        super().__init__(params, {k: v for k, v in kwargs.items() if v is not None})
        self._state_dict = {"ipu_state": None, "ipu_param": None}  # type: Dict[str, Any]
        self.ipu_state_is_dirty = False
        self.host_state_is_dirty = False

    def step(self, closure=None):  # pragma: no cover - the IPU steps, never the host
        raise Error("poptorch optimizers step on the IPU")

    def state_dict(self):
        return self.get_state_dict()

    def load_state_dict(self, state):
        torch.optim.Optimizer.load_state_dict(self, state)
        self.set_state_dict(state)

    def get_state_dict(self):
        return dict(self._state_dict, **torch.optim.Optimizer.state_dict(self))

    def set_state_dict(self, state):
        if not state:
            raise RuntimeError("Cannot load optimizer state dictionary because it is empty.")
        if not ("ipu_state" in state and "ipu_param" in state):
            raise RuntimeError("Only IPU optimizer states can be loaded onto the IPU.")
        self._state_dict = state
        self.ipu_state_is_dirty = True
        self.host_state_is_dirty = False

    def has_state(self) -> bool:
        return self._state_dict.get("ipu_state") is not None and self._state_dict.get("ipu_param") is not None


def _optimizer(name: str):
    """poptorch.optim.``name``, taking exactly the keyword arguments of its python/optim.py __init__."""
    return type(name, (Optimizer,), {"_hyper": tuple(k for k in _kwargs_of("optim", name) if k != "params")})


class optim:  # noqa: N801  (poptorch.optim is a module; a namespace class serves here)
    SGD = _optimizer("SGD")
    Adam = _optimizer("Adam")
    AdamW = _optimizer("AdamW")
    RMSprop = _optimizer("RMSprop")
    LAMB = _optimizer("LAMB")
    Optimizer = Optimizer
