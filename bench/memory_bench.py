"""Peak memory of the policy trainers' heavy steps at the shape of Qwen2.5-0.5B, with random weights.

The model is a Qwen2 of 24 layers, width 896, 14 attention heads and 2 key-value heads, with a vocabulary of
151,936 tokens (Qwen2.5's), built from its config: nothing is downloaded. Each measurement runs in a fresh process,
so one peak never hides another:

- ``generate-all-logits``: `generate` asked for every step's logits, the way the policy computed log-probabilities
  before it kept only the chosen tokens' (the baseline);
- ``generate``: `LocalCausalLMPolicy`'s generation, which keeps the chosen tokens' log-probabilities only;
- ``ppo-lora``: one PPO iteration with LoRA adapters: generation, the old and reference log-probabilities (the
  reference is the model with its adapters off), and a clipped-loss update over the turns in minibatches, plus a
  value critic (a LoRA copy with a one-output head) fitted to returns;
- ``dpo``: one DPO step on a batch of chosen/rejected pairs, the reference's log-probabilities included.

On a CPU the figure is the process's peak resident memory (VmHWM, reset once the model is built), and the bar
compares the weights plus generation's growth above them with the weights plus the KV cache of every episode. On a
GPU it is `torch.cuda.max_memory_allocated`. Each phase also reports its samples (episodes' turns, or pairs) and
generated tokens per second. The bench prints its figures and writes JSON.

    python bench/memory_bench.py                       # the full shape: 32 episodes x 256 new tokens
    python bench/memory_bench.py --new-tokens 32       # a quicker look on a CPU
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151_936,
    "max_position_embeddings": 32_768,
    "tie_word_embeddings": True,
}
PHASES = ("generate-all-logits", "generate", "ppo-lora", "dpo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--episodes", type=int, default=32, help="Episodes generated together.")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="Prompt length of every episode.")
    parser.add_argument("--new-tokens", type=int, default=256, help="Tokens generated per episode.")
    parser.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"], help="Fewer for a quick look.")
    parser.add_argument("--vocab", type=int, default=SHAPE["vocab_size"], help="At least 100,000 for the bar.")
    parser.add_argument("--minibatch", type=int, default=8, help="Turns per PPO minibatch; pairs per DPO step.")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads.")
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "memory_bench.json"))
    return parser.parse_args(argv)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def build_model(args: argparse.Namespace, dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**{**SHAPE, "num_hidden_layers": args.layers, "vocab_size": args.vocab})
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = 0
    return model


def build_tokenizer(vocab: int):
    """A word-level tokenizer over the model's whole vocabulary, so any sampled id decodes."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = {f"w{index}": index for index in range(vocab)}
    backend = Tokenizer(WordLevel(words, unk_token="w1"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0", eos_token="w2", unk_token="w1")


def prompts(args: argparse.Namespace) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (args.episodes, args.prompt_tokens), generator=generator)
    return ids.tolist()


def _autocast(args: argparse.Namespace):
    """bf16 autocast on a GPU, as training runs there; nothing on a CPU, where bf16 matmuls are slow."""
    import contextlib

    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if args.device.startswith("cuda") else contextlib.nullcontext()


def kv_cache_bytes(args: argparse.Namespace, element_bytes: int) -> int:
    head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    per_token = args.layers * 2 * SHAPE["num_key_value_heads"] * head_dim * element_bytes
    return per_token * args.episodes * (args.prompt_tokens + args.new_tokens)


def _policy(model, tokenizer, args):
    from reward_models.policy.local import LocalCausalLMPolicy

    return LocalCausalLMPolicy.from_model(model, tokenizer, history_window=None, max_new_tokens=args.new_tokens)


def generate_all_logits(model, tokenizer, args) -> dict:
    """The baseline: generate() keeping every step's full-vocabulary logits, then the chosen tokens' log-probs."""
    import torch
    from transformers import GenerationConfig

    policy = _policy(model, tokenizer, args)
    batch = policy.left_padded(prompts(args), model.device)
    config = GenerationConfig(
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
    )
    with torch.inference_mode():
        output = model.generate(**batch, generation_config=config)
        generated = output.sequences[:, batch["input_ids"].shape[1] :]
        logprobs = torch.stack(output.logits, dim=1).float().log_softmax(dim=-1)
        chosen = logprobs.gather(-1, generated.unsqueeze(-1)).squeeze(-1)
    return {"generated_tokens": int(generated.numel()), "mean_logprob": float(chosen.mean())}


def generate(model, tokenizer, args) -> dict:
    policy = _policy(model, tokenizer, args)
    decisions = policy._generate(prompts(args), greedy=False, temperature=1.0, seed=0)
    tokens = sum(len(decision.token_ids) for decision in decisions)
    return {"generated_tokens": tokens, "mean_logprob": sum(d.logprob for d in decisions) / max(tokens, 1)}


def ppo_lora(model, tokenizer, args) -> dict:
    """One PPO iteration's memory, with Tandem's pieces: rollouts by `LocalCausalLMPolicy`, log-probabilities as
    PPO takes them (`turn_batches.pad_turns`, then the completion columns' logits by `completion_logits` and
    `token_logprobs`) under autocast, the clipped loss on the completion tokens, and a LoRA value critic fitted by
    `ppo_rewards.critic_forward`."""
    import torch
    from peft import get_peft_model
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    from reward_models.common.runtime import lora_settings
    from reward_models.finetune.policy_model import disable_dropout
    from reward_models.finetune.ppo_rewards import CriticWindow, critic_forward
    from reward_models.finetune.turn_batches import completion_logits, pad_turns, token_logprobs
    from reward_models.policy.turns import TurnEncoding

    def logprobs(batch):
        logits, cut = completion_logits(policy_model, batch)
        return token_logprobs(policy_model, cut, logits), cut

    autocast = _autocast(args)
    policy_model = get_peft_model(model, lora_settings(args.lora_r))
    disable_dropout(policy_model)
    critic_config = Qwen2Config(**{**SHAPE, "num_hidden_layers": args.layers, "vocab_size": args.vocab}, num_labels=1)
    with torch.device(args.device):
        critic = Qwen2ForTokenClassification(critic_config).to(model.dtype)
    critic.config.pad_token_id = 0
    critic = get_peft_model(critic, lora_settings(args.lora_r, "TOKEN_CLS"))
    policy_optimizer = torch.optim.AdamW([p for p in policy_model.parameters() if p.requires_grad], lr=1e-5)
    critic_optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=1e-5)

    policy = _policy(policy_model, tokenizer, args)
    with autocast:
        decisions = policy._generate(prompts(args), greedy=False, temperature=1.0, seed=0)
    encodings = [TurnEncoding(prompt, d.token_ids) for prompt, d in zip(prompts(args), decisions, strict=True)]
    old, reference = [], []
    with torch.no_grad(), autocast:
        for first in range(0, len(encodings), args.minibatch):
            batch = pad_turns(encodings[first : first + args.minibatch], 0).to(args.device)
            old.append(logprobs(batch)[0])
            with policy_model.disable_adapter():
                reference.append(logprobs(batch)[0])
    losses = []
    for index, first in enumerate(range(0, len(encodings), args.minibatch)):
        batch = pad_turns(encodings[first : first + args.minibatch], 0).to(args.device)
        with autocast:
            new, cut = logprobs(batch)
        mask = cut.completion_mask.float()
        advantage = torch.randn(new.shape[0], 1, device=new.device)
        ratio = (new - old[index]).exp()
        surrogate = torch.max(-advantage * ratio, -advantage * ratio.clamp(0.8, 1.2))
        loss = (surrogate * mask).sum() / mask.sum()
        loss.backward()
        policy_optimizer.step()
        policy_optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        ids = [e.prompt_ids + e.completion_ids for e in encodings[first : first + args.minibatch]]
        windows = [CriticWindow(row, row_ids, [len(row_ids) - 1], [0]) for row, row_ids in enumerate(ids)]
        with autocast:
            values = critic_forward(critic, windows, 0)
        value_loss = (values - torch.randn_like(values)).pow(2).mean()
        value_loss.backward()
        critic_optimizer.step()
        critic_optimizer.zero_grad(set_to_none=True)
    return {
        "generated_tokens": sum(len(d.token_ids) for d in decisions),
        "turns": len(encodings),
        "mean_policy_loss": sum(losses) / len(losses),
        # LoRA starts as the identity, so the policy and its reference agree exactly before the first step.
        "largest_logprob_gap_to_reference": float(
            max((o - r).abs().max() for o, r in zip(old, reference, strict=True))
        ),
    }


def dpo(model, tokenizer, args) -> dict:
    """One DPO step on `minibatch` pairs of (prompt + 256-token completion), the reference's log-probabilities
    computed first without gradients, as the trajectory-level DPO trainer does."""
    import torch

    from reward_models.finetune.turn_batches import pad_turns, token_logprobs
    from reward_models.policy.turns import TurnEncoding

    autocast = _autocast(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(2)
    pairs = []
    for prompt in prompts(args)[: args.minibatch]:
        chosen, rejected = torch.randint(3, args.vocab, (2, args.new_tokens), generator=generator).tolist()
        pairs += [TurnEncoding(prompt, chosen), TurnEncoding(prompt, rejected)]
    batch = pad_turns(pairs, 0).to(args.device)
    with torch.no_grad(), autocast:
        reference = token_logprobs(model, batch).sum(-1)
    with autocast:
        policy = token_logprobs(model, batch).sum(-1)
    margin = (policy - reference)[0::2] - (policy - reference)[1::2]
    loss = -torch.nn.functional.logsigmoid(0.1 * margin).mean()
    loss.backward()
    optimizer.step()
    return {"pairs": args.minibatch, "loss": float(loss.detach())}


RUNNERS = {"generate-all-logits": generate_all_logits, "generate": generate, "ppo-lora": ppo_lora, "dpo": dpo}


def measure(phase: str, args: argparse.Namespace, queue) -> None:
    """Run one phase in this (fresh) process and put its figures on `queue`."""
    import torch

    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    before = _rss_bytes()
    # Weights in the training precision where that is safe: bf16 on a GPU for everything but full fine-tuning (DPO
    # keeps fp32 master weights); fp32 on a CPU.
    dtype = torch.bfloat16 if cuda and phase != "dpo" else torch.float32
    model = build_model(args, dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    tokenizer = build_tokenizer(args.vocab)  # a word per vocabulary entry: its memory is no phase's
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        start_allocated = torch.cuda.memory_allocated()
    loaded = _rss_bytes()
    _reset_peak_rss()
    started = time.perf_counter()
    figures = RUNNERS[phase](model, tokenizer, args)
    seconds = time.perf_counter() - started
    result = {
        "phase": phase,
        "seconds": round(seconds, 2),
        "weights_bytes": weights,
        "kv_cache_bytes": kv_cache_bytes(args, 2 if dtype == torch.bfloat16 else 4),
        **figures,
    }
    if cuda:
        result["peak_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_above_weights_bytes"] = result["peak_bytes"] - start_allocated
    else:
        peak = _peak_rss_bytes()
        result["process_before_model_bytes"] = before
        result["after_model_bytes"] = loaded
        result["peak_bytes"] = peak
        result["peak_above_weights_bytes"] = peak - loaded
    if "generated_tokens" in figures:
        result["generated_tokens_per_second"] = round(figures["generated_tokens"] / seconds, 1)
    samples = figures.get("turns") or figures.get("pairs")
    if samples:
        result["samples_per_second"] = round(samples / seconds, 2)
    queue.put(result)


def _reset_peak_rss() -> None:
    """Start the process's peak resident memory (VmHWM) again from what it holds now (Linux: clear_refs 5), so that
    building the model does not count as the phase's peak."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.vocab < 100_000:
        print(f"note: a vocabulary of {args.vocab:,} is below the 100,000 the bar is set at")
    context = multiprocessing.get_context("spawn")
    results = []
    for phase in args.phases:
        queue = context.Queue()
        process = context.Process(target=measure, args=(phase, args, queue))
        process.start()
        process.join()
        if process.exitcode != 0 or queue.empty():
            raise SystemExit(f"the {phase} phase failed (exit code {process.exitcode}); its error is above")
        result = queue.get()
        results.append(result)
        line = (
            f"{phase:20} peak {gib(result['peak_bytes'])}, above the weights {gib(result['peak_above_weights_bytes'])}"
        )
        if "generated_tokens_per_second" in result:
            line += f", {result['generated_tokens_per_second']} generated tokens/s"
        print(f"{line} ({result['seconds']} s)", flush=True)
    report = {
        "shape": {**SHAPE, "num_hidden_layers": args.layers, "vocab_size": args.vocab},
        "device": args.device,
        "episodes": args.episodes,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "results": results,
    }
    generation = {result["phase"]: result for result in results}
    if "generate" in generation:
        figures = generation["generate"]
        # The generation's memory against what it must hold: the weights and the KV cache of every episode.
        ratio = (figures["weights_bytes"] + figures["peak_above_weights_bytes"]) / (
            figures["weights_bytes"] + figures["kv_cache_bytes"]
        )
        report["generation_over_weights_and_kv"] = round(ratio, 3)
        print(
            f"generation: weights {gib(figures['weights_bytes'])} + KV cache {gib(figures['kv_cache_bytes'])}; "
            f"peak is {ratio:.2f} x that (the bar: at most 1.3)"
        )
    if "generate" in generation and "generate-all-logits" in generation:
        saved = generation["generate-all-logits"]["peak_above_weights_bytes"] - figures["peak_above_weights_bytes"]
        report["saved_by_chosen_logprobs_bytes"] = saved
        print(f"keeping only the chosen tokens' log-probabilities saves {gib(saved)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
