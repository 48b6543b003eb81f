#!/usr/bin/env python3
"""Turn a text file into an llm.c token directory that retrace reads (src/data/token_files.h).

  write_tokens.py TEXT_FILE OUT_DIR [--val-fraction 0.1]

Tokens are the file's bytes (byte-level, vocabulary 256: give vocab_size 256, or 0 to take the
largest byte present + 1). The first 90% of the tokens (by default) go to OUT_DIR/train.bin, the
rest to OUT_DIR/val.bin. Each file: a header of 256 little-endian int32 (20240520 magic, 1 version
for uint16 tokens, the token count), then the tokens as little-endian uint16.

Only the Python standard library is used, so this runs anywhere Python 3 does.
"""
import argparse
import os
import struct
import sys
from array import array

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_TOKENS = 2**31 - 1  # header[2] is an int32


def write_token_file(path, tokens):
    if len(tokens) > MAX_TOKENS:
        sys.exit(f"{path}: {len(tokens)} tokens do not fit the int32 count of the llm.c header")
    header = struct.pack("<%di" % HEADER_INTS, MAGIC, VERSION, len(tokens), *([0] * (HEADER_INTS - 3)))
    body = array("H")
    assert body.itemsize == 2, "this Python's unsigned short is not 16 bits"
    body.extend(tokens)  # bytes iterate as ints 0..255
    if sys.byteorder == "big":
        body.byteswap()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(body.tobytes())
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text_file")
    p.add_argument("out_dir")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the tokens for val.bin (0.1)")
    a = p.parse_args()
    if not 0.0 < a.val_fraction < 1.0:
        sys.exit(f"--val-fraction {a.val_fraction}: need 0 < fraction < 1")
    with open(a.text_file, "rb") as f:
        data = f.read()
    n_val = int(len(data) * a.val_fraction)
    if n_val < 1 or len(data) - n_val < 1:
        sys.exit(f"{a.text_file}: {len(data)} bytes are too few to split into train.bin and val.bin")
    os.makedirs(a.out_dir, exist_ok=True)
    train, val = data[: len(data) - n_val], data[len(data) - n_val :]
    write_token_file(os.path.join(a.out_dir, "train.bin"), train)
    write_token_file(os.path.join(a.out_dir, "val.bin"), val)
    print(f"{a.out_dir}: train.bin {len(train)} tokens, val.bin {len(val)} tokens, byte-level vocabulary 256 "
          f"(largest token {max(data)})")


if __name__ == "__main__":
    main()
