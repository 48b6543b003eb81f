"""`retrace weights`'s file read by Python's safetensors into the model's PyTorch twin.

  weights_twin.py ROOT MODEL.safetensors SHARD.safetensors OLDER.safetensors

The twin is tools/bench/vs_pytorch.py's Gpt (the same module names as retrace's GPT); it must
load the file with load_state_dict(strict=True), every tensor bitwise equal to the checkpoint
shard's "model/<name>" entry (the shard is itself a safetensors file), and run a forward pass.
OLDER (an earlier step's export) must hold other values: the export follows the checkpoint.
"""
import importlib.util
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

root, model_path, shard_path, older_path = sys.argv[1:5]
spec = importlib.util.spec_from_file_location("vs_pytorch", f"{root}/tools/bench/vs_pytorch.py")
vs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vs)

weights = load_file(model_path)
with safe_open(model_path, "pt") as f:
    meta = f.metadata()
assert meta.get("format") == "pt" and meta.get("retrace.step") == "6", meta
vocab, d = weights["wte.weight"].shape
context = weights["wpe.weight"].shape[0]
layers = len({k.split(".")[1] for k in weights if k.startswith("blocks.")})
twin = vs.Gpt(vocab, context, d, layers, heads=2, dropout=0.0)
twin.load_state_dict(weights, strict=True)

shard = load_file(shard_path)
model_keys = {k[len("model/"):] for k in shard if k.startswith("model/")}
assert model_keys == set(weights), (sorted(model_keys ^ set(weights)))
for name, t in twin.state_dict().items():
    ref = shard["model/" + name]
    assert t.dtype == ref.dtype and t.shape == ref.shape, name
    assert torch.equal(t.view(torch.int32), ref.view(torch.int32)), f"{name}: other bits than the checkpoint"

older = load_file(older_path)
assert set(older) == set(weights)
assert any(not torch.equal(older[k], weights[k]) for k in weights), "step 3's export equals step 6's"

twin.eval()
with torch.no_grad():
    logits = twin(torch.arange(context).remainder(vocab).unsqueeze(0))
assert logits.shape == (1, context, vocab) and torch.isfinite(logits).all()
print(f"twin ok: {len(weights)} tensors, {sum(t.numel() for t in weights.values())} parameters, "
      f"vocab {vocab}, d_model {d}, {layers} layers, logits finite")
