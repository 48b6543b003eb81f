"""The Recorder for a Python training loop (the C++ retrace::Recorder's meaning, in Python's idiom).

What it records each step, into the run directory's hash-chained trace: the loss (and its float32
bits), the LR, the gradient norms you pass, the batch's digest, and digests of every parameter and
buffer, their gradients and the optimizer's state, per module too, and of every random generator
(torch's CPU and CUDA, Python's ``random``, NumPy's global one) and the data position. A checkpoint
holds the model, the optimizer's state, those generators, the data position and your own state
(a sampler's, an LR scheduler's) in retrace's verified format. The digests are computed by the
same C++ code as a C++ loop's and ``retrace record``'s at the same trace.digest_version (4).
"""
import json
import math
import random
import struct
import sys

import torch

from . import _core
from .errors import ConfigError, FormatError

_ADAMW_FIELDS = ("step", "exp_avg", "exp_avg_sq")


# ---- Python's generators as canonical bytes (not pickle) ---------------------------------------

def _random_bytes(state):
    version, internal, gauss = state
    if version != 3 or len(internal) != 625:
        raise ConfigError(f"random.getstate() has version {version} with {len(internal)} words; "
                          "retrace captures version 3 (625 words)")
    out = struct.pack("<I", version) + struct.pack("<625I", *internal)
    out += struct.pack("<?d", gauss is not None, 0.0 if gauss is None else gauss)
    return out


def _random_state(blob):
    if len(blob) != 4 + 625 * 4 + 9:
        raise FormatError(f"the checkpoint's python.random state is {len(blob)} bytes, expected {4 + 625 * 4 + 9}")
    version = struct.unpack_from("<I", blob, 0)[0]
    internal = struct.unpack_from("<625I", blob, 4)
    has_gauss, gauss = struct.unpack_from("<?d", blob, 4 + 625 * 4)
    return (version, tuple(internal), gauss if has_gauss else None)


def _numpy():
    return sys.modules.get("numpy")  # only when the loop uses NumPy (torch imports it when installed)


def _numpy_bytes(state):
    name, keys, pos, has_gauss, cached = state[:5]
    np = _numpy()
    return (name.encode().ljust(16, b"\0") + np.asarray(keys, dtype="<u4").tobytes() +
            struct.pack("<qqd", int(pos), int(has_gauss), float(cached)))


def _numpy_state(blob):
    np = _numpy()
    if np is None or len(blob) != 16 + 624 * 4 + 24:
        raise FormatError(f"the checkpoint's numpy.global state is {len(blob)} bytes, expected {16 + 624 * 4 + 24}")
    name = blob[:16].rstrip(b"\0").decode()
    keys = np.frombuffer(blob[16:16 + 624 * 4], dtype="<u4").astype(np.uint32)
    pos, has_gauss, cached = struct.unpack_from("<qqd", blob, 16 + 624 * 4)
    return (name, keys, pos, has_gauss, cached)


def python_generators():
    """The states of Python's ``random`` and NumPy's global generator, as (name, bytes) pairs."""
    out = [("python.random", _random_bytes(random.getstate()))]
    np = _numpy()
    if np is not None:
        out.append(("numpy.global", _numpy_bytes(np.random.get_state())))
    return out


def seed_all(seed):
    """Seeds every generator a Recorder captures: torch's (CPU and every CUDA device), Python's
    ``random`` and NumPy's global one. Python seeds ``random`` and NumPy from the OS at start, so a
    loop that does not seed them records another RNG digest in every process."""
    torch.manual_seed(seed)
    random.seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed % 2**32)


def restore_python_generators(generators):
    """Sets Python's ``random`` and NumPy's global generator from python_generators()' pairs."""
    for name, blob in generators:
        if name == "python.random":
            random.setstate(_random_state(bytes(blob)))
        elif name == "numpy.global":
            np = _numpy()
            if np is None:
                raise ConfigError("the run captured NumPy's global generator; import numpy before resuming")
            np.random.set_state(_numpy_state(bytes(blob)))


# ---- the config as TOML text ------------------------------------------------------------------

def _toml_value(v, where):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x, where) for x in v) + "]"
    raise ConfigError(f"config value {where} is a {type(v).__name__}; use numbers, strings, booleans, lists "
                      "and nested dicts")


def _bare(key):
    key = str(key)
    if not key or any(not (c.isascii() and (c.isalnum() or c in "_-")) for c in key):
        raise ConfigError(f"config key {key!r}: use letters, digits, _ and - (a bare TOML key)")
    return key


def to_toml(config, prefix=""):
    """A dict of settings as TOML text (scalars first, then one table per nested dict)."""
    if config is None:
        return ""
    if isinstance(config, str):
        return config
    lines, tables = [], []
    for k, v in config.items():
        if v is None:
            continue  # TOML has no null: an unset setting is an absent key
        if isinstance(v, dict):
            tables.append((_bare(k), v))
        else:
            lines.append(f"{_bare(k)} = {_toml_value(v, prefix + str(k))}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables:
        name = prefix + k
        text += f"\n[{name}]\n" + to_toml(v, name + ".")
    return text


# ---- the optimizer ---------------------------------------------------------------------------

def _optimizer_kind(optimizer):
    if optimizer is None:
        return ""
    if isinstance(optimizer, torch.optim.AdamW):
        for group in optimizer.param_groups:
            if group.get("amsgrad", False):
                raise ConfigError("AdamW with amsgrad=True keeps max_exp_avg_sq, which retrace does not store; "
                                  "use amsgrad=False")
        return "adamw"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    return ""  # another optimizer: no optimizer digest and no checkpoint (as in C++)


def _scalar_dtype():
    import torch.optim.optimizer as optimizer_module

    f = getattr(optimizer_module, "_get_scalar_dtype", None)
    return f() if f else torch.float32


def _hyperparameters(group):
    """A param group's settings that a schedule may change (numbers, booleans, strings, tuples of
    numbers), JSON-able; tensors and the parameters themselves are left out."""
    out = {}
    for k, v in group.items():
        if k == "params":
            continue
        if v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
        elif isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) for x in v):
            out[k] = list(v)
    return out


def _json_state(obj, what):
    try:
        return json.dumps(obj, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what} cannot be stored in a checkpoint: {e}; keep it to JSON values") from None


class Recorder:
    """Records a PyTorch training loop: ``create`` (or ``resume``), then ``step`` after every
    optimizer step, ``checkpoint`` now and then, ``evaluate`` for evaluations."""

    def __init__(self, core, model, optimizer, kind, capture_python_rng, state_objects):
        self._core = core
        self._model = model
        self._optimizer = optimizer
        self._kind = kind
        self._capture_python_rng = capture_python_rng
        self._state_objects = dict(state_objects or {})
        self._optimizer_every = 1
        self.epoch = 0
        self.batch_in_epoch = 0
        self.samples_seen = 0
        self.data_state = None  # after resume: what checkpoint(data_state=...) stored
        self._overlap = False
        self._pending = False  # a step's overlapped digests may still be running

    # -- the state, as the C++ core takes it -------------------------------------------------
    def _named_params(self):
        return list(self._model.named_parameters())

    def _optimizer_state(self, params):
        opt = self._optimizer
        out = []
        if not self._kind:
            return out
        for name, p in params:
            st = opt.state.get(p)
            if not st:
                continue
            if self._kind == "adamw":
                step = st["step"]  # a float32 tensor, on the parameter's device when capturable or fused:
                # converted where it lives, so the step reads nothing back from a GPU
                step = step.to(torch.int64) if torch.is_tensor(step) else torch.tensor(int(step), dtype=torch.int64)
                out.append((name + "/step", step))
                out.append((name + "/exp_avg", st["exp_avg"]))
                out.append((name + "/exp_avg_sq", st["exp_avg_sq"]))
            elif st.get("momentum_buffer") is not None:
                out.append((name + "/momentum_buffer", st["momentum_buffer"]))
        return out

    def _state(self, with_optimizer=True, for_checkpoint=False):
        s = _core.LoopState()
        params = self._named_params()
        s.parameters = params
        s.buffers = list(self._model.named_buffers())
        s.optimizer_kind = self._kind
        if with_optimizer:
            s.optimizer = self._optimizer_state(params)
        device = next((p.device for _, p in params if p.is_cuda), None)
        s.cuda_device = device.index if device is not None and device.index is not None else (
            torch.cuda.current_device() if device is not None else -1)
        if self._capture_python_rng is True or (for_checkpoint and self._capture_python_rng == "checkpoint"):
            s.generators = python_generators()
        s.epoch = self.epoch
        s.batch_in_epoch = self.batch_in_epoch
        s.samples_seen = self.samples_seen
        return s

    def _install_waits(self):
        """With overlapped digests the worker reads the step's tensors while the loop goes on: wait
        for it before the optimizer changes them, before gradients are zeroed in place and before
        backward accumulates into a gradient."""
        def wait():  # a Python flag first: only the first hook after a step calls into C++
            if self._pending:
                self._pending = False
                self._core.wait()

        self._overlap = True
        if self._optimizer is not None:
            self._optimizer.register_step_pre_hook(lambda *args: wait())
            zero_grad = self._optimizer.zero_grad

            def waiting_zero_grad(*args, **kwargs):
                wait()
                return zero_grad(*args, **kwargs)

            self._optimizer.zero_grad = waiting_zero_grad
        model_zero_grad = self._model.zero_grad

        def waiting_model_zero_grad(*args, **kwargs):
            wait()
            return model_zero_grad(*args, **kwargs)

        self._model.zero_grad = waiting_model_zero_grad
        for p in self._model.parameters():
            if p.requires_grad:
                p.register_hook(lambda grad: wait())

    def wait(self):
        """Waits for the last step's overlapped digests (``overlap_digests``): needed only before a
        change to parameters, buffers or optimizer state outside optimizer.step(), zero_grad() and
        backward, which wait by themselves."""
        self._pending = False
        self._core.wait()

    # -- the API -----------------------------------------------------------------------------
    @classmethod
    def create(cls, dir, model, optimizer=None, *, seed=0, config=None, description="", data_files=(),
               force=False, keep_last=5, digest_version=4, module_digests=True, optimizer_digest_every=1,
               capture_python_rng=True, overlap_digests=False, state_objects=None):
        """Creates the run directory ``dir`` (ConfigError when it exists and is not empty, unless
        ``force``) with the config (a dict, or TOML text) and a trace whose header describes the
        model's parameters and buffers and this process's numerics.

        ``state_objects``: objects with state_dict()/load_state_dict() (an LR scheduler, a
        sampler) whose JSON-able state every checkpoint stores and resume restores.

        ``capture_python_rng``: True, Python's ``random`` and NumPy's global generator in every
        step's RNG digest and every checkpoint; "checkpoint", in checkpoints only (about 45 us a
        step less); False, never.

        ``overlap_digests``: each step's digests are computed on a worker thread while the loop
        runs the next forward; optimizer.step(), zero_grad() and backward wait for it (hooks). Any
        other change to the model's tensors or the optimizer's state must call ``rec.wait()``
        first."""
        kind = _optimizer_kind(optimizer)
        rec = cls(None, model, optimizer, kind, capture_python_rng, state_objects)
        rec._optimizer_every = optimizer_digest_every
        o = _core.RecorderOptions()
        o.seed = int(seed)
        o.config_toml = to_toml(config)
        o.description = description or type(model).__name__
        o.data_files = [str(f) for f in data_files]
        o.force = bool(force)
        o.keep_last = int(keep_last)
        o.digest_version = int(digest_version)
        o.module_digests = bool(module_digests)
        o.optimizer_digest_every = int(optimizer_digest_every)
        o.overlap_digests = bool(overlap_digests)
        rec._core = _core.Recorder.create(str(dir), rec._state(with_optimizer=False), o)
        if overlap_digests:
            rec._install_waits()
        return rec

    @classmethod
    def resume(cls, dir, model, optimizer, *, capture_python_rng=True, overlap_digests=False, state_objects=None):
        # capture_python_rng, overlap_digests: as for create (what this process does from here on)
        """Continues the run in ``dir`` from its newest checkpoint that verifies: loads the model's
        parameters and buffers, the optimizer's state, torch's generators (CPU and the model's
        CUDA device), Python's and NumPy's, the state objects and the data position (``epoch``,
        ``batch_in_epoch``, ``samples_seen``, ``data_state``), and truncates the trace at the
        checkpoint (later frames are set aside, not lost). Continue at ``next_step``.
        Every value is checked before any is applied; damaged checkpoints are skipped for older
        ones. IntegrityError when none verifies; ConfigError for another optimizer."""
        kind = _optimizer_kind(optimizer)
        if not kind:
            raise ConfigError("Recorder.resume: the optimizer is not torch.optim.AdamW or SGD, whose state "
                              "retrace stores")
        rec = cls(None, model, optimizer, kind, capture_python_rng, state_objects)
        core, restored = _core.Recorder.resume(str(dir), rec._state(for_checkpoint=True))
        rec._core = core
        if overlap_digests:
            core.overlap_digests(True)
            rec._install_waits()
        rec._load_optimizer(restored.optimizer)
        restore_python_generators(restored.generators)
        rec.epoch = restored.epoch
        rec.batch_in_epoch = restored.batch_in_epoch
        rec.samples_seen = restored.samples_seen
        user = dict(restored.user)
        for name, obj in rec._state_objects.items():
            key = "state." + name
            if key not in user:
                raise FormatError(f"checkpoint of {dir} holds no state for {name!r}; it was written without it")
            obj.load_state_dict(json.loads(user[key]))
        if "data_state" in user:
            rec.data_state = json.loads(user["data_state"])
        if "optimizer.param_groups" in user:
            groups = json.loads(user["optimizer.param_groups"])
            if len(groups) != len(optimizer.param_groups):
                raise FormatError(f"the checkpoint's optimizer has {len(groups)} parameter groups, this one "
                                  f"{len(optimizer.param_groups)}")
            for g, saved in zip(optimizer.param_groups, groups):
                for k, v in saved.items():
                    g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
        return rec

    def _load_optimizer(self, entries):
        opt = self._optimizer
        index, i = {}, 0
        for group in opt.param_groups:
            for p in group["params"]:
                index[id(p)] = i
                i += 1
        by_name = dict(self._named_params())
        state = {}
        for name, t in entries:
            param, field = name.rsplit("/", 1)
            p = by_name[param]
            if id(p) not in index:
                raise FormatError(f"the checkpoint holds optimizer state of {param}, which the optimizer does not train")
            if field == "step":
                t = torch.tensor(float(t.item()), dtype=_scalar_dtype())
            state.setdefault(index[id(p)], {})[field] = t
        sd = opt.state_dict()
        opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})

    @property
    def last_step(self):
        """The last step recorded (or resumed from)."""
        return self._core.last_step

    @property
    def next_step(self):
        return self._core.last_step + 1

    @property
    def dir(self):
        return self._core.dir

    def step(self, loss, *, batch=None, lr=None, grad_norm=0.0, grad_norm_clipped=0.0, skipped=False,
             skip_reason="", batch_size=None, epoch=None, batch_in_epoch=None, step=None):
        """Records the step just taken (call it after ``optimizer.step()``).

        ``loss``: the step's loss (a tensor or a number). ``batch``: the batch's sample indices (a
        list or an integer tensor; digested as ``retrace record`` digests its batches), or any
        other tensor (digested by content). ``lr``: default, the optimizer's first group's.
        ``epoch``/``batch_in_epoch``: the batch's position in the data (default: ``rec.epoch``
        and ``rec.batch_in_epoch``, which then advance to the next batch's: set them at an epoch's
        start). ``step``: default, the last step + 1."""
        n = self._core.last_step + 1 if step is None else int(step)
        # the batch's own position (recorded, as retrace record records it); the position after the
        # step (the next batch's) goes into the RNG state and checkpoints
        batch_epoch = self.epoch if epoch is None else int(epoch)
        batch_position = self.batch_in_epoch if batch_in_epoch is None else int(batch_in_epoch)
        if torch.is_tensor(loss):
            loss = loss.detach().float().item()
        indices, content = [], None
        if batch is not None:
            if torch.is_tensor(batch) and (batch.dtype.is_floating_point or batch.dim() != 1):
                content = batch.detach()
            else:
                indices = batch.tolist() if torch.is_tensor(batch) else [int(i) for i in batch]
        if batch_size is None:
            batch_size = len(indices) if content is None else (content.shape[0] if content.dim() > 0 else 1)
        if lr is None:
            lr = self._optimizer.param_groups[0]["lr"] if self._optimizer is not None else 0.0
        self.epoch, self.batch_in_epoch = batch_epoch, batch_position + 1
        self.samples_seen += int(batch_size)
        with_optimizer = self._optimizer_every > 0 and n % self._optimizer_every == 0
        if torch.is_tensor(grad_norm):
            grad_norm = grad_norm.item()
        if torch.is_tensor(grad_norm_clipped):
            grad_norm_clipped = grad_norm_clipped.item()
        info = _core.StepInfo()
        info.lr = float(lr)
        info.grad_norm = float(grad_norm)
        info.grad_norm_clipped = float(grad_norm_clipped)
        info.skipped = bool(skipped)
        info.skip_reason = str(skip_reason)
        info.batch_size = int(batch_size)
        info.sample_indices = indices
        if content is not None:
            info.batch = content
        info.epoch = int(batch_epoch)
        info.batch_in_epoch = int(batch_position)
        self._core.step(n, float(loss), self._state(with_optimizer), info)
        self._pending = self._overlap

    def checkpoint(self, *, data_state=None):
        """Writes a verified checkpoint after the last step (atomic, manifest with sha256,
        rotation) and returns its directory. ``data_state``: anything JSON-able your loop needs to
        continue (returned as ``data_state`` by resume)."""
        s = self._state(for_checkpoint=True)
        user = {}
        for name, obj in self._state_objects.items():
            user["state." + name] = _json_state(obj.state_dict(), f"the state of {name!r}")
        if data_state is not None:
            user["data_state"] = _json_state(data_state, "data_state")
        if self._optimizer is not None:
            groups = [_hyperparameters(g) for g in self._optimizer.param_groups]
            user["optimizer.param_groups"] = _json_state(groups, "the optimizer's param_groups")
        s.user = user
        return self._core.checkpoint(self._core.last_step, s)

    def evaluate(self, loss, accuracy=None, *, samples=0, tokens=0, batches=0, step=None):
        """Records an evaluation after the last step (``retrace export`` and the report show it)."""
        if torch.is_tensor(loss):
            loss = loss.item()
        if torch.is_tensor(accuracy):
            accuracy = accuracy.item()
        self._core.evaluate(self._core.last_step if step is None else int(step), float(loss),
                            -1.0 if accuracy is None else float(accuracy), int(samples), int(tokens), int(batches))

    def event(self, kind, message):
        """A free-form event at the last step (``retrace diff`` compares them)."""
        self._core.event(self._core.last_step, str(kind), str(message))

    def sync(self):
        """Flushes and fsyncs the trace."""
        self._core.sync()

    def close(self):
        """Ends the recording: syncs and closes the trace and releases the run directory's lock, so
        that another process, or ``Recorder.resume`` in this one, may continue the run. A run has
        one writer: while a recorder is open, another ``create`` or ``resume`` of its directory
        raises ``retrace.IoError`` naming the holder. Closing twice does nothing."""
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
