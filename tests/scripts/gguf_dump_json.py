#!/usr/bin/env python3
"""Dump a GGUF file's header as JSON with gguf-py's GGUFReader: the reference kda-host's GGUF
tests compare their parser with (kda-host/tests/gguf_files.rs). Used with the gguf-py of
llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f (llama-cpp-python 0.3.36) and numpy
2.2.6.

Usage: PYTHONPATH=LLAMA_CPP_DIR/gguf-py gguf_dump_json.py FILE.gguf > FILE.json
The JSON records FILE as given; the tests resolve a relative one against the JSON's folder.
"""
import json
import sys

from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

path = sys.argv[1]
r = GGUFReader(path)
out = {
    "file": path,
    "version": int(r.fields["GGUF.version"].parts[0][0]),
    "alignment": int(r.alignment),
    "data_offset": int(r.data_offset),
    "kv": [],
    "tensors": [],
}
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    value = f.contents()
    out["kv"].append({
        "key": name,
        "types": [GGUFValueType(t).name for t in f.types],
        "value": value,
    })
for t in r.tensors:
    out["tensors"].append({
        "name": t.name,
        "type": GGMLQuantizationType(t.tensor_type).name,
        "ne": [int(x) for x in t.shape],
        "n_bytes": int(t.n_bytes),
        "offset": int(t.field.parts[-1][0]),
        "data_offset": int(t.data_offset),
    })
json.dump(out, sys.stdout, indent=1)
sys.stdout.write("\n")
