"""fp8sim.torch.convert: a plan preset's name applies the plan (``convert(model, "deepseek-v3")`` is
DeepSeek-V3's scheme, as ``plan("deepseek-v3")``), the recipe alone is asked for explicitly, the
projections convert cannot reach (``nn.MultiheadAttention``, ``TransformerEncoderLayer``'s fast path)
are warned about by module path, and a converted Linear under ``torch.autocast`` returns what
``nn.Linear`` returns."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fp8sim  # noqa: E402
import fp8sim.torch as ft  # noqa: E402


def bits(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy().view(np.uint32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(bits(a), bits(b))


class Attn(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj = torch.nn.Linear(d, d)
        self.o_proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.o_proj(torch.relu(self.q_proj(x)))


class Net(torch.nn.Module):
    """Linear layers only, named as in Llama-style models (o_proj: the post-attention Linear)."""

    def __init__(self, d=32, vocab=40):
        super().__init__()
        self.attn = Attn(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.ReLU(), torch.nn.Linear(2 * d, d))
        self.gate = torch.nn.Linear(d, 4)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        h = x + self.attn(x)
        h = h + self.mlp(h)
        return self.lm_head(h) + self.gate(h).sum(-1, keepdim=True)


def layer_options(m) -> dict:
    return {n: (mod.options, mod.weight.dtype) for n, mod in m.named_modules() if isinstance(mod, ft.Linear)}


def test_convert_with_the_name_applies_deepseek_v3s_scheme():
    """convert(model, "deepseek-v3") and convert(model) give every layer what plan("deepseek-v3")
    gives it (DeepSeek-V3 report section 3.3: FP8 activation cache, E5M6 input of the
    post-attention Linear, FP32 master weights, head and gating in the model's precision)."""
    torch.manual_seed(0)
    base = Net().to(torch.bfloat16)
    by_plan = ft.convert(copy.deepcopy(base), ft.plan("deepseek-v3"))
    for m in (ft.convert(copy.deepcopy(base), "deepseek-v3"), ft.convert(copy.deepcopy(base))):
        assert layer_options(m) == layer_options(by_plan)
        assert m.attn.o_proj.options.cache == ft.ActivationCache("e5m6", "1x128", "pow2")
        assert m.attn.q_proj.options.cache == "fprop" and m.mlp[0].options.cache == "fprop"
        assert m.attn.q_proj.weight.dtype == torch.float32 and m.attn.q_proj.bias.dtype == torch.float32
        assert not isinstance(m.lm_head, ft.Linear) and not isinstance(m.gate, ft.Linear)
        assert m.lm_head.weight.dtype == torch.bfloat16
    x = torch.randn(2, 24, 32).to(torch.bfloat16)
    outs = []
    for m in (by_plan, ft.convert(copy.deepcopy(base), "deepseek-v3")):
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.float().square().sum().backward()
        outs.append((y, xi.grad, m.attn.o_proj.weight.grad, m.mlp[0].bias.grad))
    for a, b in zip(*outs):
        assert same_bits(a, b)


def test_the_recipe_alone_is_asked_for_explicitly():
    """Plan("deepseek-v3") and the Recipe object: the recipe on every layer, no caches, dtypes kept;
    any other recipe name is a plain plan as before."""
    base = Net().to(torch.bfloat16)
    for spec in (ft.Plan("deepseek-v3"), fp8sim.recipe("deepseek-v3"), "per-tensor"):
        m = ft.convert(copy.deepcopy(base), spec)
        opts = layer_options(m)
        assert set(opts) == {"attn.q_proj", "attn.o_proj", "mlp.0", "mlp.2"}
        for o, dtype in opts.values():
            assert o.cache is None and o.group_size is None and dtype == torch.bfloat16
            assert o.recipe.name == ("per-tensor" if spec == "per-tensor" else "deepseek-v3")


class WithMHA(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.ModuleDict({"attn": torch.nn.MultiheadAttention(d, 2)})])
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x):
        return self.proj(self.blocks[0]["attn"](x, x, x, need_weights=False)[0])


def unconverted_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn()
    return [str(x.message) for x in w if issubclass(x.category, ft.UnconvertedWarning)]


def test_warns_on_multihead_attention_by_module_path():
    msgs = unconverted_warnings(lambda: ft.convert(WithMHA(), "per-tensor"))
    assert len(msgs) == 1 and "'blocks.0.attn'" in msgs[0] and "MultiheadAttention" in msgs[0]
    assert "in_proj_weight" in msgs[0]
    with pytest.warns(ft.UnconvertedWarning, match=r"'blocks\.0\.attn'"):
        ft.convert(WithMHA(), "deepseek-v3")
    # the attention kept on purpose (its out_proj skipped), or no attention module: no warning
    assert unconverted_warnings(lambda: ft.convert(WithMHA(), "per-tensor", skip=("*attn.out_proj",))) == []
    assert unconverted_warnings(lambda: ft.convert(Net(), "per-tensor")) == []


def test_transformer_encoder_layer_warning_and_its_fast_path():
    """TransformerEncoderLayer: its self_attn (MultiheadAttention) is warned about, and so is its
    inference fast path, which really bypasses the converted linear1/linear2 (eval mode, no grad: the
    converted model computes the original model's bits); with the fast path off they run FP8."""
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, dropout=0.0, batch_first=True)
    orig = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)).eval()
    conv = copy.deepcopy(orig)
    msgs = unconverted_warnings(lambda: ft.convert(conv, "per-tensor"))
    assert len(msgs) == 1
    assert "'0.layers.0.self_attn' (torch.nn.MultiheadAttention" in msgs[0]
    assert "'0.layers.0' (torch.nn.TransformerEncoderLayer" in msgs[0]
    assert isinstance(conv[0].layers[0].linear1, ft.Linear) and isinstance(conv[0].layers[0].linear2, ft.Linear)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        assert torch.backends.mha.get_fastpath_enabled()
        assert same_bits(conv(x), orig(x))  # the fast path: linear1 / linear2 never called
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            assert not same_bits(conv(x), orig(x))
        finally:
            torch.backends.mha.set_fastpath_enabled(True)


def test_autocast_bf16_output_dtype_as_nn_linear():
    """Under torch.autocast("cpu", dtype=torch.bfloat16) nn.Linear rounds its float32 input to bfloat16
    and returns bfloat16 (grad_x float32); a converted Linear does the same: its output is
    fp8sim.torch.linear of the bfloat16-rounded input, bit for bit, and its gradients keep the
    dtypes of x and the weight."""
    torch.manual_seed(5)
    ref = torch.nn.Linear(64, 48)
    conv = ft.Linear.from_linear(copy.deepcopy(ref), "deepseek-v3")
    x = torch.randn(3, 16, 64)
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yr, yc = ref(xr), conv(xc)
    assert yr.dtype == torch.bfloat16 and yc.dtype == yr.dtype
    with torch.no_grad():
        expect = ft.linear(x.to(torch.bfloat16), conv.weight, conv.bias, recipe="deepseek-v3")
    assert same_bits(yc, expect)
    yr.float().sum().backward()
    yc.float().sum().backward()
    assert xc.grad.dtype == xr.grad.dtype == torch.float32
    assert conv.weight.grad.dtype == torch.float32 and conv.bias.grad.dtype == torch.float32
    with torch.no_grad():  # outside autocast nothing changes
        assert conv(x).dtype == torch.float32


def test_autocast_float16_is_refused():
    conv = ft.Linear(32, 16, recipe="deepseek-v3")
    with torch.autocast("cpu", dtype=torch.float16):
        if not torch.is_autocast_enabled("cpu"):
            pytest.skip("this torch has no float16 autocast on the CPU")
        with pytest.raises(TypeError, match="autocast with dtype float16"):
            conv(torch.randn(4, 32))
