"""What a lockstep population's steps use besides its weights, optimiser and update
(population/lockstep.py): the members' evaluation forward, their prompts, the trust region's anchor
rows, a stale sampler's weights, the last step's trust region.

    aids = Aids(SharedForward(), PromptTable(tok, prompts, device), anchor_probe, stale)
    aids.adopt(members)       # at the start and whenever members leave: their forwards and
                              # anchor rows
"""

from __future__ import annotations

from dataclasses import dataclass

from minigrpo.population.anchor import own_rows
from minigrpo.population.evaluation import SharedForward
from minigrpo.population.sampling import PromptTable
from minigrpo.population.stale import StaleWeights
from minigrpo.rl.trust_region import StepGuard


@dataclass
class Aids:
    """What a population's steps use besides its weights, optimiser and update."""

    evaluation: SharedForward  # the members' exact evaluations: one forward for all
    # every member's step prompts encoded at once (from every member's prompts)
    prompts: PromptTable
    # whether the trust region measures the anchor's rows (Run.anchor_probe_rows)
    anchor_probe: bool
    stale: StaleWeights | None  # --sample-stale's recorded weights
    # the anchor probe's (Rows, weights, group) for these members, the same objects
    anchor_rows: tuple | None = None
    # every step: one --person's rows shared, else each member's own (anchor.own_rows)
    # the last step's trust region (its final logits of the anchor rows)
    guard: StepGuard | None = None

    def adopt(self, members: list) -> None:
        """Member j's GPT kept current for its evaluation (and its sampler's recorded weights); the
        anchor probe's rows for these members."""
        self.guard = None
        if self.anchor_probe:
            runs, probes = [m.run for _, m in members], {}
            # one anchor's rows chosen once (Run.anchor_probe_rows), for its person's members
            for r in runs:
                if id(r.anchor) not in probes:
                    probes[id(r.anchor)] = r.anchor_probe_rows()
            gens, weights, groups = zip(*[probes[id(r.anchor)] for r in runs])
            rows, (w, g) = own_rows(list(gens), [list(weights), list(groups)])
            self.anchor_rows = (rows, w, g)
        self.evaluation.adopt([m.run.policy for _, m in members])
        if self.stale is not None:
            for j, (_, m) in enumerate(members):
                m.algo.sampler = self.stale.member(m.algo.sampler, j)

    def trust_region(self, stack, probes: list) -> StepGuard | None:
        """The step's trust region over the members' stacked weights and rows (rl/trust_region.py:
        their logits through population/rows.Rows), following the last step's; None without
        probes."""
        self.guard = (
            StepGuard(stack, probes, previous=self.guard, forward=lambda s, r: r.logprobs(s)[1])
            if probes
            else None
        )
        return self.guard
