"""util/sampler.py: a sampling profiler over threads."""

import threading

import torch

from minigrpo.exact import frontier
from minigrpo.util.sampler import ThreadSampler


def test_a_busy_thread_is_found_in_its_function_and_a_parked_one_counts_as_waiting():
    stop, parked = threading.Event(), threading.Event()
    p, r = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)

    def busy():
        while not stop.is_set():
            frontier.optimum(p, r, 0.5)
    threads = [threading.Thread(target=busy), threading.Thread(target=parked.wait)]
    with ThreadSampler(every=0.001, roots=("minigrpo/exact/frontier.py:optimum",)) as sampler:
        for t in threads:
            t.start()
        stop.wait(0.3)
        stop.set()
        parked.set()
        for t in threads:
            t.join()
    top = dict((name, share) for share, name in sampler.top(5))
    assert top.get("minigrpo/exact/frontier.py:optimum", 0) > 0.9, top  # every working sample of `busy` is in it
    assert sampler.waiting > 0 and sampler.working() > 20, (sampler.samples, sampler.waiting)
    own = dict((name, share) for share, name in sampler.top(5, own=True))
    assert own.get("minigrpo/exact/frontier.py:_solve", 0) > 0, own  # a callee's time is its own, not its caller's
    phases = set(sampler.phases)  # what optimum was calling: its checks and its solve
    assert "minigrpo/exact/frontier.py:optimum → _solve" in phases and phases <= {
        "minigrpo/exact/frontier.py:optimum → _solve", "minigrpo/exact/frontier.py:optimum → _check",
        "minigrpo/exact/frontier.py:optimum → _betas", "minigrpo/exact/frontier.py:optimum (its own code)",
        "(outside every root)"}, phases
