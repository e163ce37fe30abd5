#!/usr/bin/env python3
"""Regenerate holdfast/_proto/holdfast_v3_pb2.py(i) from the repository's proto/holdfast.proto,
its package renamed from `dlock` to `holdfast.v3` (so that it loads beside any module generated
from dlock.proto or holdfast.proto).

Run it with grpcio-tools 1.62 (protoc 25): newer protoc writes code that demands a protobuf
runtime at least as new as itself, and the package supports protobuf 3.20 and later.

    python3 -m venv /tmp/gen && /tmp/gen/bin/pip install grpcio-tools==1.62.3
    /tmp/gen/bin/python clients/python/regenerate.py
"""

import os
import shutil
import sys
import tempfile

from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "proto", "holdfast.proto")
NAME = "holdfast/_proto/holdfast_v3.proto"


def renamed(text: str) -> str:
    assert "package dlock;" in text, "proto/holdfast.proto no longer declares package dlock"
    return text.replace("package dlock;", "package holdfast.v3;")


def main() -> int:
    with open(PROTO) as f:
        text = renamed(f.read())
    with tempfile.TemporaryDirectory() as out:
        os.makedirs(os.path.join(out, os.path.dirname(NAME)))
        with open(os.path.join(out, NAME), "w") as f:
            f.write(text)
        rc = protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--pyi_out={out}",
                          os.path.join(out, NAME)])
        if rc != 0:
            return rc
        for ext in (".py", ".pyi"):
            src = os.path.join(out, NAME.replace(".proto", "_pb2" + ext))
            shutil.copy(src, os.path.join(HERE, os.path.dirname(NAME)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
