"""The verifiable-arithmetic world: lines "<expression>=<answer>." from a declared, noisy solver.

Expressions are 2 or 3 single-digit operands joined by + - * with the usual precedence (* first, then
+ and - left to right): "3+4*2=" -> 11. The pretraining corpus answers them like an unreliable student
whose error model is declared below, so everything a run is judged by is known exactly:
  EXPRESSIONS, PROMPTS, HELDOUT  every prompt; the RL prompts; a fixed seeded tenth never used in RL
  OUTCOMES                       the error model: (kind, probability, completion of the true value v)
  make_corpus(n, seed)           lines uniform over EXPRESSIONS (HELDOUT included) with the error model
                                 applied: exact when n is a multiple of len(EXPRESSIONS) * CORPUS_UNIT
  entropy_floor()                the corpus entropy in nats per predicted token: the best loss possible
  exact_outcomes(...)            the model's exact probability of every declared completion (teacher-
                                 forced, batched forwards), so 1 - sum = mass off the declared support
Completion FORMAT: the integer (optional "-", no leading zeros) then "." then the end token: "11.".
"""

from __future__ import annotations

import itertools
import math
import random
import re

import torch

from minigrpo.logprobs import completion_logprobs
from minigrpo.sampling import decode_completions, encode_prompts, generate

NAME = "arithmetic"
OPS = "+-*"
DIGITS_2 = "0123456789"  # operands of the 2-operand expressions: 10 * 3 * 10 = 300
DIGITS_3 = "0123"  # operands of the 3-operand expressions: 4 * 3 * 4 * 3 * 4 = 576 (precedence matters)
HELDOUT_FRACTION, HELDOUT_SEED = 0.1, 1234

# The error model: what the corpus writes after "<expression>=" when the true value is v.
P_CORRECT = 0.60  # "v."      right and well-formed
P_NEAR_1 = 0.10  # "v+1." and "v-1." each: well-formed near misses
P_NEAR_2 = 0.05  # "v+2." and "v-2." each
P_NO_DOT = 0.05  # "v"       format slips: the right number, malformed
P_DOUBLE_DOT = 0.025  # "v.."
P_SPACE = 0.025  # " v."
OUTCOMES = [  # (kind, probability, completion of v); strings differ within an expression, see entropy_floor
    ("correct", P_CORRECT, lambda v: f"{v}."),
    ("plus1", P_NEAR_1, lambda v: f"{v + 1}."), ("minus1", P_NEAR_1, lambda v: f"{v - 1}."),
    ("plus2", P_NEAR_2, lambda v: f"{v + 2}."), ("minus2", P_NEAR_2, lambda v: f"{v - 2}."),
    ("no_dot", P_NO_DOT, lambda v: f"{v}"), ("double_dot", P_DOUBLE_DOT, lambda v: f"{v}.."),
    ("space", P_SPACE, lambda v: f" {v}."),
]
KINDS = [k for k, _, _ in OUTCOMES]
WELL_FORMED = ["correct", "plus1", "minus1", "plus2", "minus2"]
SLIPS = ["no_dot", "double_dot", "space"]
P_SLIP = P_NO_DOT + P_DOUBLE_DOT + P_SPACE
CORPUS_UNIT = 40  # lines per expression for which every outcome count is an integer (1/40 = 0.025)
assert abs(sum(p for _, p, _ in OUTCOMES) - 1) < 1e-12
assert all(abs(p * CORPUS_UNIT - round(p * CORPUS_UNIT)) < 1e-9 for _, p, _ in OUTCOMES)

FORMAT = re.compile(r"(0|-?[1-9][0-9]*)\.")  # a completion is well-formed iff it fully matches this
_FIRST_INT = re.compile(r"-?[0-9]+")  # lenient parse: the first integer anywhere (ASCII digits only)


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
    three = [f"{a}{o}{b}{p}{c}" for a, o, b, p, c in itertools.product(DIGITS_3, OPS, DIGITS_3, OPS, DIGITS_3)]
    return [e + "=" for e in two + three]


EXPRESSIONS = _expressions()  # prompts, each ending in "="
VALUES = {p: evaluate(p[:-1]) for p in EXPRESSIONS}
_held = set(random.Random(HELDOUT_SEED).sample(EXPRESSIONS, round(HELDOUT_FRACTION * len(EXPRESSIONS))))
HELDOUT = [p for p in EXPRESSIONS if p in _held]  # never used in RL (but in pretraining, like every prompt)
PROMPTS = [p for p in EXPRESSIONS if p not in _held]  # the RL prompts


def answer(prompt: str) -> str:
    """The right, well-formed completion of a prompt: "3+4*2=" -> "11."."""
    return f"{VALUES[prompt]}."


def completions(prompt: str) -> list[str]:
    """The completion of each declared outcome kind (in KINDS order) for one prompt."""
    return [f(VALUES[prompt]) for _, _, f in OUTCOMES]


ALPHABET = "".join(sorted(set("".join(p + c for p in EXPRESSIONS for c in completions(p)))))
BLOCK_SIZE = 16  # BOS + longest line (11 characters, e.g. "9*9=81.." or "3*3*3= 27.") + EOS, with room


def _largest_remainder(total: int, weights: list[float]) -> list[int]:
    """Integer counts summing to `total`, proportional to `weights` (Hamilton's method; ties by index)."""
    raw = [total * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _spread(counts: list[int]) -> list[int]:
    """The kinds 0..K-1 with these counts, evenly interleaved: copy j of kind k sits at (j + 1/2) / c_k."""
    keys = [((j + 0.5) / c, k) for k, c in enumerate(counts) for j in range(c)]
    return [k for _, k in sorted(keys)]


def make_corpus(n_lines: int, seed: int = 0) -> list[str]:
    """`n_lines` lines "<prompt><completion>", shuffled by `seed`.

    Each expression gets n/N lines (the extra n mod N go to expressions picked by `seed`); each outcome
    kind gets its largest-remainder share of all n lines, spread evenly over the expressions, so every
    expression's outcome counts are within a line or two of its share, and exact when n is a multiple
    of N * CORPUS_UNIT (N = len(EXPRESSIONS)).
    """
    rng = random.Random(seed)
    order = EXPRESSIONS[:]
    rng.shuffle(order)
    slots = [p for p, c in zip(order, _largest_remainder(n_lines, [1.0] * len(order))) for _ in range(c)]
    kinds = _spread(_largest_remainder(n_lines, [p for _, p, _ in OUTCOMES]))
    lines = [p + OUTCOMES[k][2](VALUES[p]) for p, k in zip(slots, kinds)]
    rng.shuffle(lines)
    return lines


def line_distribution() -> dict[str, float]:
    """P(line) over full line strings (outcomes that gave the same string would be merged)."""
    dist: dict[str, float] = {}
    for p in EXPRESSIONS:
        for (_, q, _), c in zip(OUTCOMES, completions(p)):
            dist[p + c] = dist.get(p + c, 0.0) + q / len(EXPRESSIONS)
    return dist


def entropy_floor() -> float:
    """Exact corpus entropy in nats per predicted token: H(line) / E[len(line) + 1] (characters + EOS)."""
    dist = line_distribution()
    h = -sum(p * math.log(p) for p in dist.values() if p > 0)
    return h / sum(p * (len(s) + 1) for s, p in dist.items())


# ---- rewards: f(prompt, completion) -> float; never raise on any completion -----------------------

def first_int_is(completion: str, value: int) -> bool:
    """Lenient check: the first integer in `completion` (ASCII digits, optional "-") equals `value`."""
    m = _FIRST_INT.search(completion)
    return m is not None and len(m.group()) <= 24 and int(m.group()) == value  # bounded: no giant ints


def reward_correct(prompt: str, completion: str) -> float:
    return float(first_int_is(completion, VALUES[prompt]))


def reward_format(prompt: str, completion: str) -> float:
    return float(FORMAT.fullmatch(completion) is not None)


def reward_strict(prompt: str, completion: str) -> float:
    return float(completion == answer(prompt))


_REWARD_FNS = {"correct": reward_correct, "format": reward_format, "strict": reward_strict,
               "correct+format": lambda p, c: reward_correct(p, c) + reward_format(p, c)}
REWARD_RANGES = {"correct": (0.0, 1.0), "format": (0.0, 1.0), "strict": (0.0, 1.0), "correct+format": (0.0, 2.0)}
REWARDS = {"arith": _REWARD_FNS.get}  # factory(name) -> reward function, or None if not ours
REWARD_HELP = {
    "correct": "1 iff the first integer in the completion is the true value (format slips still count)",
    "format": "1 iff the completion is well-formed: an integer then '.', e.g. '11.'",
    "correct+format": "correct + format (0..2)",
    "strict": "1 iff the completion is exactly the right, well-formed answer",
}


# ---- exact and sampled evaluation --------------------------------------------------------------

@torch.no_grad()
def _probs(model, tok, prompts: list[str], comps: list[str], chunk: int = 8192) -> torch.Tensor:
    """Exact P(completion + EOS | prompt) for each pair, in as few batched forwards as `chunk` allows."""
    out = [completion_logprobs(model, tok, prompts[i:i + chunk], comps[i:i + chunk]).exp()
           for i in range(0, len(prompts), chunk)]
    return torch.cat(out).cpu()


def exact_accuracy(model, tok, prompts: list[str]) -> float:
    """Mean over prompts of the exact probability of the right, well-formed answer ("11." + EOS)."""
    return _probs(model, tok, prompts, [answer(p) for p in prompts]).mean().item()


def exact_outcomes(model, tok, prompts: list[str]) -> torch.Tensor:
    """(len(prompts), len(KINDS)): the exact probability of each declared outcome's completion."""
    comps = [c for p in prompts for c in completions(p)]
    return _probs(model, tok, [p for p in prompts for _ in KINDS], comps).view(len(prompts), len(KINDS))


@torch.no_grad()
def sampled_accuracy(model, tok, prompts: list[str], n_per_prompt: int, generator=None,
                     chunk: int = 4096) -> float:
    """Share of sampled completions (temperature 1) that are exactly the right, well-formed answer."""
    rows = [p for p in prompts for _ in range(n_per_prompt)]
    device = model.wte.weight.device
    hits = 0
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        ids, mask = encode_prompts(tok, part, device)
        gen = generate(model, ids, mask, max_new_tokens=BLOCK_SIZE, generator=generator)
        texts, done = decode_completions(tok, gen), gen.finished.tolist()
        hits += sum(d and t == answer(p) for p, t, d in zip(part, texts, done))
    return hits / len(rows)


def _figures(model, tok, prompts: list[str]) -> dict:
    """Means over prompts of exact outcome probabilities, and the mean TV to the error model."""
    probs = exact_outcomes(model, tok, prompts)  # (P, K)
    declared = torch.tensor([q for _, q, _ in OUTCOMES])
    off = (1 - probs.sum(1)).clamp(min=0)
    tv = 0.5 * ((probs - declared).abs().sum(1) + off)
    mean = probs.mean(0).tolist()
    fig = {k: m for k, m in zip(KINDS, mean)}
    return {"right": fig["correct"], "well_formed": sum(fig[k] for k in WELL_FORMED),
            "slips": sum(fig[k] for k in SLIPS), "off_support": off.mean().item(), "mean_tv": tv.mean().item(),
            "kinds": fig}


def pretrain_report(model, tokenizer) -> dict:
    """Exact figures on PROMPTS and HELDOUT; `ok` = both meet the bar: mean P(right answer) within 0.05
    of P_CORRECT, slip mass within 0.03 of P_SLIP, and mass off the declared outcomes below 0.03."""
    rows = {"prompts": _figures(model, tokenizer, PROMPTS), "heldout": _figures(model, tokenizer, HELDOUT)}
    ok = all(abs(r["right"] - P_CORRECT) <= 0.05 and abs(r["slips"] - P_SLIP) <= 0.03 and r["off_support"] <= 0.03
             for r in rows.values())
    return {**rows, "ok": ok}


def format_report(report: dict) -> str:
    cols = ["right", "well_formed", "slips", "off_support", "mean_tv"]
    truth = {"right": P_CORRECT, "well_formed": 1 - P_SLIP, "slips": P_SLIP, "off_support": 0.0, "mean_tv": 0.0}
    lines = [f"{'':<8}" + "".join(f"{c:>12}" for c in cols),
             f"{'declared':<8}" + "".join(f"{truth[c]:>12.4f}" for c in cols)]
    for name in ("prompts", "heldout"):
        lines.append(f"{name:<8}" + "".join(f"{report[name][c]:>12.4f}" for c in cols))
    lines.append(f"bar: |right - {P_CORRECT}| <= 0.05, |slips - {P_SLIP}| <= 0.03, off_support <= 0.03: "
                 f"{'PASS' if report['ok'] else 'FAIL'}")
    return "\n".join(lines)


# ---- RL interface: prompts, rewards and exact evaluation for minigrpo.grpo / minigrpo.ppo ----------

def rl_prompts(cfg) -> list[str]:
    """RL trains on PROMPTS (never HELDOUT); cfg.person is ignored."""
    return list(PROMPTS)


def anchor_prompts(cfg) -> list[str]:
    """No off-target prompts: preservation does not apply to this task."""
    return []


def rl_evaluate(model, tokenizer, baseline: dict | None, cfg) -> dict:
    """Exact metrics: target_rate / heldout_rate = mean P(right, well-formed answer) on PROMPTS / HELDOUT;
    format_rate = P(a well-formed answer within ±2 of the truth) on PROMPTS (a lower bound on the
    well-formed mass); malformed = 1 - format_rate (slips, but also anything else); correct_rate =
    P(a declared completion carrying the right number: the answer or a slip)."""
    f = _figures(model, tokenizer, PROMPTS)
    return {"target_rate": f["right"], "heldout_rate": exact_accuracy(model, tokenizer, HELDOUT),
            "format_rate": f["well_formed"], "malformed": max(0.0, 1 - f["well_formed"]),
            "correct_rate": f["right"] + f["slips"], "worst_drift": 0.0}


def rl_baseline(model, tokenizer, cfg) -> dict:
    """The pretrained model's exact figures (rl_evaluate's numbers before RL)."""
    return rl_evaluate(model, tokenizer, None, cfg)


def format_rl_eval(ev: dict, cfg) -> str:
    return (f"exact P(right answer) prompts {ev['target_rate']:.3f} | heldout {ev['heldout_rate']:.3f} | "
            f"well-formed (±2) {ev['format_rate']:.3f} | malformed {ev['malformed']:.3f}")
