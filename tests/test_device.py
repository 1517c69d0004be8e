"""The torch engine off the CPU, proven on the CPU: its steps run on a device that holds no
data (torch's FakeTensorMode over the "meta" device, where a CPU tensor mixed into a step
raises and so does any read of the device), so every tensor of a step is on the model's
device, the CUDA int4 kernel's arguments pass its meta implementation, and the host is read
only where a decision needs it (`LayerEngine.host`, answered here by the test)."""

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from river_core import CapabilityError, ExitConfig, GenerationConfig, RiverModel
from river_torch.backend import TorchBackend
from river_conformance.fixtures import tiny
from river_models.families import phi3
from river_models.quant import QuantWeight
from river_compute.torch_blocks import _int4_tinygemm, _scales_and_zeros, packed

TOKEN = 5        # every step's logits point here, so drafts are kept and nothing hits EOS
SETTLED = 0.999  # every cosine a policy reads: the paper's rule exits at its first chance


class Device:
    """The device's side of every host read: the shapes asked for, per pass (prefill, a
    decode step, a verification), and values the test chooses (logits pointing at TOKEN,
    cosines of SETTLED)."""

    def __init__(self, backend: TorchBackend) -> None:
        self.vocab, self.passes = backend._embed.shape[0], []
        backend.host = self.read
        for kind in ("prefill", "embed", "extend"):
            self._mark(backend, kind)

    def _mark(self, backend, kind: str) -> None:
        method = getattr(backend, kind)
        setattr(backend, kind, lambda *a: (self.passes.append((kind, [])), method(*a))[1])

    def of(self, kind: str) -> list[list[tuple]]:
        return [reads for k, reads in self.passes if k == kind]

    def read(self, array: torch.Tensor) -> np.ndarray:
        assert array.device.type == "meta"
        shape = tuple(array.shape)
        self.passes[-1][1].append(shape)
        if shape[-1] == self.vocab:
            out = np.zeros(shape, np.float32)
            out[..., TOKEN] = 1.0
            return out
        return np.full(shape, SETTLED)


@pytest.fixture
def on_device():
    """A tiny Llama in the torch engine on a data-less device, and what it reads."""
    checkpoint = tiny.checkpoint("llama", 0)
    stand_ins = tiny.stand_ins(checkpoint, 4)
    with FakeTensorMode(allow_non_fake_inputs=True):
        backend = TorchBackend(checkpoint, stand_ins, device="meta")
        yield backend, Device(backend)


def test_a_device_engine_takes_bfloat16_and_the_int4_kernel(on_device):
    backend, _ = on_device
    assert backend.dtype == torch.bfloat16
    assert all(t.device.type == "meta" for t in backend.allocate((1, 1, 1, 1, 1)))
    # a stand-in's projections hold 4 bits a weight, not a backbone layer's bytes
    assert backend.stand_ins[0].weight_bytes() * 3 < backend.blocks[0].weight_bytes()


@pytest.mark.parametrize("policy, options", [("settled", {}), ("fixed", {"layer": 1})])
def test_exit_mode_reads_the_host_once_per_watched_layer_and_once_for_the_token(
        on_device, policy, options):
    backend, device = on_device
    out = RiverModel(backend).generate_ids([[1, 20, 21, 22]], ExitConfig(
        policy=policy, options=options), GenerationConfig(max_new_tokens=4))
    assert out.tokens == [[TOKEN] * 4]
    # prefill: every layer's cosines over the prompt in one read, then the logits
    assert device.of("prefill") == [[(1, 4, backend.num_layers), (1, device.vocab)]]
    steps = device.of("embed")
    assert len(steps) == 3
    for reads, exit_layer in zip(steps, out.exit_layers[0]):
        cosines, logits = reads[:-1], reads[-1]
        assert logits == (1, device.vocab)
        watched = exit_layer + 1 if policy == "settled" else 0
        assert len(cosines) == watched and all(np.prod(c) <= 2 for c in cosines)
    assert max(out.exit_layers[0]) < backend.num_layers - 1   # the exit river ran too


def test_a_lossless_round_reads_one_token_per_draft_and_one_verification(on_device):
    backend, device = on_device
    out = RiverModel(backend).generate_ids([[1, 20, 21, 22]], ExitConfig(
        mode="speculative", policy="fixed", options={"layer": -1}, draft_tokens=2,
        adaptive=False), GenerationConfig(max_new_tokens=7))
    assert out.tokens == [[TOKEN] * 7] and out.accepted == out.drafted == [2, 2]
    assert device.of("embed") == [[(1, device.vocab)]] * 4    # a draft: its token, one read
    # x and two drafts, a pass a token (exact as steps), one read of their logits
    assert device.of("extend") == [[(3, device.vocab)]] * 2


def test_a_cpu_tensor_in_a_device_step_is_refused(on_device):
    backend, _ = on_device
    backend._embed_scale = torch.tensor(2.0).expand(1)   # a CPU tensor where a step uses it
    with pytest.raises(Exception, match="device"):
        RiverModel(backend).generate_ids([[1, 20]], ExitConfig(kv="full"),
                                         GenerationConfig(max_new_tokens=2))


def _quantized(rows: int, columns: int, group: int) -> QuantWeight:
    rng = np.random.default_rng(0)
    groups = columns // group
    return QuantWeight(rng.integers(0, 16, (rows, columns)).astype(np.uint8),
                       rng.uniform(0.01, 0.1, (rows, groups)).astype(np.float32),
                       rng.uniform(0, 15, (rows, groups)).astype(np.float32), 4)


@pytest.mark.parametrize("rows, columns, group", [(64, 64, 32), (128, 576, 64),
                                                  (1536, 512, 128), (576, 1536, 256)])
def test_the_cuda_int4_kernel_takes_the_stand_ins_arguments(rows, columns, group):
    q = _quantized(rows, columns, group)
    with FakeTensorMode(allow_non_fake_inputs=True):
        mm, args, nbytes = _int4_tinygemm(q, torch.device("meta"))
        y = mm(torch.empty(3, columns, dtype=torch.bfloat16, device="meta"), *args)
        assert y.shape == (3, rows) and y.dtype == torch.bfloat16
        linear = packed(q, None, torch.bfloat16, torch.device("meta"))
        assert linear(torch.empty(1, 2, columns, dtype=torch.bfloat16, device="meta")).shape \
            == (1, 2, rows)
    assert nbytes == rows * columns // 2 + 2 * 2 * rows * (columns // group)


def test_the_int4_packing_is_the_kernels_order_and_convention():
    """What tinygemm unpacks (the even column in the high nibble; w = (code - 8) * scale +
    zero per group) gives back the stand-in's own dequantized weights."""
    q = _quantized(16, 64, 32)
    codes = q.codes.astype(np.uint8)
    pairs = (codes[:, ::2] << 4) | codes[:, 1::2]
    unpacked = np.stack([pairs >> 4, pairs & 15], -1).reshape(q.shape).astype(np.float32)
    sz = _scales_and_zeros(q)   # [groups, rows, 2]
    scale = np.repeat(sz[..., 0].T, q.group, 1)
    zero = np.repeat(sz[..., 1].T, q.group, 1)
    assert np.allclose((unpacked - 8) * scale + zero, q.dequantize(), atol=1e-5)


@pytest.mark.parametrize("rows, columns, group", [(64, 48, 16), (60, 64, 32), (64, 64, 16)])
def test_shapes_the_cuda_int4_kernel_cannot_take_are_refused(rows, columns, group):
    with pytest.raises(CapabilityError, match="CUDA int4 kernel"):
        _int4_tinygemm(_quantized(rows, columns, group), torch.device("meta"))


def test_a_rerun_across_the_longrope_switch_stays_on_the_device():
    """Phi-3's recompute where decoding crosses its LongRoPE switch runs on the device and reads
    the host nowhere beyond the step's own reads (here: the logits)."""
    checkpoint = tiny.checkpoint("phi3", 0)
    with FakeTensorMode(allow_non_fake_inputs=True):
        backend = TorchBackend(checkpoint, tiny.stand_ins(checkpoint, 4), device="meta")
        device = Device(backend)
        whole = []   # passes over every slot from 0: the prefill's and the recompute's
        begun = backend._pass
        backend._pass = lambda ids, step, starts=True: (
            whole.append(step.end) if step.start == 0 else None, begun(ids, step, starts))[1]
        prompt = [1] + [20] * (phi3.SWITCH - 2)
        out = RiverModel(backend).generate_ids([prompt], ExitConfig(
            policy="fixed", options={"layer": 1}), GenerationConfig(max_new_tokens=4))
    assert out.tokens == [[TOKEN] * 4]
    assert device.of("embed") == [[(1, device.vocab)]] * 3
    assert whole == [len(prompt), phi3.SWITCH + 1]   # one recompute, at the crossing
