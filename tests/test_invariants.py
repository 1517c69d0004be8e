"""What only the reference backend checks: parity with transformers' own generate().

The KV-sharing invariants every backend must keep are in the conformance kit
(river_conformance/kit.py, run by test_conformance.py)."""

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from river_torch.plugin import tiny_backend
from river_conformance.fixtures import tiny
from river_core.settings.config import GenerationConfig
from river_core.loop.decode import generate_ids
from river_core.method.kv import Full, River
from river_conformance.kit import BFLOAT16
from river_conformance.scripted import forced_logits, scripted_run
from river_core.method.predictor import relative_error

prompts = st.lists(st.integers(3, tiny.VOCAB - 1), min_size=1, max_size=24).map(lambda p: [1] + p)


def reference(family: str, dtype: str, prompt: list[int], n: int, device: str):
    """transformers' greedy generate() on the device River's engine runs on (tiny_backend's:
    RIVER_TEST_DEVICE): CUDA's kernels and the CPU's may part at a bfloat16 near tie."""
    model = tiny.model(family, dtype=dtype).to(device)
    return model.generate(torch.tensor([prompt], device=device), do_sample=False,
                          max_new_tokens=n).cpu()


@pytest.mark.parametrize("family", tiny.FAMILIES)
@given(prompt=prompts, n=st.integers(1, 12))
def test_full_depth_matches_transformers_generate(family, prompt, n, test_device):
    ref = reference(family, "float32", prompt, n, test_device)
    ours = generate_ids(tiny_backend(family, 0, 8), [prompt], GenerationConfig(max_new_tokens=n),
                        scripted_run(Full(), []))
    assert ours.tokens[0] == ref[0, len(prompt):].tolist()


# River's bfloat16 engine against transformers' bfloat16 generate() on the same device: the
# same weights, bfloat16's rounding (2^-8) in every layer (the kit's BFLOAT16 bounds: on the
# CPU the two agree to 5e-3, 40 prompts over the tiny families, the other 39 bit for bit), and
# greedy tokens keep to the kit's near-tie rule.
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_bfloat16_full_depth_matches_generate_and_river_runs(family, test_device):
    prompt, n = [1, 20, 21, 22, 23], 8
    model = tiny.model(family, dtype="bfloat16").to(test_device)
    out = model.generate(torch.tensor([prompt], device=test_device), do_sample=False,
                         max_new_tokens=n, output_logits=True, return_dict_in_generate=True)
    want = out.sequences[0, len(prompt):].tolist()
    want_logits = [l[0].float().cpu().numpy() for l in out.logits]
    b = tiny_backend(family, 0, 8, dtype="bfloat16")
    gen = GenerationConfig(max_new_tokens=n)
    full = generate_ids(b, [prompt], gen, scripted_run(Full(), []))
    for got, w in zip(forced_logits(b, prompt, want, Full()), want_logits):
        assert relative_error(got, w) <= BFLOAT16.rtol
    assert BFLOAT16.keeps_to(full.tokens[0], want, lambda: want_logits, BFLOAT16.rtol)
    river = generate_ids(b, [prompt], gen, scripted_run(River(), [2] * n))
    assert len(river.tokens[0]) >= 1 and set(river.exit_layers[0]) <= {2}


@given(prompt=prompts, cont=st.lists(st.integers(3, tiny.VOCAB - 1), min_size=2, max_size=8),
       exits=st.lists(st.integers(0, 4), min_size=8, max_size=8))
def test_mask_never_reads_an_absent_entry(prompt, cont, exits):
    """Whatever an absent entry holds, later tokens' outputs do not change."""
    from river_core.contract.cache import KVCache
    from river_core.method.kv import Mask

    b = tiny_backend("qwen3", 0, 8)
    clean = forced_logits(b, prompt, cont, Mask(), exits)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KVCache, "ABSENT", 1e4)
        poisoned = forced_logits(b, prompt, cont, Mask(), exits)
    for a, p in zip(clean, poisoned):
        assert np.array_equal(a, p)
