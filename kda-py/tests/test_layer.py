"""kda.KdaLayer against the fla layer fixtures (tests/fixtures, fla-core 0.6.0 + Kimi Linear's
HF layer glue), and its caches: clone, save / restore, decode after prefill."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

import kda
from conftest import rel_rms

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
LAYER_FILES = sorted(p.name for p in FIXTURES.glob("layer_*.safetensors"))
TOL = 1e-5


def read_fixture(name):
    from safetensors import safe_open

    with safe_open(FIXTURES / name, framework="pt") as f:
        meta = f.metadata()
    return load_file(FIXTURES / name), meta


def write_checkpoint(tensors, meta, folder: Path):
    """The fixture's weights as a one-layer Kimi Linear / K3-style checkpoint folder."""
    lin = {
        "num_heads": int(meta["heads"]),
        "head_dim": int(meta["head_dim"]),
        "short_conv_kernel_size": int(meta["conv_width"]),
        "kda_layers": [1],
        "full_attn_layers": [],
        "use_full_rank_gate": meta["output_gate"] == "full_rank",
    }
    if meta["decay_gate"] == "lower_bound":
        lin["gate_lower_bound"] = float(meta["lower_bound"])
    cfg = {"model_type": "kimi_linear", "hidden_size": int(meta["hidden"]), "num_hidden_layers": 1,
           "rms_norm_eps": float(meta["rms_eps"]), "linear_attn_config": lin}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    skip = ("hidden_states", "cu_seqlens", "initial_", "output", "final_", "inter.")
    weights = {f"model.layers.0.self_attn.{n}": t.contiguous() for n, t in tensors.items() if not n.startswith(skip)}
    from safetensors.torch import save_file as save_torch

    save_torch(weights, str(folder / "model.safetensors"))
    return folder


def write_cache(tensors, n, path: Path):
    """The fixture's initial states in kda's model-cache file format."""
    names = {"recurrent_state": "initial_recurrent_state", "conv_state_q": "initial_conv_state_q",
             "conv_state_k": "initial_conv_state_k", "conv_state_v": "initial_conv_state_v"}
    save_file({f"layers.0.{k}": tensors[v].float().numpy() for k, v in names.items()}, str(path),
              metadata={"format": "kda-model-cache", "sequences": str(n)})


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.mark.parametrize("name", LAYER_FILES)
def test_layer_matches_fla_fixture(name, ckpt_dir):
    t, meta = read_fixture(name)
    layer = kda.KdaLayer.from_pretrained(write_checkpoint(t, meta, ckpt_dir / name), layer=0)
    assert (layer.hidden, layer.heads, layer.head_dim) == (int(meta["hidden"]), int(meta["heads"]), int(meta["head_dim"]))
    cu = t["cu_seqlens"].tolist()
    n = len(cu) - 1
    if "initial_recurrent_state" in t:
        write_cache(t, n, ckpt_dir / f"{name}.cache")
        cache = layer.load_cache(ckpt_dir / f"{name}.cache")
    else:
        cache = layer.new_cache(n)
    y = layer.prefill(t["hidden_states"], cache, cu_seqlens=cu)
    assert y.dtype == torch.float32 and y.shape == t["output"].shape
    assert rel_rms(y, t["output"]) <= TOL
    got = cache.recurrent_state()
    assert rel_rms(got, t["final_recurrent_state"]) <= TOL
    cache.save(ckpt_dir / f"{name}.out")
    saved = load_file(ckpt_dir / f"{name}.out")
    for s in "qkv":
        want = t[f"final_conv_state_{s}"]
        assert rel_rms(saved[f"layers.0.conv_state_{s}"], want) <= TOL if want.numel() else True


def test_gguf_layer_matches_fla(ckpt_dir):
    """llama.cpp's converter-made Q8_0 GGUF, loaded in place, against fla on gguf-py's
    dequantisation of its weights (tests/scripts/gen_gguf_layer_fixture.py)."""
    t, meta = read_fixture("gguf/kimi-linear-tiny-q8_0-layer0.safetensors")
    layer = kda.KdaLayer.from_pretrained(FIXTURES / "gguf" / meta["gguf"], layer=0)
    assert (layer.hidden, layer.heads, layer.head_dim) == (int(meta["hidden"]), int(meta["heads"]), int(meta["head_dim"]))
    cu = t["cu_seqlens"].tolist()
    write_cache(t, len(cu) - 1, ckpt_dir / "gguf.cache")
    cache = layer.load_cache(ckpt_dir / "gguf.cache")
    y = layer.prefill(t["hidden_states"], cache, cu_seqlens=cu)
    assert rel_rms(y, t["output"]) <= TOL
    assert rel_rms(cache.recurrent_state(), t["final_recurrent_state"]) <= TOL
    with pytest.raises(Exception, match="full-attention"):
        kda.KdaLayer.from_pretrained(FIXTURES / "gguf" / meta["gguf"], layer=1)


def _fixture_layer(ckpt_dir, name="layer_sp_lr_f32_k16_h3_t37.safetensors"):
    t, meta = read_fixture(name)
    return kda.KdaLayer.from_pretrained(write_checkpoint(t, meta, ckpt_dir / ("dec_" + name)), 0), t


def test_decode_continues_prefill_and_caches_fork(ckpt_dir, tmp_path):
    layer, t = _fixture_layer(ckpt_dir)
    x = t["hidden_states"].numpy()
    full = layer.prefill(x, layer.new_cache(1))
    assert isinstance(full, np.ndarray)
    cache = layer.new_cache(1)
    layer.prefill(x[:-3], cache)
    fork = cache.clone()
    restored = layer.cache_from_bytes(cache.to_bytes())
    assert restored == cache
    cache.save(tmp_path / "c.safetensors")
    loaded = layer.load_cache(tmp_path / "c.safetensors")
    assert loaded == cache
    steps = [layer.decode(x[i : i + 1], cache) for i in range(len(x) - 3, len(x))]
    assert rel_rms(np.concatenate(steps), full[-3:]) <= TOL
    assert fork != cache  # the fork did not move
    assert rel_rms(layer.decode(x[-3:-2], fork), steps[0]) == 0.0
    assert rel_rms(layer.decode(x[-3:-2], loaded), steps[0]) == 0.0
    cache.reset()
    assert not cache.recurrent_state().any()


@pytest.mark.parametrize("name", [n for n in LAYER_FILES if "_bf16_" in n])
def test_bf16_precision_layer(name, ckpt_dir):
    """precision="bf16": within the Rust suite's bound of fla's fp32 reference, not the exact
    mode's bits, and decode steps continue it (chunked prefill vs recurrent decode: ≤ 1e-5)."""
    t, meta = read_fixture(name)
    folder = write_checkpoint(t, meta, ckpt_dir / ("bf16_" + name))
    exact = kda.KdaLayer.from_pretrained(folder, 0)
    layer = kda.KdaLayer.from_pretrained(folder, 0, precision="bf16")
    x, cu = t["hidden_states"], t["cu_seqlens"].tolist()
    n = len(cu) - 1

    def start(lay):
        if "initial_recurrent_state" not in t:
            return lay.new_cache(n)
        write_cache(t, n, ckpt_dir / f"bf16_{name}.cache")
        return lay.load_cache(ckpt_dir / f"bf16_{name}.cache")

    y = layer.prefill(x, start(layer), cu_seqlens=cu)
    assert rel_rms(y, t["output"]) <= 5e-3
    assert not torch.equal(y, exact.prefill(x, start(exact), cu_seqlens=cu))
    one = x[cu[-2] : cu[-1]]
    full = layer.prefill(one, layer.new_cache(1))
    cache = layer.new_cache(1)
    steps = torch.cat([layer.decode(one[i : i + 1], cache) for i in range(len(one))])
    assert rel_rms(steps, full) <= TOL
    with pytest.raises(ValueError, match="precision: expected 'exact' or 'bf16', got 'fp8'"):
        kda.KdaLayer.from_pretrained(folder, 0, precision="fp8")


def test_layer_bad_inputs(ckpt_dir, tmp_path):
    layer, t = _fixture_layer(ckpt_dir)
    cache = layer.new_cache(2)
    with pytest.raises(ValueError, match=r"x: expected shape \[T, 36\], got \[37, 35\]"):
        layer.prefill(torch.zeros(37, 35), cache, cu_seqlens=[0, 10, 37])
    with pytest.raises(ValueError, match="cu_seqlens: 1 sequences, but the cache holds 2"):
        layer.prefill(torch.zeros(37, 36), cache)
    with pytest.raises(ValueError, match=r"x: expected one row per cached sequence \(2\), got 1"):
        layer.decode(np.zeros((1, 36), np.float32), cache)
    with pytest.raises(TypeError, match="cache: expected a kda.KdaCache"):
        layer.decode(np.zeros((2, 36), np.float32), "cache")
    other, _ = _fixture_layer(ckpt_dir, "layer_lb_lr_f32_k16_h1_t1.safetensors")
    with pytest.raises(ValueError, match="cache: belongs to another layer"):
        layer.decode(np.zeros((2, 36), np.float32), other.new_cache(2))
    with pytest.raises(ValueError, match="nope"):
        kda.KdaLayer.from_pretrained(tmp_path / "nope", 0)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="bad.safetensors"):
        layer.load_cache(tmp_path / "bad.safetensors")
