#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py unchanged, except that the Kimi vocab step (which needs
Moonshot's tiktoken tokenizer and trust_remote_code) writes an empty vocab instead:
tokenizer.ggml.model = "none" (llama.cpp's LLAMA_VOCAB_TYPE_NONE). Every tensor and every other
key is the converter's own. Used for tests/fixtures/gguf/ with llama.cpp commit
0c1e57098bba43ac29e6e3b677cdceebdd22334f (vendored in llama-cpp-python 0.3.36), torch 2.11.0,
numpy 2.2.6, transformers 4.57.6.

Usage: gguf_convert_novocab.py LLAMA_CPP_DIR <convert_hf_to_gguf.py arguments>
"""
import runpy
import sys
from pathlib import Path

llama_dir = Path(sys.argv.pop(1)).resolve()
sys.path.insert(0, str(llama_dir))
sys.path.insert(1, str(llama_dir / "gguf-py"))

import conversion.kimi_linear as kl  # noqa: E402
import conversion.kimi_k3 as k3  # noqa: E402


def _no_vocab(self):
    self.gguf_writer.add_tokenizer_model("none")


kl.KimiLinearModel.set_vocab = _no_vocab
k3.KimiK3Model.set_vocab = _no_vocab

sys.argv[0] = str(llama_dir / "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
