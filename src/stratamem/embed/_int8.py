"""Which encoding of the bundled model's int8 weights suits this CPU.

The model file stores its 36 weight matrices as uint8 with a zero point of 128, because
onnxruntime's uint8 x int8 kernel for plain AVX2 (and AVX-512 without VNNI) adds pairs of
products in saturating 16-bit lanes: with full-range weights it would lose precision, and
uint8 x uint8 does not. CPUs with VNNI (``vpdpbusd``: Intel since Cascade Lake, AMD since
Zen 4) add uint8 x int8 products straight into 32-bit lanes, exactly, and onnxruntime has
no VNNI kernel for uint8 x uint8: there the same weights as int8 (the bytes shifted by
128, zero point 0) run the products 2-3x faster. The integer sums are the same exact
numbers either way, so the vectors are bit-for-bit the same (tests/test_embed.py checks
it on a VNNI machine): the encoding is a speed choice, not another model.
"""

from __future__ import annotations

import platform
import sys
from functools import cache

import numpy as np

# onnx.TensorProto.DataType values.
_UINT8 = 2
_INT8 = 3
# Field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, and TensorProto's
# data_type, name and raw_data.
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DATA_TYPE = 2
_TENSOR_NAME = 8
_TENSOR_RAW_DATA = 9
# What scripts/build_minilm_model.py names the weights and their zero points.
_SIGNED_SUFFIXES = ("_q_u8", "_q_zero")


@cache
def signed_products() -> bool:
    """Whether this CPU runs onnxruntime's uint8 x int8 products exactly and fast (VNNI).

    Read from Linux's CPU flags; elsewhere (or if they cannot be read) the answer is no,
    which keeps the encoding that is exact on every CPU.
    """
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return has_vnni(f.read())
    except OSError:
        return False


def has_vnni(cpuinfo: str) -> bool:
    """Whether the first ``flags`` line of a Linux ``/proc/cpuinfo`` names VNNI."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return bool(set(line.partition(":")[2].split()) & {"avx512_vnni", "avx_vnni"})
    return False


def _varint(data: bytearray, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytearray, start: int, end: int) -> list[tuple[int, int, int]]:
    """The fields of the protobuf message in ``data[start:end]``: (number, start of the
    value, end of the value); a varint's value spans its bytes."""
    out = []
    pos = start
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, after = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            after = pos + length
        elif wire == 1:
            after = pos + 8
        elif wire == 5:
            after = pos + 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} at byte {pos}")
        out.append((number, pos, after))
        pos = after
    return out


def to_signed_weights(model: bytes) -> bytes:
    """``model`` with its uint8 weights and zero points stored as int8 (each byte shifted by
    128): the same products, for :func:`signed_products` CPUs.

    The change keeps every length, so it is made in place on the serialised model. Its
    input is the digest-checked file and it is deterministic, so its output is pinned by a
    test (tests/test_embed.py) rather than hashed again at every load.
    """
    data = bytearray(model)
    view = np.frombuffer(data, dtype=np.uint8)
    changed = 0
    suffixes = tuple(s.encode() for s in _SIGNED_SUFFIXES)
    for number, start, end in _fields(data, 0, len(data)):
        if number != _MODEL_GRAPH:
            continue
        for number, t_start, t_end in _fields(data, start, end):
            if number != _GRAPH_INITIALIZER:
                continue
            fields = {n: (s, e) for n, s, e in _fields(data, t_start, t_end)}
            name = bytes(data[slice(*fields[_TENSOR_NAME])]) if _TENSOR_NAME in fields else b""
            if not name.endswith(suffixes):
                continue
            dtype, raw = fields.get(_TENSOR_DATA_TYPE), fields.get(_TENSOR_RAW_DATA)
            if dtype is None or raw is None or data[dtype[0]] != _UINT8:
                raise ValueError(f"tensor {name!r} is not raw uint8")
            data[dtype[0]] = _INT8  # a one-byte varint either way
            view[slice(*raw)] ^= 0x80
            changed += 1
    if not changed:
        raise ValueError("no uint8 weights found in the model")
    return bytes(data)
