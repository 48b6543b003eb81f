#!/usr/bin/env python3
"""Write a tensor data set directory that retrace reads (src/data/tensor_files.h), for a tiny
synthetic task: two Gaussian blobs to tell apart.

  write_tensors.py OUT_DIR [--seed 0] [--features 64] [--train 512] [--test 128] [--pure-python]

OUT_DIR/train.safetensors and OUT_DIR/test.safetensors each hold "inputs" float32 [N, features]
and "targets" int64 [N] (class 0 or 1). The same seed gives the same bytes. The files are written
with safetensors.numpy.save_file when the safetensors package is importable, else (or with
--pure-python) by the minimal writer below; both give files that either reader accepts.

Your own arrays: replace make_blobs() with whatever builds (inputs, targets) for each split.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# numpy dtype -> safetensors dtype string
DTYPES = {
    np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16", np.dtype("int8"): "I8",
    np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL",
}


def save_file_pure(tensors, path, metadata=None):
    """The safetensors layout: u64 little-endian header length N, N bytes of JSON header
    {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...} padded with spaces so the data
    starts 8-byte aligned, then the tensors' little-endian bytes back to back."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    # Data in safetensors' own order (largest element first, then by name), so every tensor starts
    # aligned to its element size and the bytes match safetensors.numpy.save_file's.
    arrays = {name: np.asarray(t) for name, t in tensors.items()}
    for name in sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k)):
        a = arrays[name]
        key = a.dtype.newbyteorder("=")
        if key not in DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no safetensors dtype")
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        blob = a.tobytes(order="C")
        header[name] = {"dtype": DTYPES[key], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def make_blobs(rng, n, features, center):
    targets = rng.integers(0, 2, size=n).astype(np.int64)
    sign = np.where(targets == 1, 1.0, -1.0)[:, None]
    inputs = (sign * center[None, :] + rng.standard_normal((n, features))).astype(np.float32)
    return inputs, targets


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--train", type=int, default=512)
    p.add_argument("--test", type=int, default=128)
    p.add_argument("--pure-python", action="store_true", help="do not use the safetensors package")
    a = p.parse_args()
    if a.features < 1 or a.train < 1 or a.test < 0:
        sys.exit("need --features >= 1, --train >= 1, --test >= 0")

    save = save_file_pure
    if not a.pure_python:
        try:
            from safetensors.numpy import save_file as save
        except ImportError:
            pass
    rng = np.random.default_rng(a.seed)
    # The class means are +-center, a random direction at distance 1.5 from the origin.
    center = rng.standard_normal(a.features)
    center *= 1.5 / np.linalg.norm(center)
    os.makedirs(a.out_dir, exist_ok=True)
    for split, n in (("train", a.train), ("test", a.test)):
        inputs, targets = make_blobs(rng, n, a.features, center)
        save({"inputs": inputs, "targets": targets}, os.path.join(a.out_dir, f"{split}.safetensors"))
        print(f"{a.out_dir}/{split}.safetensors: inputs float32 {list(inputs.shape)}, targets int64 "
              f"[{n}], {int(targets.sum())} of class 1")
    writer = "pure Python" if save is save_file_pure else "safetensors.numpy"
    print(f"written with {writer}; 2 classes")


if __name__ == "__main__":
    main()
