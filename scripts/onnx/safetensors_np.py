# SPDX-License-Identifier: MIT
# scripts/onnx/safetensors_np.py: reads and writes safetensors files with numpy alone (Debian
# has no safetensors package). Layout: an 8-byte little-endian header length N, N bytes of
# JSON ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
# optional "__metadata__": {str: str}}), then the raw little-endian data; offsets are
# relative to the end of the header. Tensors are written in the order given, packed with no
# gaps; the header is padded with spaces to a multiple of 8 bytes (as the reference writer
# does), so every tensor starts 8-byte aligned in the file.

import json
import struct

import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def dtype_name(a):
    """The safetensors dtype name of a numpy array."""
    key = (a.dtype.kind, a.dtype.itemsize)
    names = {("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16", ("i", 8): "I64",
             ("i", 4): "I32", ("u", 1): "U8", ("b", 1): "BOOL"}
    if key not in names:
        raise ValueError(f"safetensors_np: no safetensors dtype for {a.dtype}")
    return names[key]


def write(path, tensors, metadata=None):
    """Writes {name: ndarray} (insertion order kept) to path."""
    header = {}
    blobs = []
    offset = 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = dtype_name(a)
        raw = a.astype(_DTYPES[dt], copy=False).tobytes(order="C")
        header[name] = {"dtype": dt, "shape": [int(s) for s in a.shape],
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read(path):
    """Returns ({name: ndarray}, metadata) read from path, checking the layout strictly."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    end_max = 0
    for name, h in header.items():
        dt = _DTYPES[h["dtype"]]
        b, e = h["data_offsets"]
        count = int(np.prod(h["shape"], dtype=np.int64))
        if e - b != count * dt.itemsize or e > len(body) or b < 0:
            raise ValueError(f"{path}: tensor {name} has bad data_offsets {b}..{e}")
        out[name] = np.frombuffer(body[b:e], dtype=dt).reshape(h["shape"]).copy()
        end_max = max(end_max, e)
    if end_max != len(body):
        raise ValueError(f"{path}: {len(body) - end_max} trailing bytes after the last tensor")
    return out, meta
