#!/usr/bin/env python3
"""Turn a text file into an llm.c token directory that retrace reads (src/data/token_files.h).

  write_tokens.py TEXT_FILE OUT_DIR [--val-fraction 0.1] [--shard-tokens N] [--format gpt2|llama3]
                  [--repeat K] [--name NAME]

Tokens are the file's bytes (byte-level, vocabulary 256: give vocab_size 256, or 0 to take the
largest byte present + 1). The first 90% of the tokens (by default) are the training split, the
rest the validation split. Without --shard-tokens they go to OUT_DIR/train.bin and OUT_DIR/val.bin;
with it, each split is cut into shards of at most N tokens named as llm.c's scripts name theirs,
NAME_train_000000.bin, NAME_train_000001.bin, ... and NAME_val_000000.bin, ... (NAME "bytes" by
default). --repeat K repeats the text K times first (a large token set from a small text, for
benchmarks). Each file: a header of 256 little-endian int32 (the magic, the version, the token
count), then the tokens: --format gpt2 (the default) writes llm.c's GPT-2 format (magic 20240520,
version 1, uint16 tokens), llama3 its LLaMA-3 format (20240801, version 7, uint32 tokens).

Only the Python standard library is used, so this runs anywhere Python 3 does.
"""
import argparse
import os
import struct
import sys
from array import array

FORMATS = {"gpt2": (20240520, 1, "H"), "llama3": (20240801, 7, "I")}
HEADER_INTS = 256
MAX_TOKENS = 2**31 - 1  # header[2] is an int32
WRITE_CHUNK = 1 << 24   # tokens converted and written at a time


def write_token_file(path, tokens, fmt="gpt2"):
    magic, version, code = FORMATS[fmt]
    if len(tokens) > MAX_TOKENS:
        sys.exit(f"{path}: {len(tokens)} tokens do not fit the int32 count of the llm.c header")
    header = struct.pack("<%di" % HEADER_INTS, magic, version, len(tokens), *([0] * (HEADER_INTS - 3)))
    width = array(code).itemsize
    if width != (2 if fmt == "gpt2" else 4):
        sys.exit(f"this Python's array type {code!r} is {width} bytes, not what the format needs")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        for start in range(0, len(tokens), WRITE_CHUNK):
            body = array(code)
            body.extend(tokens[start:start + WRITE_CHUNK])  # bytes iterate as ints 0..255
            if sys.byteorder == "big":
                body.byteswap()
            f.write(body.tobytes())
    os.replace(tmp, path)


def write_split(out_dir, name, split, tokens, shard_tokens, fmt):
    if not shard_tokens:
        path = os.path.join(out_dir, f"{split}.bin")
        write_token_file(path, tokens, fmt)
        return [path]
    paths = []
    for i, start in enumerate(range(0, len(tokens), shard_tokens)):
        path = os.path.join(out_dir, f"{name}_{split}_{i:06d}.bin")
        write_token_file(path, tokens[start:start + shard_tokens], fmt)
        paths.append(path)
    return paths


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text_file")
    p.add_argument("out_dir")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the tokens for validation (0.1)")
    p.add_argument("--shard-tokens", type=int, default=0, help="tokens per shard (0: one train.bin and val.bin)")
    p.add_argument("--format", choices=sorted(FORMATS), default="gpt2", help="gpt2 (uint16) or llama3 (uint32)")
    p.add_argument("--repeat", type=int, default=1, help="repeat the text this many times first (1)")
    p.add_argument("--name", default="bytes", help="shard name prefix with --shard-tokens (bytes)")
    a = p.parse_args()
    if not 0.0 < a.val_fraction < 1.0:
        sys.exit(f"--val-fraction {a.val_fraction}: need 0 < fraction < 1")
    if a.shard_tokens < 0 or a.shard_tokens > MAX_TOKENS:
        sys.exit(f"--shard-tokens {a.shard_tokens}: need 0 <= N <= {MAX_TOKENS}")
    if a.repeat < 1:
        sys.exit(f"--repeat {a.repeat}: need >= 1")
    with open(a.text_file, "rb") as f:
        data = f.read() * a.repeat
    n_val = int(len(data) * a.val_fraction)
    if n_val < 1 or len(data) - n_val < 1:
        sys.exit(f"{a.text_file}: {len(data)} bytes are too few to split into a training and a validation split")
    os.makedirs(a.out_dir, exist_ok=True)
    mv = memoryview(data)
    train, val = mv[: len(data) - n_val], mv[len(data) - n_val:]
    t = write_split(a.out_dir, a.name, "train", train, a.shard_tokens, a.format)
    v = write_split(a.out_dir, a.name, "val", val, a.shard_tokens, a.format)
    print(f"{a.out_dir}: {len(train)} training tokens in {len(t)} file(s), {len(val)} validation tokens in "
          f"{len(v)}, {a.format} format, byte-level vocabulary 256 (largest token {max(data)})")


if __name__ == "__main__":
    main()
