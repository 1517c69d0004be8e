"""Evaluating as users do: lm-eval (the `lm-eval` package) against `river serve` in exit and
lossless mode and against vLLM plain, on GSM8K test_dev from a local task file.

    river bench evaluate                               # the embedded model, 100 problems
    river bench evaluate --servers river-exit --limit 20

Each server is started on loopback in turn (vLLM's OpenAI-compatible server; River's through
`river serve`), lm-eval's `local-chat-completions` model sends it the problems (0-shot,
chat template applied by the server, greedy, `--concurrent` requests at a time), and its
`exact_match` with the flexible extraction (the last number in the answer) is taken, with its
standard error and the wall time. The task file (`river_gsm8k.yaml`, written under runs/ in
the results folder, with the servers' logs) reads the JSONL locally: nothing is downloaded. Writes evaluate.{md,json}; the same
figures come from the `lm_eval` command line that docs/evaluate.md shows.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from river_models import locate

from .library.output import Output, Harness, parser
from .library.prompts import GSM8K_TEST

TASK = """task: river_gsm8k
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer.split('####')[-1].strip()}}}}"
generation_kwargs:
  until: ["Question:"]
  max_gen_toks: {tokens}
  do_sample: false
filter_list:
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
"""
SERVERS = {"vllm-plain": [], "river-exit": ["--mode", "exit"],
           "river-lossless": ["--mode", "speculative"]}


def task_folder(out: Output, data: Path, tokens: int) -> Path:
    """The local lm-eval task for `data` (GSM8K JSONL), in the results folder's runs/."""
    folder = out.runs / "lm_eval_tasks"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "river_gsm8k.yaml").write_text(TASK.format(data=data.resolve(), tokens=tokens))
    return folder


def server_command(name: str, folder: str, port: int, context: int) -> list[str]:
    vllm = ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(context),
            "--served-model-name", "river"]
    if name == "vllm-plain":
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
                "--dtype", "float32", "--enforce-eager", *vllm]
    return [sys.executable, "-m", "river_cli.main", "serve", folder, *SERVERS[name], "--vllm",
            " ".join(vllm)]


@contextlib.contextmanager
def serving(command: list[str], port: int, log: Path, env: dict | None = None):
    """A server on loopback for the block's duration (its output in `log`); stops with its log
    if it never answers."""
    with servers([(command, port, log, env)]):
        yield


@contextlib.contextmanager
def servers(specs: list[tuple[list[str], int, Path, dict | None]]):
    """Servers (command, port, log, env) started together, each a process of its own, for the
    block's duration: their starts (imports, the engine's load) overlap on a multi-core
    machine. Stops with a server's log if it never answers."""
    processes = []
    try:
        for command, port, log, env in specs:
            env = env or {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
                "VLLM_CPU_KVCACHE_SPACE", "2")}
            with log.open("w") as out:
                processes.append((subprocess.Popen(command, stdout=out,
                                                   stderr=subprocess.STDOUT, env=env),
                                  port, log))
        deadline = time.time() + 600
        for process, port, log in processes:
            while process.poll() is None and time.time() < deadline:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    time.sleep(1)
            else:
                raise SystemExit(f"the server did not come up:\n{log.read_text()[-3000:]}")
        yield
    finally:
        for process, _, _ in processes:
            process.terminate()
        for process, _, _ in processes:
            process.wait(120)


def evaluate(port: int, tasks: Path, limit: int, concurrent: int) -> dict:
    """lm-eval's chat-completions model against the server on `port`: exact match, its
    standard error, seconds."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    start = time.perf_counter()
    results = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args=f"model=river,base_url=http://127.0.0.1:{port}/v1/chat/completions,"
                   f"tokenizer_backend=None,num_concurrent={concurrent},max_retries=1",
        tasks=["river_gsm8k"], task_manager=TaskManager(include_path=str(tasks)),
        limit=limit, apply_chat_template=True)
    row = results["results"]["river_gsm8k"]
    return {"exact_match": row["exact_match,flexible-extract"],
            "stderr": row["exact_match_stderr,flexible-extract"],
            "samples": results["n-samples"]["river_gsm8k"]["effective"],
            "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> None:
    ap = parser("evaluate", __doc__)
    ap.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    ap.add_argument("--data", type=Path, default=GSM8K_TEST, help="GSM8K JSONL to score")
    ap.add_argument("--limit", type=int, default=100, help="problems")
    ap.add_argument("--max-tokens", type=int, default=256, help="of each answer")
    ap.add_argument("--concurrent", type=int, default=8, help="requests at a time")
    ap.add_argument("--context", type=int, default=2048, help="the servers' max model length")
    ap.add_argument("--port", type=int, default=8871)
    out, args = Harness.parse(ap, argv)
    try:
        import lm_eval  # noqa: F401
        import vllm  # noqa: F401
    except ImportError:
        sys.exit("the evaluate benchmark needs the vllm and eval extras: see the README")
    info = out.machine
    folder = str(locate(args.model, progress=True))
    tasks = task_folder(out, args.data, args.max_tokens)
    rows = {}
    for name in args.servers:
        print(f"serving {name}", file=sys.stderr, flush=True)
        with serving(server_command(name, folder, args.port, args.context), args.port,
                     out.runs / f"evaluate-{name}.log"):
            rows[name] = evaluate(args.port, tasks, args.limit, args.concurrent)
    command = out.command
    payload = {"command": command, "machine": info, "data": str(args.data),
               "limit": args.limit, "max_tokens": args.max_tokens,
               "concurrent": args.concurrent, "results": rows}
    lines = ["# GSM8K through lm-eval against the servers", "",
             f"Machine: {info['cpu']}, {info['cores']} cores. Command: `{command}`. lm-eval's "
             f"`local-chat-completions`, 0-shot, greedy, {args.max_tokens} tokens at most, "
             f"{args.concurrent} requests at a time, the first {args.limit} problems of "
             f"{Path(args.data).name}; exact match of the last number (flexible extraction).",
             "", "| server | exact match | standard error | problems | wall time (s) |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {r['exact_match']:.3f} | {r['stderr']:.3f} | {r['samples']} | "
              f"{r['seconds']:.0f} |" for name, r in rows.items()]
    out.write("evaluate", payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
