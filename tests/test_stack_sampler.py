"""bench/stack_sampler.py: a sampling profiler over threads."""

import threading

import torch

from minigrpo.bench.stack_sampler import ThreadSampler
from minigrpo.objectives.losses import aggregate

ROOT = "minigrpo/objectives/losses.py:aggregate"


def test_a_busy_thread_is_found_in_its_function_and_a_parked_one_counts_as_waiting():
    stop, parked = threading.Event(), threading.Event()
    x, mask = (
        torch.ones(64, 64),
        torch.rand(64, 64, generator=torch.Generator().manual_seed(0)) > 0.5,
    )

    def busy():
        while not stop.is_set():
            aggregate(x, mask, "token-mean")

    threads = [threading.Thread(target=busy), threading.Thread(target=parked.wait)]
    with ThreadSampler(every=0.001, roots=(ROOT,)) as sampler:
        for t in threads:
            t.start()
        # until the sampler has caught `busy` in aggregate 50 times, however slow the machine (the
        # cap only keeps a sampler that never samples from hanging); this thread waits meanwhile
        for _ in range(100_000):
            if sampler.cumulative[ROOT] >= 50 or stop.wait(0.005):
                break
        stop.set()
        parked.set()
        for t in threads:
            t.join()
    # every sample with this project's code on its stack (`busy`'s calls) is in aggregate: counted
    # against those, not every working sample (pytest-xdist's own thread works beside it)
    ours = sum(sampler.own.values())
    assert sampler.cumulative[ROOT] > 0.9 * ours, (sampler.cumulative, ours)
    assert sampler.waiting > 0 and sampler.working() > 20, (sampler.samples, sampler.waiting)
    own = dict((name, share) for share, name in sampler.top(5, own=True))
    # a callee's time is its own
    assert own.get("minigrpo/objectives/losses.py:_token_mean", 0) > 0, own
    # what aggregate was calling: its reduction, its zero, or its own torch.where
    phases = set(sampler.phases)
    assert f"{ROOT} → _token_mean" in phases and phases <= {
        f"{ROOT} → _token_mean",
        f"{ROOT} → zero_like",
        f"{ROOT} (its own code)",
        "(outside every root)",
    }, phases
