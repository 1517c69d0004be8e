"""How large a model's activations get, measured once per half-precision export: what decides
whether its CUDA graphs may run in float16.

float16 holds magnitudes up to 65,504; an activation past that becomes inf, the next norm makes
it NaN, and so do the logits (a known fault of some families in float16). The export
runs each layer's float32 graph on the CPU over a short calibration text, every intermediate
value a graph output (the RMS norms fused, as ONNX Runtime runs them on either device, so a
norm's square is not counted), and records each layer's largest finite magnitude, or inf. A
model whose peak, with `HEADROOM`, passes float16's range is refused in one line when its
float16 export loads, on any device (`check_float16`): the engine cannot bind a bfloat16
export yet (export.DTYPES), so on CUDA such a model is refused rather than run to NaN.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort

from river_core.contract.backend import Step
from river_core.settings.errors import ConfigError
from river_core.contract.layout import Layout
from river_models import Checkpoint

from .feeds import layer_feeds, step_pass
from .half import fuse_rms_norms
from .sessions import session_options

FLOAT16_MAX = 65504.0
# one short text sees less than every text will, so the peak must fit twice over; not more:
# the largest activations of a model are its "massive" ones, on the first token and a few
# delimiters, reached by any text (the embedded SmolLM2's 23,202 in layers 11-28, 2.8x under)
HEADROOM = 2.0
TEXT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May? "
        "Let's think step by step.")


def calibration_ids(checkpoint: Checkpoint) -> np.ndarray:
    """[1, tokens]: `TEXT` in the model's tokens; a model without text (a random shape for
    speed only) takes ids spread over its vocabulary."""
    encode = getattr(checkpoint.tokenizer, "encode", None)
    ids = encode(TEXT) if encode is not None else \
        np.linspace(1, checkpoint.spec.vocab - 1, 48).astype(np.int64)
    return np.asarray([ids], dtype=np.int64)


class Meter:
    """Runs a model's float32 layer graphs one after the other on the calibration text,
    keeping each one's peak magnitude (`peaks`)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        spec = checkpoint.spec
        ids = calibration_ids(checkpoint)
        n = ids.shape[1]
        view = Layout([n], n, spec.num_layers).view(Step(0, n), spec.windows, False)
        # the half exports' graphs, which have attention's causal branch
        self._pass = step_pass(spec, np.dtype(np.float32), view, ids, causal_branch=True)
        self._cache = np.zeros((1, spec.kv_heads, n, spec.head_dim), np.float32)
        embed = np.asarray(checkpoint.weights.embed, np.float32)[ids]
        self.h = embed * np.float32(spec.embed_scale)
        self.peaks: list[float] = []

    def layer(self, i: int, block: onnx.ModelProto) -> None:
        """Runs layer i's float32 graph `block` (graphs.block; left unchanged) on the states."""
        model = onnx.ModelProto()
        model.CopyFrom(block)
        fuse_rms_norms(model.graph)
        named = {o.name for o in model.graph.output}
        model.graph.output.extend(onnx.ValueInfoProto(name=name) for node in model.graph.node
                                  for name in node.output if name and name not in named)
        options = session_options("cpu")   # the process's one thread pool
        options.log_severity_level = 3   # not the fused norms' left-over epsilons
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        feeds = layer_feeds(self._pass, i, self.h, None)
        feeds.update(past_k=self._cache.copy(), past_v=self._cache.copy())
        inputs = {x.name for x in session.get_inputs()}
        outputs = session.run(None, {k: v for k, v in feeds.items() if k in inputs})
        self.peaks.append(_peak([self.h, *outputs]))   # its input: the embedding's, at 0
        self.h = outputs[[o.name for o in session.get_outputs()].index("h_out")]

def _peak(values: Sequence[np.ndarray]) -> float:
    """The largest magnitude among the float arrays of `values`; inf if any is not finite."""
    peak = 0.0
    for v in values:
        v = np.asarray(v)
        if v.dtype.kind != "f" or v.size == 0:
            continue
        finite = np.isfinite(v)
        if not finite.all():
            # -inf in an attention bias is a mask, not an overflow; only a graph's outputs
            # are measured here, and none carries one
            return float("inf")
        peak = max(peak, float(np.abs(v).max()))
    return peak


def check_float16(peaks: Sequence[float] | None, model: str) -> None:
    """Refuses float16 for a model whose measured activations, with `HEADROOM`, pass its
    range; None: not measured (a float32 export)."""
    if peaks is None:
        return
    over = [i for i, peak in enumerate(peaks) if peak * HEADROOM > FLOAT16_MAX]
    if not over:
        return
    raise ConfigError(
        f"{model}'s activations reach {peaks[over[0]]:.3g} in layer {over[0]} of {len(peaks)} "
        f"(float16 holds {FLOAT16_MAX:.0f}, and River asks for {HEADROOM:.0f}x headroom), so "
        f"its float16 graphs would give NaN logits, and the onnx engine cannot run its "
        f"bfloat16 export yet; on cuda use --backend hf (bfloat16), on the CPU float32")
