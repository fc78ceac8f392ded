"""The arithmetic world and its pretraining corpus: expressions of 2 or 3 single-digit operands
joined by + - * with the usual precedence (* first, then + and - left to right): "3+2*2=" -> 7,
"3-2-1=" -> 0; the corpus answers them like an unreliable student whose error model is declared here
(a number: right, or one off; a writing: "v.", or a format slip), so every line's probability is
known exactly.

  EXPRESSIONS, PROMPTS, HELDOUT  every prompt (543); the RL prompts; a fixed seeded tenth never used
                                 in RL
  OUTCOMES                       the error model, NUMBERS x WRITINGS: (kind, probability, offset,
                                 template)
  make_corpus(n, seed)           lines uniform over EXPRESSIONS (HELDOUT included) with the error
                                 model applied: exact per expression when n is a multiple of
                                 N * CORPUS_UNIT
  entropy_floor()                the corpus entropy in nats per predicted token: the best loss
                                 possible

Completion FORMAT: the integer (optional "-", no leading zeros) then "." then the end token: "11.".
The task module is arithmetic.py.
"""

from __future__ import annotations

import itertools
import math
import random
import re

from toy_tasks import apportion, largest_remainder

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


def make_corpus(n_lines: int, seed: int = 0) -> list[str]:
    """`n_lines` lines "<prompt><completion>", shuffled by `seed`.

    Each expression gets n/N lines (N = len(EXPRESSIONS); the n mod N extra lines go to expressions
    picked by `seed`), laid out one expression after another; successive lines take their NUMBERS by
    `apportion`, and the lines of each number take their WRITINGS the same way. So every count (a
    number's, or a number-and-writing's) is within one line of its share globally, within two lines
    per expression, and exact per expression when n is a multiple of N * CORPUS_UNIT.
    """
    rng = random.Random(seed)
    order = EXPRESSIONS[:]
    rng.shuffle(order)
    slots = [
        p for p, c in zip(order, largest_remainder(n_lines, [1.0] * len(order))) for _ in range(c)
    ]
    numbers = apportion(n_lines, [round(q * 8) for _, _, q in NUMBERS])  # shares in 1/8
    # in 1/20
    writings = [
        iter(apportion(numbers.count(i), [round(q * 20) for _, _, q in WRITINGS]))
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
