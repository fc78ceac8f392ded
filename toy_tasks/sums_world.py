"""The sums world, where thinking pays: prompts "3+4+2=" (2 to 4 operands 1-9) answered by a
declared student in one of two styles, so the probability of every line is known exactly.

  direct   "9."                   the sum at once, off by a declared offset: right with probability
                                  DIRECT_RIGHT[n] (0.8, 0.4, 0.2 for n = 2, 3, 4 operands),
                                  up to 1, 2, 3 off
  worked   "(3+4=7,7+2=9)9."       in parentheses, one step per operand after the first, each
                                  writing the sum of the last result and the next operand, right
                                  with probability STEP_RIGHT (0.95), else one off (+1 or -1, each
                                  STEP_SLIP); a later step adds to the result as written; the
                                  answer after ")" is the last result as written

The student works the steps with probability P_WORKED (0.2), so a model of the corpus rarely
thinks, although working pays for every n: 0.95 (n = 2), 0.904 (3), 0.859 (4) right against 0.8,
0.4 and 0.2 at once. Both styles end in the answer format "<integer>." then the end token. The
first character says the style ("(" worked, a digit direct), so a model never has to guess it from a
digit that could start either (a first digit that is not the first operand, then "+", was most of
the mass a model leaked off the support when chains began with the operand).

  EXPRESSIONS, PROMPTS, HELDOUT  every prompt (all 81 of 2 operands, seeded samples of 243 of 3 and
                                 of 4); the RL prompts; a fixed seeded tenth of each number of
                                 operands, never used in RL
  outcomes(prompt)               the declared completions of a prompt: Outcome(text, probability,
                                 worked, answer), every direct answer 0-49 and every chain of slips
  make_corpus(n, seed)           lines uniform over EXPRESSIONS with the student's choices
  entropy_floor()                the corpus entropy in nats per predicted token: the best loss

The task module is sums.py; the exact measurements sums_exact.py.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass

from toy_tasks import apportion, largest_remainder

DIGITS = "123456789"  # operands: every partial sum, slips included, stays in 1..39
OPERANDS = (2, 3, 4)
SAMPLED = {3: 243, 4: 243}  # prompts of 3 and 4 operands, a seeded sample of the 729 and 6,561
PROMPT_SEED, HELDOUT_FRACTION, HELDOUT_SEED = 54, 0.1, 1234

P_WORKED = 0.2  # the student works the steps ...
# ... or answers at once, off by an offset: {offset: probability} per number of operands
DIRECT_OFFSETS = {
    2: {0: 0.8, 1: 0.1, -1: 0.1},
    3: {0: 0.4, 1: 0.2, -1: 0.2, 2: 0.1, -2: 0.1},
    4: {0: 0.2, 1: 0.15, -1: 0.15, 2: 0.15, -2: 0.15, 3: 0.1, -3: 0.1},
}
# the support lists every well-formed direct answer "0." to "49." (most of probability 0 in the
# corpus), so a model's imprecise sum is a wrong answer, not malformed text
DIRECT_ANSWERS = range(50)
DIRECT_RIGHT = {n: offsets[0] for n, offsets in DIRECT_OFFSETS.items()}
STEP_RIGHT, STEP_SLIP = 0.95, 0.025  # a worked step: right, or +1 / -1 (each)
STEP_OFFSETS = {0: STEP_RIGHT, 1: STEP_SLIP, -1: STEP_SLIP}
assert all(abs(sum(o.values()) - 1) < 1e-12 for o in [*DIRECT_OFFSETS.values(), STEP_OFFSETS])

# a completion is well-formed iff it fully matches one of these (worked: "(steps)answer.")
DIRECT_FORMAT = re.compile(r"[0-9]+\.")
WORKED_FORMAT = re.compile(r"\([0-9]+\+[0-9]+=[0-9]+(,[0-9]+\+[0-9]+=[0-9]+)*\)[0-9]+\.")


@dataclass(frozen=True)
class Outcome:
    """One declared completion of a prompt."""

    text: str  # the completion, without the end token
    probability: float  # the student's probability of writing it
    worked: bool  # worked steps (True) or the direct answer
    answer: int  # the integer before the final "."


def operands(prompt: str) -> list[int]:
    """'3+4+2=' -> [3, 4, 2]; ValueError for anything else."""
    if not re.fullmatch(r"[0-9](\+[0-9])+=", prompt):
        raise ValueError(f"not a sum of one-digit operands: {prompt!r}")
    return [int(c) for c in prompt[:-1].split("+")]


def value(prompt: str) -> int:
    """The true sum of a prompt: '3+4+2=' -> 9."""
    return sum(operands(prompt))


def worked_text(xs: list[int], slips: tuple[int, ...]) -> tuple[str, int]:
    """The worked completion of operands xs with step offsets `slips` (one per step) -> (text, the
    answer it writes): [3, 4, 2], (0, 1) -> ('(3+4=7,7+2=10)10.', 10)."""
    steps, result = [], xs[0]
    for x, slip in zip(xs[1:], slips):
        written = result + x + slip
        steps.append(f"{result}+{x}={written}")
        result = written
    return "(" + ",".join(steps) + f"){result}.", result


def outcomes(prompt: str) -> list[Outcome]:
    """Every declared completion of a prompt (distinct texts): the direct answers (the declared
    offsets in DIRECT_OFFSETS order, then the rest of DIRECT_ANSWERS, of probability 0), then the
    worked chains in STEP_OFFSETS order, step by step."""
    xs = operands(prompt)
    v, n = sum(xs), len(xs)
    declared = {v + off: (1 - P_WORKED) * q for off, q in DIRECT_OFFSETS[n].items()}
    others = [a for a in DIRECT_ANSWERS if a not in declared]
    direct = [Outcome(f"{a}.", declared.get(a, 0.0), False, a) for a in [*declared, *others]]
    worked = []
    for slips in itertools.product(STEP_OFFSETS, repeat=n - 1):
        text, answer = worked_text(xs, slips)
        q = P_WORKED * math.prod(STEP_OFFSETS[s] for s in slips)
        worked.append(Outcome(text, q, True, answer))
    return direct + worked


def completions(prompt: str) -> list[str]:
    """The texts of `outcomes(prompt)`: the prompt's support (50 direct + 3 to 27 worked)."""
    return [o.text for o in outcomes(prompt)]


def _expressions() -> list[str]:
    rng = random.Random(PROMPT_SEED)
    out = []
    for n in OPERANDS:
        every = ["+".join(xs) + "=" for xs in itertools.product(DIGITS, repeat=n)]
        out += sorted(rng.sample(every, SAMPLED[n])) if n in SAMPLED else every
    return out


EXPRESSIONS = _expressions()  # 567 prompts, each ending in "="


# a tenth of each number of operands (8, 24, 24), so the held-out figures mix the operands as the
# RL prompts do: a policy's think rate differs by operands, and an unstratified tenth drew 17 of its
# 57 prompts from the 81 of two operands
def _heldout() -> set[str]:
    rng, held = random.Random(HELDOUT_SEED), set()
    for n in OPERANDS:
        mine = [p for p in EXPRESSIONS if len(p) == 2 * n]
        held |= set(rng.sample(mine, round(HELDOUT_FRACTION * len(mine))))
    return held


_held = _heldout()
HELDOUT = [p for p in EXPRESSIONS if p in _held]  # never used in RL (but in pretraining)
PROMPTS = [p for p in EXPRESSIONS if p not in _held]  # the RL prompts

ALPHABET = "".join(sorted(set("".join(p + c for p in EXPRESSIONS for c in completions(p)))))
# BOS + longest line (8 + 27 characters: "9+9+9+9=(9+9=19,19+9=29,29+9=39)39.") + EOS = 37
BLOCK_SIZE = 37


def make_corpus(n_lines: int, seed: int = 0) -> list[str]:
    """`n_lines` lines "<prompt><completion>", shuffled by `seed`.

    Each expression gets n/N lines (N = len(EXPRESSIONS); the n mod N extra lines go to expressions
    picked by `seed`). Per number of operands, the lines take their style and their direct offset
    by `apportion` (within one line of the declared shares), and each worked step its slip by a
    draw from a generator seeded by `seed`.
    """
    rng = random.Random(seed)
    order = EXPRESSIONS[:]
    rng.shuffle(order)
    slots = [
        p for p, c in zip(order, largest_remainder(n_lines, [1.0] * len(order))) for _ in range(c)
    ]
    lines = []
    for n in OPERANDS:
        mine = [p for p in slots if len(p) == 2 * n]
        offsets = list(DIRECT_OFFSETS[n])
        styles = apportion(len(mine), [1 - P_WORKED, P_WORKED])
        direct = iter(apportion(styles.count(0), list(DIRECT_OFFSETS[n].values())))
        for p, worked in zip(mine, styles):
            if worked:
                slips = rng.choices(list(STEP_OFFSETS), list(STEP_OFFSETS.values()), k=n - 1)
                lines.append(p + worked_text(operands(p), tuple(slips))[0])
            else:
                lines.append(p + f"{value(p) + offsets[next(direct)]}.")
    rng.shuffle(lines)
    return lines


def line_distribution() -> dict[str, float]:
    """P(line) over full line strings (every outcome of a prompt is a distinct string)."""
    return {p + o.text: o.probability / len(EXPRESSIONS) for p in EXPRESSIONS for o in outcomes(p)}


def entropy_floor() -> float:
    """Exact corpus entropy in nats per predicted token: H(line) / E[len(line) + 1] (characters +
    EOS)."""
    dist = line_distribution()
    h = -sum(p * math.log(p) for p in dist.values() if p > 0)
    return h / sum(p * (len(s) + 1) for s, p in dist.items())
