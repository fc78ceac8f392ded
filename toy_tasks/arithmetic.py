"""The verifiable-arithmetic world: lines "<expression>=<answer>." from a declared, noisy solver.

Expressions are 2 or 3 single-digit operands joined by + - * with the usual precedence (* first,
then + and - left to right): "3+2*2=" -> 7, "3-2-1=" -> 0. The pretraining corpus answers them like
an unreliable student whose error model is declared below, so everything a run is judged by is known
exactly:
  EXPRESSIONS, PROMPTS, HELDOUT  every prompt (543); the RL prompts; a fixed seeded tenth never used
                                 in RL
  OUTCOMES                       the error model, NUMBERS x WRITINGS: (kind, probability, offset,
                                 template)
  make_corpus(n, seed)           lines uniform over EXPRESSIONS (HELDOUT included) with the error
                                 model applied: exact per expression when n is a multiple of N *
                                     CORPUS_UNIT
  entropy_floor()                the corpus entropy in nats per predicted token: the best loss
                                 possible
  exact_outcomes(...)            the model's exact probability of every declared completion
                                 (teacher- forced, batched forwards), so 1 - sum = mass off the
                                     declared support
Completion FORMAT: the integer (optional "-", no leading zeros) then "." then the end token: "11.".
PRETRAIN_DEFAULTS pass `pretrain_report` (86880 = N * CORPUS_UNIT lines: an exact corpus).
"""

from __future__ import annotations

import itertools
import math
import random
import re

import torch

from minigrpo.lm.logprobs import completion_logprobs
from minigrpo.lm.sampling import decode_completions, encode_prompts, generate
from toy_tasks import largest_remainder
from toy_tasks.support import reward_figures

NAME = "arithmetic"
# Flags that differ from the CLIs' food-tuned defaults (why, and PPO's lr: docs/experiments.md, the
# arithmetic world).
PRETRAIN_DEFAULTS = {
    "steps": 3000,
    "batch_size": 128,
    "n_embd": 32,
    "n_head": 2,
    "lr": 1e-2,
    "n_lines": 86880,
}
RL_DEFAULTS = {
    "prompts_per_step": 64,
    "group_size": 8,
    "steps": 300,
    "reward": "correct+format",
    "lr": 6e-4,
}
# a completion with no answer at all (support.py; the off-support value is a bound here)
OFF_SUPPORT_PROBES = ("",)
OPS = "+-*"
DIGITS_2 = "0123456789"  # operands of the 2-operand expressions: 10 * 3 * 10 = 300
# operands of the 3-operand expressions: 3 * 3 * 3 * 3 * 3 = 243 (precedence matters)
DIGITS_3 = "123"
HELDOUT_FRACTION, HELDOUT_SEED = 0.1, 1234

# The error model: the corpus "student" picks a number, then (independently) how to write it down.
# the true value v, or the near misses v+1, v-1
P_RIGHT_NUMBER, P_PLUS_1, P_MINUS_1 = 0.75, 0.125, 0.125
P_WELL_FORMED = 0.80  # "n."   the number then "." (FORMAT) ...
P_NO_DOT = 0.10  # "n"    ... or a format slip: the dot missing,
P_DOUBLE_DOT = 0.05  # "n.."  doubled,
P_SPACE = 0.05  # " n."  or a space in front
P_CORRECT = round(P_RIGHT_NUMBER * P_WELL_FORMED, 12)  # 0.6: the right, well-formed answer "v."
NUMBERS = [("right", 0, P_RIGHT_NUMBER), ("plus1", 1, P_PLUS_1), ("minus1", -1, P_MINUS_1)]
WRITINGS = [
    ("ok", "{}.", P_WELL_FORMED),
    ("no_dot", "{}", P_NO_DOT),
    ("double_dot", "{}..", P_DOUBLE_DOT),
    ("space", " {}.", P_SPACE),
]
OUTCOMES = [  # (kind, probability, offset from v, template): 12 distinct completions per expression
    (f"{n}/{w}", pn * pw, off, tpl) for n, off, pn in NUMBERS for w, tpl, pw in WRITINGS
]
KINDS = [k for k, _, _, _ in OUTCOMES]
# lines per expression for which every outcome count is an integer (0.125 * 0.05 = 1/160)
CORPUS_UNIT = 160
# make_corpus apportions in 1/8 ...
assert all(abs(q * 8 - round(q * 8)) < 1e-9 for _, _, q in NUMBERS)
assert all(abs(q * 20 - round(q * 20)) < 1e-9 for _, _, q in WRITINGS)  # ... and 1/20
assert abs(sum(p for _, p, _, _ in OUTCOMES) - 1) < 1e-12
assert all(abs(p * CORPUS_UNIT - round(p * CORPUS_UNIT)) < 1e-9 for _, p, _, _ in OUTCOMES)

FORMAT = re.compile(r"(0|-?[1-9][0-9]*)\.")  # a completion is well-formed iff it fully matches this
# lenient parse: the first integer anywhere (ASCII digits only)
_FIRST_INT = re.compile(r"-?[0-9]+")


def evaluate(expression: str) -> int:
    """Value of "a op b [op c]" (no "="): * binds tighter than + and -, which go left to right."""
    tokens = re.findall(r"[0-9]+|[-+*]", expression)
    if "".join(tokens) != expression or len(tokens) % 2 == 0:
        raise ValueError(f"not an expression: {expression!r}")
    total, sign, product = 0, 1, int(tokens[0])
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            product *= int(num)
        else:
            total, sign, product = total + sign * product, (1 if op == "+" else -1), int(num)
    return total + sign * product


def _expressions() -> list[str]:
    two = [f"{a}{o}{b}" for a, o, b in itertools.product(DIGITS_2, OPS, DIGITS_2)]
    three = [
        f"{a}{o}{b}{p}{c}"
        for a, o, b, p, c in itertools.product(DIGITS_3, OPS, DIGITS_3, OPS, DIGITS_3)
    ]
    return [e + "=" for e in two + three]


EXPRESSIONS = _expressions()  # prompts, each ending in "="
VALUES = {p: evaluate(p[:-1]) for p in EXPRESSIONS}
_held = set(
    random.Random(HELDOUT_SEED).sample(EXPRESSIONS, round(HELDOUT_FRACTION * len(EXPRESSIONS)))
)
# never used in RL (but in pretraining, like every prompt)
HELDOUT = [p for p in EXPRESSIONS if p in _held]
PROMPTS = [p for p in EXPRESSIONS if p not in _held]  # the RL prompts


def value(prompt: str) -> int:
    """True value of a prompt "<expression>=" (any expression, not only those in EXPRESSIONS)."""
    return VALUES[prompt] if prompt in VALUES else evaluate(prompt.removesuffix("="))


def answer(prompt: str) -> str:
    """The right, well-formed completion of a prompt: "3+4*2=" -> "11."."""
    return f"{value(prompt)}."


def completions(prompt: str) -> list[str]:
    """The completion of each declared outcome kind (in KINDS order) for one prompt."""
    v = value(prompt)
    return [tpl.format(v + off) for _, _, off, tpl in OUTCOMES]


ALPHABET = "".join(sorted(set("".join(p + c for p in EXPRESSIONS for c in completions(p)))))
# BOS + longest line (10 characters, e.g. "3*3*3=28..") + EOS = 12, with room to spare
BLOCK_SIZE = 16


def _apportion(n: int, weights: list[int]) -> list[int]:
    """Kinds for n successive lines: each goes to the kind furthest below its share w_k / W of the
    lines so far (ties to the lower index). Every prefix's counts stay within one line of their
    shares."""
    total, counts, out = sum(weights), [0] * len(weights), []
    for t in range(1, n + 1):
        k = max(range(len(weights)), key=lambda i: t * weights[i] - total * counts[i])
        counts[k] += 1
        out.append(k)
    return out


def make_corpus(n_lines: int, seed: int = 0) -> list[str]:
    """`n_lines` lines "<prompt><completion>", shuffled by `seed`.

    Each expression gets n/N lines (N = len(EXPRESSIONS); the n mod N extra lines go to expressions
    picked by `seed`), laid out one expression after another; successive lines take their NUMBERS by
    `_apportion`, and the lines of each number take their WRITINGS the same way. So every count (a
    number's, or a number-and-writing's) is within one line of its share globally, within two lines
    per expression, and exact per expression when n is a multiple of N * CORPUS_UNIT.
    """
    rng = random.Random(seed)
    order = EXPRESSIONS[:]
    rng.shuffle(order)
    slots = [
        p for p, c in zip(order, largest_remainder(n_lines, [1.0] * len(order))) for _ in range(c)
    ]
    numbers = _apportion(n_lines, [round(q * 8) for _, _, q in NUMBERS])  # shares in 1/8
    # in 1/20
    writings = [
        iter(_apportion(numbers.count(i), [round(q * 20) for _, _, q in WRITINGS]))
        for i in range(len(NUMBERS))
    ]
    lines = []
    for p, i in zip(slots, numbers):
        _, off, _ = NUMBERS[i]
        lines.append(p + WRITINGS[next(writings[i])][1].format(value(p) + off))
    rng.shuffle(lines)
    return lines


def line_distribution() -> dict[str, float]:
    """P(line) over full line strings (outcomes that gave the same string would be merged)."""
    dist: dict[str, float] = {}
    for p in EXPRESSIONS:
        for (_, q, _, _), c in zip(OUTCOMES, completions(p)):
            dist[p + c] = dist.get(p + c, 0.0) + q / len(EXPRESSIONS)
    return dist


def entropy_floor() -> float:
    """Exact corpus entropy in nats per predicted token: H(line) / E[len(line) + 1] (characters +
    EOS)."""
    dist = line_distribution()
    h = -sum(p * math.log(p) for p in dist.values() if p > 0)
    return h / sum(p * (len(s) + 1) for s, p in dist.items())


# ---- rewards: f(prompt, completion) -> float; never raise on any completion
# -----------------------


def first_int_is(completion: str, value: int) -> bool:
    """Lenient check: the first integer in `completion` (ASCII digits, optional "-") equals
    `value`."""
    m = _FIRST_INT.search(completion)
    # bounded: no giant ints
    return m is not None and len(m.group()) <= 24 and int(m.group()) == value


def reward_correct(prompt: str, completion: str) -> float:
    return float(first_int_is(completion, value(prompt)))


def reward_format(prompt: str, completion: str) -> float:
    return float(FORMAT.fullmatch(completion) is not None)


def reward_strict(prompt: str, completion: str) -> float:
    return float(completion == answer(prompt))


_REWARD_FNS = {
    "correct": reward_correct,
    "format": reward_format,
    "strict": reward_strict,
    "correct+format": lambda p, c: reward_correct(p, c) + reward_format(p, c),
}
REWARD_RANGES = {
    "correct": (0.0, 1.0),
    "format": (0.0, 1.0),
    "strict": (0.0, 1.0),
    "correct+format": (0.0, 2.0),
}
REWARDS = {"arith": _REWARD_FNS.get}  # factory(name) -> reward function, or None if not ours
REWARD_HELP = {
    "correct": "1 iff the first integer in the completion is the true value (format slips still "
    "count)",
    "format": "1 iff the completion is well-formed: an integer then '.', e.g. '11.'",
    "correct+format": "correct + format (0..2)",
    "strict": "1 iff the completion is exactly the right, well-formed answer",
}


# ---- exact and sampled evaluation --------------------------------------------------------------


@torch.no_grad()
def _probs(model, tok, prompts: list[str], comps: list[str], chunk: int = 8192) -> torch.Tensor:
    """Exact P(completion + EOS | prompt) for each pair, in as few batched forwards as `chunk`
    allows."""
    out = [
        completion_logprobs(model, tok, prompts[i : i + chunk], comps[i : i + chunk]).exp()
        for i in range(0, len(prompts), chunk)
    ]
    return torch.cat(out).cpu()


def exact_accuracy(model, tok, prompts: list[str]) -> float:
    """Mean over prompts of the exact probability of the right, well-formed answer ("11." + EOS)."""
    return _probs(model, tok, prompts, [answer(p) for p in prompts]).mean().item()


def exact_outcomes(model, tok, prompts: list[str]) -> torch.Tensor:
    """(len(prompts), len(KINDS)): the exact probability of each declared outcome's completion."""
    comps = [c for p in prompts for c in completions(p)]
    return _probs(model, tok, [p for p in prompts for _ in KINDS], comps).view(
        len(prompts), len(KINDS)
    )


@torch.no_grad()
def sampled_accuracy(
    model, tok, prompts: list[str], n_per_prompt: int, generator=None, chunk: int = 4096
) -> float:
    """Share of sampled completions (temperature 1) that are exactly the right, well-formed
    answer."""
    rows = [p for p in prompts for _ in range(n_per_prompt)]
    device = model.wte.weight.device
    hits = 0
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        ids, mask = encode_prompts(tok, part, device)
        gen = generate(model, ids, mask, max_new_tokens=BLOCK_SIZE, generator=generator)
        texts, done = decode_completions(tok, gen), gen.finished.tolist()
        hits += sum(d and t == answer(p) for p, t, d in zip(part, texts, done))
    return hits / len(rows)


def _figures(model, tok, prompts: list[str], probs: torch.Tensor | None = None) -> dict:
    """Means over prompts of exact figures: P(right answer "v."), P(right number, any declared
    writing), P(well-formed, any declared number), mass off the 12 declared completions, and the TV
    to the model. `probs` (P, K): exact_outcomes of `prompts`, when already computed."""
    probs = exact_outcomes(model, tok, prompts) if probs is None else probs  # (P, K)
    declared = torch.tensor([q for _, q, _, _ in OUTCOMES])
    off = (1 - probs.sum(1)).clamp(min=0)
    tv = 0.5 * ((probs - declared).abs().sum(1) + off)
    kinds = dict(zip(KINDS, probs.mean(0).tolist()))
    return {
        "right": kinds["right/ok"],
        "right_number": sum(kinds[f"right/{w}"] for w, _, _ in WRITINGS),
        "well_formed": sum(kinds[f"{n}/ok"] for n, _, _ in NUMBERS),
        "off_support": off.mean().item(),
        "mean_tv": tv.mean().item(),
        "kinds": kinds,
    }


BAR = {
    "right": 0.05,
    "right_number": 0.05,
    "well_formed": 0.05,
    "off_support": 0.03,
    "mean_tv": 0.10,
}
_TRUTH = {
    "right": P_CORRECT,
    "right_number": P_RIGHT_NUMBER,
    "well_formed": P_WELL_FORMED,
    "off_support": 0.0,
    "mean_tv": 0.0,
}


def pretrain_report(model, tokenizer) -> dict:
    """Exact figures on PROMPTS and HELDOUT; `ok` = every figure is within BAR of the declared
    truth."""
    rows = {
        "prompts": _figures(model, tokenizer, PROMPTS),
        "heldout": _figures(model, tokenizer, HELDOUT),
    }
    ok = all(abs(r[k] - _TRUTH[k]) <= BAR[k] for r in rows.values() for k in BAR)
    return {**rows, "ok": ok}


def format_report(report: dict) -> str:
    lines = [
        f"{'':<9}" + "".join(f"{c:>13}" for c in BAR),
        f"{'declared':<9}" + "".join(f"{_TRUTH[c]:>13.4f}" for c in BAR),
    ]
    for name in ("prompts", "heldout"):
        lines.append(f"{name:<9}" + "".join(f"{report[name][c]:>13.4f}" for c in BAR))
    verdict = "PASS" if report["ok"] else "FAIL"
    lines.append(f"{'bar ±':<9}" + "".join(f"{BAR[c]:>13.2f}" for c in BAR) + f"   {verdict}")
    return "\n".join(lines)


# ---- RL interface: prompts, rewards and exact evaluation for minigrpo.grpo / minigrpo.ppo
# ----------


def rl_prompts(cfg) -> list[str]:  # RL trains on PROMPTS, never on HELDOUT
    return list(PROMPTS)


# no off-target prompts: nothing to preserve, no drift to measure
def anchor_prompts(cfg) -> list[str]:
    return []


def rl_baseline(model, tokenizer, cfg) -> None:  # nothing to remember before RL
    return None


support = completions  # toy_tasks/support.py: exact E[r] on these 12; best_reward is a lower bound


def rl_evaluate(model, tokenizer, baseline: None, cfg, rewards) -> dict:
    """Exact metrics on PROMPTS (heldout_rate: on HELDOUT), one batched forward: under
    `rewards.support` (P, 12) the exact E[r] on the declared support, its best reward and
    target_rate = P(a best declared completion) (for correct+format, P(right, well-formed "v."));
    correct_rate = P(the right number in a declared writing) and format_rate = P(well-formed v-1, v
    or v+1), both lower bounds; malformed = 1 - format_rate, an upper bound (the declared slips and
    anything off the declared support)."""
    probs = exact_outcomes(model, tokenizer, PROMPTS)
    f = _figures(model, tokenizer, PROMPTS, probs)
    return {
        **reward_figures(probs, rewards.support),
        "heldout_rate": exact_accuracy(model, tokenizer, HELDOUT),
        "correct_rate": f["right_number"],
        "format_rate": f["well_formed"],
        "malformed": max(0.0, 1 - f["well_formed"]),
    }


def format_rl_eval(ev: dict, cfg) -> str:
    return (
        f"exact P(best declared answer) prompts {ev['target_rate']:.3f} | exact E[r] "
        f"{ev['exact_reward']:.3f} "
        f"(best {ev['best_reward']:.3g}) | heldout {ev['heldout_rate']:.3f} | right "
        f"number {ev['correct_rate']:.3f} | well-formed {ev['format_rate']:.3f} | malformed "
        f"{ev['malformed']:.3f}"
    )
