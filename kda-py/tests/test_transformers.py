"""kda.integrations: transformers' native Kimi Linear on kda, and the fla shim."""

import functools
import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch

import kda
from kda import integrations
from conftest import rel_rms

transformers = pytest.importorskip("transformers")
m = importlib.import_module("transformers.models.kimi_linear.modeling_kimi_linear")


def tiny_model():
    cfg = transformers.KimiLinearConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"], linear_head_dim=32, linear_num_heads=2,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.KimiLinearForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the init, so the recurrences matter
        for name, p in model.named_parameters():
            if "A_log" in name or "dt_bias" in name:
                p.copy_(torch.randn_like(p) * 0.5)
    return model


@pytest.fixture
def torch_fallback(monkeypatch):
    """transformers' own torch implementations (what runs on CPU without fla): in this venv
    fla is installed, so undo transformers' choice of fla's Triton kernels."""
    for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"):
        monkeypatch.setattr(m, name, inspect.unwrap(getattr(m, name)))
    yield
    integrations.unpatch_transformers()


def generate(model, ids, n):
    out = model.generate(ids, max_new_tokens=n, do_sample=False, output_logits=True, return_dict_in_generate=True)
    return out.sequences, torch.stack(out.logits, 1)


def test_patched_model_generates_the_same(torch_fallback, monkeypatch):
    model = tiny_model()
    ids = torch.randint(3, 97, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want_tokens, want_logits = generate(model, ids, 12)
        calls = []
        # the kda functions the patch routes transformers' two functions to, spied on
        for name, fn in list(integrations._TARGETS.items()):
            spy = functools.wraps(fn)(lambda *a, _fn=fn, _name=name, **k: calls.append(_name) or _fn(*a, **k))
            monkeypatch.setitem(integrations._TARGETS, name, spy)
        assert integrations.patch_transformers()
        assert integrations.is_transformers_patched()
        got_tokens, got_logits = generate(model, ids, 12)
    assert torch.equal(got_tokens, want_tokens)
    assert rel_rms(got_logits, want_logits) <= 1e-4
    # prefill ran kda's chunk_kda, decode its fused_recurrent_kda
    assert "chunk_kimi_delta_attention" in calls and "recurrent_kimi_delta_attention" in calls
    integrations.unpatch_transformers()
    assert not integrations.is_transformers_patched()


def test_patch_keeps_autograd_on_transformers_path(torch_fallback):
    integrations.patch_transformers()
    q = torch.randn(1, 5, 2, 32, requires_grad=True)
    k, v = torch.randn(1, 5, 2, 32), torch.randn(1, 5, 2, 32)
    g, beta = -torch.rand(1, 5, 2, 32), torch.rand(1, 5, 2)
    o, _ = m.chunk_kimi_delta_attention(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    assert o.requires_grad  # torch fallback, differentiable
    with torch.no_grad():
        o2, _ = m.chunk_kimi_delta_attention(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    assert rel_rms(o2, o.detach()) <= 1e-5


SHIM_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["fla"] = None  # as if fla were not installed (the venv has it)
    import importlib.util
    orig = importlib.util.find_spec
    importlib.util.find_spec = lambda n, *a: None if n == "fla" else orig(n, *a)
    del sys.modules["fla"]
    import torch, kda
    from kda.integrations import install_fla_shim
    assert install_fla_shim()
    from fla.ops.kda import chunk_kda, fused_recurrent_kda
    from fla.ops.kda.chunk import chunk_kda as c2
    assert chunk_kda is kda.chunk_kda and c2 is kda.chunk_kda and fused_recurrent_kda is kda.fused_recurrent_kda
    # transformers, imported after the shim, picks it up as "fla"
    from transformers.models.kimi_linear import modeling_kimi_linear as m
    q = torch.randn(1, 3, 1, 16); g = -torch.rand(1, 3, 1, 16); b = torch.rand(1, 3, 1)
    calls = []
    for name in ("fla_forward", "delta_rule"):
        real = getattr(kda._ops._core, name)
        setattr(kda._ops._core, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    with torch.no_grad():
        m.chunk_kimi_delta_attention(q, q, q, g=g, beta=b, use_qk_l2norm_in_kernel=True)
    assert calls, "transformers did not call kda through the shim"
    print("OK")
    """
)


def test_fla_shim_without_fla():
    r = subprocess.run([sys.executable, "-c", SHIM_SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def test_fla_shim_never_shadows_real_fla():
    import fla  # the real one is installed in the test venv

    assert not integrations.install_fla_shim()
    assert sys.modules["fla"] is fla and not getattr(fla, "__kda_shim__", False)
