"""A semantic stand-in for Horovod (``horovod.torch`` is in torch.py), for tests only: never installed; tests
load it with tests/popdist_stand_in.py ``install_horovod`` or put tests/fake_popdist on PYTHONPATH.

Graphcore's BERT app runs Horovod beside PopDist under PopRun (graphcore/examples nlp/bert/pytorch
args.py:46 ``hvd.init()``, optimization.py:89 ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``,
utils.py:43-45 ``hvd.allreduce`` of the logged metrics). The stand-in's instances are separate processes that
share no memory and, by default, no run directory: its collectives travel through a directory the test names
in ``HOROVOD_STAND_IN_DIR``, which stands for the network between the hosts and nothing else.
"""

__version__ = "0.24.0+stand-in"
__stand_in__ = True
