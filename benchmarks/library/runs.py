"""The records of task runs (one JSON line per task, problem and configuration, so an
interrupted run resumes), the configurations they compare, and the paper's figures of a run."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from river_core import ConfigError, ExitConfig

from .timing import machine


HEAD_SUFFIX = "+stand-in-head"   # an exit-mode config's exited tokens on the head's stand-in
MAIN_OPTION = {"similarity": "threshold", "settled": "tau", "fixed": "layer", "cascade": "margin"}


@attrs.frozen
class Config:
    """A configuration the task benchmark compares, by its label:

    - `full`: the backbone at full depth (every ratio is taken against it);
    - `quantized[@int8|@int4]`: every layer a stand-in (the river from before layer 0);
    - `llamacpp`: full depth through llama-cpp-python on the same GGUF (the anchor);
    - `KV[@int8|@int4]`: exit mode with a KV strategy (river, propagate, mask, monotonic,
      recompute) under River's default exit policy and options (`river`: the paper's rule);
    - `KV[/POLICY]:VALUE[@int8|@int4]`: the same under an exit policy (similarity unless named)
      at VALUE of its main option (MAIN_OPTION);
    - `lossless/POLICY:VALUE/G[=]`: speculative mode, the river drafting under that policy, at
      most G tokens per verification, adaptive (a trailing `=`: exactly G every round);
    - an exit-mode config with `+stand-in-head`: exited tokens take the head's 8-bit stand-in
      (ExitConfig.exit_head).

    Stand-ins are the engine's own (`BackendPlugin.quant`), at 4 bits unless @int8."""

    label: str
    exit_config: ExitConfig
    bits: int = 4
    backend: str | None = None   # None: the run's --backend

    @classmethod
    def parse(cls, text: str) -> "Config":
        if text == "llamacpp":
            return cls(text, ExitConfig(kv="full"), backend="llamacpp")
        if text.startswith("lossless/"):
            return cls(text, _speculative(text))
        base, plus, extra = text.partition("+")
        if plus and plus + extra != HEAD_SUFFIX:
            raise ConfigError(f"{text}: the one suffix is {HEAD_SUFFIX}")
        if plus:
            parsed = cls.parse(base)
            return attrs.evolve(parsed, label=text, exit_config=attrs.evolve(
                parsed.exit_config, exit_head="stand-in"))
        body, _, bits = text.partition("@")
        if bits not in ("", "int8", "int4"):
            raise ConfigError(f"{text}: stand-in precision is @int8 or @int4")
        head, _, value = body.partition(":")
        kv, _, policy = head.partition("/")
        if kv in ("full", "quantized") and (value or policy):
            raise ConfigError(f"{text}: {kv} takes no policy or value")
        if policy and policy not in MAIN_OPTION:
            raise ConfigError(f"{text}: the policy is one of {', '.join(MAIN_OPTION)}")
        if kv == "full":
            config = ExitConfig(kv="full")
        elif kv == "quantized":
            config = ExitConfig(kv="river", policy="fixed", options={"layer": -1})
        else:
            config = ExitConfig(kv=kv, **_policy(policy or "similarity", value)) if value \
                else ExitConfig(kv=kv, **({"policy": policy} if policy else {}))
        return cls(text, config, int(bits[3:] or 4))

    @property
    def speculative(self) -> bool:
        return self.exit_config.lossless

    def model_key(self, backend: str) -> tuple[str, int]:
        return self.backend or backend, self.bits


def _policy(policy: str, value: str) -> dict:
    """ExitConfig's policy and its main option at `value`."""
    number = int(value) if policy == "fixed" else float(value)
    return {"policy": policy, "options": {MAIN_OPTION[policy]: number}}


def _speculative(text: str) -> ExitConfig:
    _, policy_value, length = (text.split("/") + [""])[:3]
    policy, _, value = policy_value.partition(":")
    if policy not in MAIN_OPTION or not value or not length.rstrip("=").isdigit():
        raise ConfigError(f"{text}: a speculative config is lossless/POLICY:VALUE/G[=], e.g. "
                          f"lossless/fixed:-1/6")
    return ExitConfig(mode="speculative", **_policy(policy, value),
                      draft_tokens=int(length.rstrip("=")), adaptive=not length.endswith("="))


class Run:
    """Records on disk, one JSON line per (task, problem, config), and the machine they ran
    on, measured (memory bandwidth included) when the run started, before any model loaded."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = folder / name / "records.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        described = self.path.with_name("machine.json")
        if not described.is_file():
            described.write_text(json.dumps(machine()))
        self.machine = json.loads(described.read_text())
        self.records = {}
        if self.path.is_file():
            for line in self.path.open():
                r = json.loads(line)
                self.records[(r["task"], r["problem"], r["config"])] = r

    def has(self, task, problem, config) -> bool:
        return (task, problem, config) in self.records

    def add(self, record: dict) -> None:
        self.records[(record["task"], record["problem"], record["config"])] = record
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def of(self, task: str, config: str) -> dict:
        return {p: r for (t, p, c), r in self.records.items() if t == task and c == config}


def paper_summary(rows: dict) -> dict | None:
    """The paper's three figures for the best River config of a run: its speedup over the
    backbone, its speed relative to the whole quantized model, and the share of the quantized
    model's NLL gap it recovers. Best: the fastest River config recovering at least half of
    the gap, else the one recovering most. None without `full`, `quantized` and NLL."""
    quant = next((r for label, r in rows.items() if label.startswith("quantized")), None)
    rivers = {label: r for label, r in rows.items()
              if label.startswith("river") and r["nll_delta"] is not None}
    if quant is None or not rivers or not quant["nll_delta"]:
        return None
    recovered = {label: (quant["nll_delta"] - r["nll_delta"]) / quant["nll_delta"]
                 for label, r in rivers.items()}
    half = [label for label in rivers if recovered[label] >= 0.5]
    best = max(half, key=lambda l: rivers[l]["speedup"]) if half else \
        max(recovered, key=recovered.get)
    figures = {label: {"river_speedup_vs_backbone": r["speedup"],
                       "river_speed_vs_full_quant": r["speedup"] / quant["speedup"],
                       "nll_gap_recovered": recovered[label]} for label, r in rivers.items()}
    return {"river_config": best, **figures[best], "every_river_config": figures}
