"""The records of task runs (one JSON line per task, problem and configuration, so an
interrupted run resumes), the configurations they compare, and the paper's figures of a run."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from river_core import ConfigError, ExitConfig

from .timing import machine


MAIN_OPTION = {"similarity": "threshold", "settled": "tau", "fixed": "layer", "cascade": "margin"}


@attrs.frozen
class Config:
    """`KV[/POLICY]:VALUE[@int8|@int4]`: a KV strategy, its exit policy (similarity by default)
    at the value of the policy's main option (MAIN_OPTION), stand-ins at 4 bits (HQQ) unless
    @int8; `full`; `quantized[@BITS]` (every layer a stand-in); `llamacpp`."""

    label: str
    kv: str
    policy: str | None
    value: float | None
    bits: int
    backend: str | None = None   # None: the run's --backend

    @classmethod
    def parse(cls, text: str) -> "Config":
        if text == "llamacpp":
            return cls(text, "full", None, None, 4, "llamacpp")
        body, _, bits = text.partition("@")
        head, _, value = body.partition(":")
        kv, _, policy = head.partition("/")
        if bits not in ("", "int8", "int4"):
            raise ConfigError(f"{text}: stand-in precision is @int8 or @int4")
        if kv in ("full", "quantized") and (value or policy):
            raise ConfigError(f"{text}: {kv} takes no policy or value")
        if kv not in ("full", "quantized"):
            policy = policy or "similarity"
            if policy not in MAIN_OPTION or not value:
                raise ConfigError(f"{text}: give a policy ({', '.join(MAIN_OPTION)}) and its "
                                  f"value, e.g. {kv}/settled:0.95")
        return cls(text, kv, policy or None, float(value) if value else None,
                   int(bits[3:] or 4))

    def model_key(self, backend: str) -> tuple[str, int]:
        return self.backend or backend, self.bits

    def exit_config(self) -> ExitConfig:
        if self.kv == "full":
            return ExitConfig(kv="full")
        if self.kv == "quantized":
            return ExitConfig(kv="river", policy="fixed", options={"layer": -1})
        value = int(self.value) if self.policy == "fixed" else self.value
        return ExitConfig(kv=self.kv, policy=self.policy,
                          options={MAIN_OPTION[self.policy]: value})


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
