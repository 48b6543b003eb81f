"""retrace for Python: record a PyTorch training loop into retrace's trace and checkpoints.

    import retrace
    rec = retrace.Recorder.create("runs/mine", model, optimizer, seed=7, config={"lr": 1e-3})
    for batch_indices, x, y in loader:
        ...  # forward, backward, optimizer.step()
        rec.step(loss, batch=batch_indices)
    rec.checkpoint()
    # after a crash: rec = retrace.Recorder.resume("runs/mine", model, optimizer)

The run directory is laid out like ``retrace record``'s, so ``retrace inspect``, ``verify``,
``diff``, ``export`` and ``report`` read it. See docs/python.md.
"""
import torch  # first: the compiled module's LibTorch is this torch's, already loaded

from . import _core
from .errors import ConfigError, Error, FormatError, IntegrityError, InvariantError, IoError
from ._core import data_order
from .recorder import Recorder, python_generators, restore_python_generators, seed_all

_torch_version = torch.__version__.split("+")[0]
if _torch_version != _core.torch_version:
    raise ImportError(
        f"retrace's module was built against LibTorch {_core.torch_version}, this Python has torch "
        f"{torch.__version__}; rebuild it with this torch (pip install --no-build-isolation .)"
    )

__all__ = [
    "Recorder",
    "data_order",
    "Error",
    "ConfigError",
    "FormatError",
    "IntegrityError",
    "IoError",
    "InvariantError",
    "python_generators",
    "restore_python_generators",
    "seed_all",
]
