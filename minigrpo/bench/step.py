"""bench's `step` section (`python -m minigrpo.bench --only step`): the wall time of one GRPO step,
ours and TRL's.

Issue 13's setting: a 4-layer, 4-head, 128-wide GPT over the food task's 27 ids, 1 prompt ('ravin
likes ') x 8 completions, at most 12 new tokens, μ = 1, TRL's default β (0 in trl 1.16) and lr
(1e-6), AdamW, a trivial reward (the share of 'a'), one thread. Both sides start from the SAME
random weights (ours copied into GPT-2's layout, which is ours transposed; the table prints the
largest logit difference), so their completions share one length distribution (means printed).
  minigrpo  rollout.collect (KV-cache sampling, reward, and by default π_ref's log-probs for the
            rollout's KL) + GRPO.update (advantages, loss, backward, clip, AdamW) through
            Run.clip_and_step: the library's code, with no anchor, trust region or exact evaluation
            (TRL has none). Timed three ways: the default; with --no-rollout-kl (at β = 0 no π_ref
            forward: TRL's work, so the ratio the bar compares); and with the plain forward
            (shifted_forward(..., shared_prefixes=False), patched in for that timing only).
  TRL       GRPOTrainer (only if `import trl` works: never a dependency) on a GPT2LMHeadModel,
            use_cpu, no vLLM, a character-level PreTrainedTokenizerFast; a step is on_step_begin to
            on_step_end (generation, reward, loss, backward, clip, optimizer step; data loading and
            the logging hook fall outside, as ours do).
They alternate in rounds (the order rotating), a warm-up step then the round's timed steps, so load
on a shared machine falls on all alike; each round seeds TRL anew, so both sides time fresh
completions (with one seed TRL repeated the same ones every round). Reported: median (min–max) ms
per step, and each median over TRL's with the range of the per-round ratios. Without trl the ratio
goes through a recorded paired figure (ours with the plain forward over TRL's on the 2-core x86_64
machine of the README, trl 1.16.0: RECORDED x ours / ours-plain), and the table says so; that ratio
depends on the machine, so trust a paired run.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from types import SimpleNamespace

import torch

from minigrpo.bench.common import table, timed
from minigrpo.grpo import GRPO, GRPOConfig
from minigrpo.lm import logprobs, sampling
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.optim import AdamW
from minigrpo.lm.tokenizer import SPECIALS, CharTokenizer
from minigrpo.rl.algorithm import rollout_flags
from minigrpo.rl.loop import Run
from minigrpo.rl.rollout import collect
from toy_tasks.food import ALPHABET
from toy_tasks.rewards import Reward

PROMPT, BLOCK, LR = "ravin likes ", 32, 1e-6  # LR: TRL's default, on both sides
# ours (plain forward) / TRL's GRPOTrainer, paired on this machine with trl installed: the rounds
RECORDED = 0.56
# are in docs/performance.md; used where trl is not importable, and the section says so
OURS, PLAIN, TRL = "minigrpo (default)", "minigrpo, plain forward", "TRL GRPOTrainer"
NO_KL = "minigrpo --no-rollout-kl (TRL's work at β = 0)"


def share_of_a(prompt: str, completion: str) -> float:
    """The trivial reward both sides use."""
    return completion.count("a") / max(1, len(completion))


def fresh_gpt(n_layer: int, n_head: int, n_embd: int, seed: int = 0) -> GPT:
    """A randomly initialised GPT over the food task's characters: the initial weights of both
    sides."""
    torch.manual_seed(seed)
    return GPT(
        GPTConfig(
            vocab_size=len(SPECIALS) + len(ALPHABET),
            block_size=BLOCK,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
        )
    )


def our_step(
    init: GPT, group: int, new_tokens: int, beta: float, seed: int = 0, rollout_kl: bool = True
):
    """-> a function running one of our GRPO steps (rollout + update) on a copy of `init`;
    step.lengths collects each rollout's mean completion length (tokens, EOS included)."""
    tok, policy = CharTokenizer(ALPHABET), copy.deepcopy(init).train()
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    cfg = GRPOConfig(
        group_size=group,
        prompts_per_step=1,
        max_new_tokens=new_tokens,
        updates=1,
        beta=beta,
        loss_agg="token-mean",
        preserve=False,
        trust_region=0.0,
        trust_region_anchor=0.0,
        lr=LR,
        # token-mean: TRL's loss_type "dapo"
        warmup=0,
        seed=seed,
        quiet=True,
        rollout_kl=rollout_kl,
    )
    # what GRPO.update reads of a Run
    run = SimpleNamespace(cfg=cfg, policy=policy, anchor_term=lambda: None, step=0)
    run.clip_and_step = lambda opt, loss, params: Run.clip_and_step(run, opt, loss, params)
    algo, reward, gen = (
        GRPO(run),
        Reward("share_of_a", share_of_a),
        torch.Generator().manual_seed(seed),
    )
    opt = AdamW(algo.parameters(), lr=LR)

    def step():
        batch = collect(
            policy,
            ref,
            tok,
            [PROMPT],
            group,
            reward,
            gen,
            new_tokens,
            cfg.temperature,
            cfg.unfinished_reward,
            **rollout_flags(algo),
        )
        algo.update(batch, opt)
        step.lengths.append(batch.mask.sum(1).float().mean().item())

    step.lengths = []
    return step


@contextmanager
def plain_forward():
    """Inside: every binding of logprobs.shifted_forward runs the plain forward, and no prefix tree
    is built."""
    orig, tree = logprobs.shifted_forward, sampling.Generation.prefix_tree

    def plain(model, ids, key_mask=None, temperature=1.0, tree=None, shared_prefixes=True):
        return orig(model, ids, key_mask, temperature, shared_prefixes=False)

    mods = [
        m
        for n, m in list(sys.modules.items())
        if n.startswith("minigrpo") and getattr(m, "shifted_forward", None) is orig
    ]
    for m in mods:
        m.shifted_forward = plain
    sampling.Generation.prefix_tree = lambda self: None
    try:
        yield
    finally:
        for m in mods:
            m.shifted_forward = orig
        sampling.Generation.prefix_tree = tree


def as_gpt2(model: GPT, transformers):
    """The same function as a GPT2LMHeadModel (GPT-2's layout is ours: pre-norm blocks, learned
    positions, tied head; its Conv1D weights are our Linear weights transposed; exact GELU, dropout
    0)."""
    c = model.cfg
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=c.vocab_size,
            n_positions=c.block_size,
            n_layer=c.n_layer,
            n_head=c.n_head,
            n_embd=c.n_embd,
            activation_function="gelu",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=2,
        )
    )
    names = {
        "ln1": "ln_1",
        "ln2": "ln_2",
        "attn.qkv": "attn.c_attn",
        "attn.proj": "attn.c_proj",
        "mlp.0": "mlp.c_fc",
        "mlp.2": "mlp.c_proj",
    }
    state = {"lm_head.weight": model.wte.weight}
    for k, v in model.state_dict().items():
        if k.startswith("blocks."):  # blocks.<i>.<module>.<weight|bias>
            i, rest = k.split(".", 2)[1:]
            mod, kind = rest.rsplit(".", 1)
            k, v = (
                f"h.{i}.{names[mod]}.{kind}",
                v.t() if kind == "weight" and not mod.startswith("ln") else v,
            )
        state[f"transformer.{k}"] = v
    gpt2.load_state_dict({k: v.clone() for k, v in state.items()})
    return gpt2


def trl_runner(init: GPT, group: int, new_tokens: int, seed: int = 0):
    """-> .run(n) timing n TRL GRPOTrainer steps (after a warm-up) on a GPT-2 copy of `init`, .beta
    (TRL's default), .lengths, .same (max |Δ logit| of the copy), .version; None when trl cannot be
    imported."""
    try:
        import transformers
        import trl
        from datasets import Dataset
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    # not installed, or broken: the section reports ours against the recorded ratio
    except Exception:
        return None
    transformers.logging.set_verbosity_error()
    tk = Tokenizer(
        models.WordLevel({c: i for i, c in enumerate([*SPECIALS, *ALPHABET])}, unk_token=None)
    )
    # one token per character
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 0)]
    )
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    model, x = (
        as_gpt2(init, transformers).train(),
        torch.tensor([CharTokenizer(ALPHABET).encode(PROMPT, bos=True)]),
    )
    with torch.no_grad():
        same = (model(x).logits - init(x)).abs().max().item()
    beta, lengths = trl.GRPOConfig.__dataclass_fields__["beta"].default, []

    def reward(completions, **kw):
        return [share_of_a("", c) for c in completions]

    class Timer(transformers.TrainerCallback):
        def __init__(self):
            self.t, self.times = 0.0, []

        def on_step_begin(self, *a, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **kw):
            self.times.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **kw):  # the train()'s mean, EOS included
            lengths.append((logs or {}).get("completions/mean_length"))

    calls = itertools.count(seed)

    def run(n: int, warmup: int = 1) -> list[float]:
        """Each call seeds TRL anew (seed, seed+1, ...): fresh completions every round, as our steps
        draw them."""
        timer, threads = Timer(), torch.get_num_threads()
        with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
            # transformers' deprecation notices about its own defaults
            warnings.simplefilter("ignore")
            args = trl.GRPOConfig(
                output_dir=out,
                use_cpu=True,
                bf16=False,
                use_vllm=False,
                num_generations=group,
                per_device_train_batch_size=group,
                max_completion_length=new_tokens,
                beta=beta,
                num_iterations=1,
                learning_rate=LR,
                lr_scheduler_type="constant",
                max_steps=warmup + n,
                save_strategy="no",
                report_to=[],
                disable_tqdm=True,
                logging_steps=10_000,
                seed=next(calls),
            )
            trainer = trl.GRPOTrainer(
                model=model,
                reward_funcs=[reward],
                args=args,
                processing_class=hf_tok,
                train_dataset=Dataset.from_dict({"prompt": [PROMPT] * (warmup + n)}),
                callbacks=[timer],
            )
            # its end-of-training dict of metrics
            trainer.remove_callback(transformers.PrinterCallback)
            trainer.train()
        torch.set_num_threads(threads)
        return timer.times[warmup:]

    return SimpleNamespace(
        run=run,
        beta=beta,
        lengths=lengths,
        same=same,
        version=f"trl {trl.__version__}, transformers {transformers.__version__}",
    )


def bench_step(
    steps: int = 40,
    rounds: int = 8,
    n_layer: int = 4,
    n_head: int = 4,
    n_embd: int = 128,
    group: int = 8,
    new_tokens: int = 12,
    use_trl: bool = True,
) -> str:
    """Time ours (shared-prefix and plain forward) and TRL's GRPO step, alternating; -> a markdown
    table."""
    init = fresh_gpt(n_layer, n_head, n_embd)
    trl_side = trl_runner(init, group, new_tokens) if use_trl else None
    beta = trl_side.beta if trl_side is not None else 0.0  # TRL's default β (0.0 in trl 1.16)
    shared, plain = our_step(init, group, new_tokens, beta), our_step(init, group, new_tokens, beta)
    no_kl = our_step(init, group, new_tokens, beta, rollout_kl=False) if beta == 0 else None

    def plain_times(n):
        with plain_forward():
            return timed(plain, n)

    impls = {
        OURS: (lambda n: timed(shared, n), shared.lengths),
        PLAIN: (plain_times, plain.lengths),
    }
    if no_kl is not None:
        impls[NO_KL] = (lambda n: timed(no_kl, n), no_kl.lengths)
    if trl_side is not None:
        impls[TRL] = (trl_side.run, trl_side.lengths)
    names = list(impls)
    times, per_round = {k: [] for k in names}, {k: [] for k in names}
    for r in range(rounds):
        n = steps // rounds + (r < steps % rounds)
        for k in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order each round
            t = impls[k][0](n)
            times[k] += t
            per_round[k].append(statistics.median(t))
    med = statistics.median
    rows = []
    for k in names:
        if trl_side is not None:
            rs = [a / b for a, b in zip(per_round[k], per_round[TRL])]
            ratio = f"{med(times[k]) / med(times[TRL]):.2f} (rounds {min(rs):.2f}–{max(rs):.2f})"
        else:
            ratio = (
                f"{RECORDED * med(times[k]) / med(times[PLAIN]):.2f} (via the recorded "
                f"plain/TRL {RECORDED})"
            )
        known = [x for x in impls[k][1] if x is not None]
        rows.append(
            [
                k,
                len(times[k]),
                f"{1000 * med(times[k]):.1f} ({1000 * min(times[k]):.1f}–"
                f"{1000 * max(times[k]):.1f})",
                ratio,
                f"{statistics.mean(known):.1f}" if known else "?",
            ]
        )
    how = (
        f"paired in this run ({trl_side.version}; the same initial weights: max |Δ logit| "
        f"{trl_side.same:.0e})"
        if trl_side is not None
        else f"trl not importable: ratio to TRL via the recorded plain/TRL ratio {RECORDED} "
        "(2-core x86_64, trl 1.16.0)"
    )
    return table(
        f"step: one GRPO step, {n_layer}x{n_embd} model ({n_head} heads), 1 prompt x {group}, "
        f"{new_tokens} new tokens, μ=1, β={beta:g}, {torch.get_num_threads()} thread(s), {rounds} "
        f"alternating rounds; {how}",
        [
            "implementation",
            "steps",
            "ms/step median (min–max)",
            "ratio to TRL",
            "mean completion tokens",
        ],
        rows,
    )


if __name__ == "__main__":
    print(bench_step())
