"""Step times of our own engine on the real model (SmolLM2-135M, CPU): the shape of the step-time
curve the simulated replicas follow (step_curve.py fits it; the GPU coefficients come from NVIDIA's
published figures, gpu_figures.py).

    .venv/bin/python -m bench.fleet.measure [--model DIR] [--out bench/fleet/cpu_steps.json]

Decode: B sequences decoding together, the median gap between one sequence's tokens is one engine
step with batch B. Prefill: a lone prompt of P tokens, its time to first token is the prefill steps
(chunked at the engine's token budget) plus one sampling step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from msgspec.structs import replace

from bench.engine import SERVE_CONFIG, default_model
from bench.engine_driver import Driver
from gpu_container.engine.loader import load_model
from gpu_container.engine.types import SamplingParams

OUT = Path(__file__).with_name("cpu_steps.json")
BATCHES = (1, 4, 16, 48)
PROMPTS = (64, 256, 1024)


def measure(model_dir: Path, tokens: int = 24) -> dict[str, object]:
    model = load_model(model_dir)
    config = replace(SERVE_CONFIG, max_num_batched_tokens=2048, prefill_slowdown=0.0)
    decode: dict[int, float] = {}
    prefill: dict[int, float] = {}
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    with Driver(model, config) as driver:
        for batch in BATCHES:
            ids = [f"d{batch}-{i}" for i in range(batch)]
            for i, rid in enumerate(ids):
                driver.add(rid, [1, 2, 3, 4 + i], params)
            driver.wait(*ids)
            decode[batch] = statistics.median(g for rid in ids for g in driver.traces[rid].gaps[4:])
        one = SamplingParams(max_new_tokens=1, temperature=0.0)
        for length in PROMPTS:
            runs = []
            for r in range(3):
                rid = f"p{length}-{r}"
                driver.add(rid, [3 + (r + i) % 1000 for i in range(length)], one)
                driver.wait(rid)
                runs.append(driver.traces[rid].ttft)
            prefill[length] = min(runs)
    return {
        "model": str(model_dir),
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        "decode_step_s": {str(b): s for b, s in decode.items()},
        "prefill_ttft_s": {str(p): s for p, s in prefill.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    result = measure(args.model or default_model())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
