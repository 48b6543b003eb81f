#!/usr/bin/env python3
"""Write a small TorchScript model that retrace can train from C++ (model.kind = torchscript).

  python3 examples/torchscript/make_model.py [OUT.pt] [--tuple-output]

The model takes Fashion-MNIST-shaped inputs [N, 784] float32 and returns [N, 10] logits:
Linear(784, 64) -> GELU -> dropout(p=0.1) -> Linear(64, 10). Dropout is written as
torch.nn.functional.dropout(x, p, self.training), so the module's train()/eval() switch it.
Inside the scripted forward it draws from torch's default CPU generator, which retrace captures
and restores with the rest of the RNG state.

The weights come from a fixed torch.manual_seed, so the same PyTorch version writes the same
tensors. torch.jit.save writes no time stamp, but the archive's bytes also depend on the output
file's name (its stem is the archive's top folder) and on this script's absolute path (recorded in
the *.debug_pkl source ranges): the same PyTorch, run from the same checkout path with the same
output name, writes the same file byte for byte.

--tuple-output writes a model whose forward returns (logits, hidden), which retrace must refuse
with a format error: the tests use it.
"""
import argparse
from typing import Tuple

import torch
import torch.nn.functional as F


class TinyMlp(torch.nn.Module):
    def __init__(self, inputs: int = 784, hidden: int = 64, outputs: int = 10, p: float = 0.1):
        super().__init__()
        self.fc1 = torch.nn.Linear(inputs, hidden)
        self.fc2 = torch.nn.Linear(hidden, outputs)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fc1(x))
        x = F.dropout(x, self.p, self.training)
        return self.fc2(x)


class TupleMlp(TinyMlp):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        h = F.gelu(self.fc1(x))
        return self.fc2(h), h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="examples/torchscript/tiny_mlp.pt")
    parser.add_argument("--tuple-output", action="store_true", help="forward returns a tuple (for tests)")
    parser.add_argument("--seed", type=int, default=20240607)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = TupleMlp() if args.tuple_output else TinyMlp()
    scripted = torch.jit.script(model)
    torch.jit.save(scripted, args.out)
    n = sum(p.numel() for p in scripted.parameters())
    print(f"wrote {args.out}: {n} parameters, torch {torch.__version__}")


if __name__ == "__main__":
    main()
