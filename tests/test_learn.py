"""minigrpo.learn: stubs, grading by the library's own tests, the catalogue of mistakes, the
capstone.

A planted mistake is a textual change of the library's own function (MUTANTS); the reference is the
library's function itself, pasted into a learner's file (workspace.reference_source)."""

import hashlib
import re
import textwrap
from pathlib import Path

import pytest

import minigrpo
from minigrpo.learn import grade, mistakes, workspace
from minigrpo.learn.__main__ import main
from minigrpo.learn.path import PATH, find

# (exercise, mistake key) -> (text in the library's function, what the mistake writes instead)
MUTANTS = {
    ("group_advantages", "population_std"): (
        "std = _std(r, dims, unbiased)",
        "std = _std(r, dims, False)",
    ),
    ("group_advantages", "no_equal_group_guard"): (
        "return torch.where(equal, torch.zeros_like(adv), adv).to(rewards.dtype)",
        "return adv.to(rewards.dtype)",
    ),
    ("group_advantages", "std_underflows"): (
        "std = _std(r, dims, unbiased)",
        "std = r.std(dim=dims, keepdim=True, unbiased=unbiased)",
    ),
    ("rloo_advantages", "mean_includes_self"): ("adv = G / (G - 1) * (", "adv = ("),
    ("rloo_advantages", "no_equal_group_guard"): (
        "return torch.where(equal, torch.zeros_like(adv), adv)\n",
        "return adv\n",
    ),
    ("clipped_surrogate", "sign"): (
        "return torch.where(mask, -objective,",
        "return torch.where(mask, objective,",
    ),
    ("clipped_surrogate", "clip_wrong_side"): (
        "torch.minimum(pg_obj1, pg_obj2)",
        "torch.maximum(pg_obj1, pg_obj2)",
    ),
    ("k1", "sign"): ("return logp - ref_logp", "return ref_logp - logp"),
    ("k3", "sign"): ("delta = (ref_logp - logp)", "delta = (logp - ref_logp)"),
    ("exact", "swapped"): (
        "(logp.exp() * (logp - ref_logp))",
        "(ref_logp.exp() * (ref_logp - logp))",
    ),
    ("aggregate", "padded_length"): ("](x, mask,", "](x, torch.ones_like(mask),"),
    ("aggregate", "mask_multiplied"): (
        "x = torch.where(mask, per_token, zero_like(per_token))",
        "x = per_token * mask",
    ),
    ("gae", "bootstrap_past_the_end"): ("v = torch.where(mask, values, zero)", "v = values"),
    ("completion_token_logprobs", "tokens_after_eos"): (
        "return torch.where(completion_mask, logp,",
        "return torch.where(completion_mask | True, logp,",
    ),
    ("completion_token_logprobs", "off_by_one"): (
        "ids[:, prompt_len:]",
        "ids[:, prompt_len - 1:-1]",
    ),
    ("attention", "no_scaling"): (
        "is_causal=q.size(2) > 1)",
        "is_causal=q.size(2) > 1, scale=1.0)",
    ),
    ("grpo_loss", "kl_subtracted"): (
        "loss = loss + cfg.beta * agg(kl_tok)",
        "loss = loss - cfg.beta * agg(kl_tok)",
    ),
}


def mutant_source(name, key):
    old, new = MUTANTS[(name, key)]
    source = workspace.reference_source(find(name))
    assert old in source, (
        f"the planted mistake {key} no longer matches {name}'s source: update MUTANTS"
    )
    return source.replace(old, new)


def plant(folder, name, source):
    path, written = workspace.write_stub(find(name), folder, source)
    assert written
    return workspace.learner_function(find(name), folder)


def package_fingerprint():
    root = Path(minigrpo.__file__).parent
    return {
        p: hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_every_catalogued_mistake_has_a_planted_copy_and_every_exercise_tests():
    assert {(m.exercise, m.key) for m in mistakes.CATALOGUE} == set(MUTANTS)
    must = {
        "population_std",
        "no_equal_group_guard",
        "clip_wrong_side",
        "sign",
        "tokens_after_eos",
        "padded_length",
        "bootstrap_past_the_end",
    }  # the catalogue
    assert must <= {m.key for m in mistakes.CATALOGUE}
    for ex in PATH:
        ids = grade.test_ids(ex, grade.repo_root())
        assert len(ids) >= 2, f"exercise {ex.name} is graded by {ids}"


@pytest.mark.parametrize("name,key", sorted(MUTANTS))
def test_each_probe_recognises_its_planted_mistake_and_never_the_library(tmp_path, name, key):
    (m,) = [m for m in mistakes.CATALOGUE if (m.exercise, m.key) == (name, key)]
    assert not m.probe(workspace.library_function(find(name))), (
        f"{key} fires on the library's own {name}"
    )
    planted = plant(tmp_path, name, mutant_source(name, key))
    assert m in mistakes.diagnose(name, planted), f"the probe of {key} misses its planted copy"


@pytest.mark.parametrize("ex", PATH, ids=[e.name for e in PATH])
def test_a_stub_has_the_library_signature_and_the_reference_loads_and_is_not_a_stub(tmp_path, ex):
    path, _ = workspace.write_stub(ex, tmp_path / "a")
    text = path.read_text()
    assert f"def {ex.name}(" in text and "raise NotImplementedError" in text
    assert (
        workspace.status(ex, tmp_path / "a") == "stub"
        and workspace.learner_function(ex, tmp_path / "a") is None
    )
    assert plant(tmp_path / "b", ex.name, workspace.reference_source(ex)) is not None


@pytest.mark.slow
def test_check_passes_the_reference_fails_a_mistake_with_its_message_and_workspaces_stay_apart(
    tmp_path, capsys
):
    before = package_fingerprint()
    right, wrong = tmp_path / "right", tmp_path / "wrong"
    plant(right, "k3", workspace.reference_source(find("k3")))
    plant(wrong, "k3", mutant_source("k3", "sign"))
    assert grade.check(find("k3"), right) is True
    assert grade.check(find("k3"), wrong) is False
    out = capsys.readouterr().out
    assert (
        "passing" in out
        and "the KL's sign" in out
        and "x hand values fix the sign convention" in out
    )
    assert (
        grade.graded_status(find("k3"), right) == "passing"
        and grade.graded_status(find("k3"), wrong) == "failing"
    )
    assert package_fingerprint() == before, "grading wrote under minigrpo/"


NAIVE_SURROGATE = """
    # no mask, no clamp, no level, no dual clip: many broken properties
    ratio = torch.exp(logp - old_logp)
    high = 1 + (eps_low if eps_high is None else eps_high)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    return -torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, high) * adv)
"""


def with_body(name, body):
    """The library's function with `body` in place of its code (its docstring kept)."""
    return workspace.stub_source(find(name), textwrap.dedent(body).strip("\n"))


# Hypothesis before/since 6.16x
@pytest.mark.parametrize("heading", ["Falsifying example:", "Failing test case:"])
def test_the_smallest_failing_example_is_read_from_either_heading_on_one_line(heading):
    from minigrpo.learn.plugin import falsifying_example

    text = (
        f"AssertionError: the clip must stop the gradient\nassert tensor(False)\n{heading} "
        "test_clip(\n"
        "    c=([[0.0, 0.0], [0.0, 1.0]], [0.0, 1.0]),  # or any other generated value\n    "
        "eps_low=0.25,\n)\n"
    )
    # its arguments
    assert falsifying_example(text) == "c=([[0.0, 0.0], [0.0, 1.0]], [0.0, 1.0]), eps_low=0.25"
    assert falsifying_example("E   AssertionError: no example here") == ""


@pytest.mark.slow
def test_a_failing_check_stops_after_a_few_broken_properties_each_shown_with_its_smallest_example(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("minigrpo.learn.runner.MAX_BROKEN", 2, raising=False)
    plant(tmp_path / "wrong", "clipped_surrogate", with_body("clipped_surrogate", NAIVE_SURROGATE))
    assert grade.check(find("clipped_surrogate"), tmp_path / "wrong") is False
    out = capsys.readouterr().out
    shown = re.findall(r"\n  x [^\n]*\n {6}[^\n]*\n {6}smallest failing example: ", out)
    assert out.count("\n  x ") == 2 and len(shown) == 2, (
        f"2 broken properties, each with its example: {out}"
    )
    # one failure per property, not Hypothesis' ExceptionGroup
    assert "distinct failures" not in out, out
    assert re.search(
        r"the check stopped after 2 broken properties: \d+ more tests did not run", out
    ), out
    plant(
        tmp_path / "right",
        "clipped_surrogate",
        workspace.reference_source(find("clipped_surrogate")),
    )
    # a right function runs them all
    assert grade.check(find("clipped_surrogate"), tmp_path / "right") is True
    n = grade.test_counts()["clipped_surrogate"]
    assert f"{n} of {n} tests pass" in capsys.readouterr().out


def test_the_checks_hypothesis_settings_skip_only_the_explain_phase_and_limit_shrinking(
    monkeypatch,
):
    from hypothesis import Phase, settings
    from hypothesis.internal.conjecture import engine

    from minigrpo.learn import plugin

    # restored after the test
    monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", engine.MAX_SHRINKING_SECONDS)
    # "default", or "ci" where the CI variable is set (derandomized there)
    default = settings.default
    settings.register_profile("before-check", default)
    try:
        plugin.use_check_settings()
        profile = settings.default
    finally:
        settings.load_profile("before-check")
    assert (
        list(profile.phases) == [p for p in Phase if p != Phase.explain]
        and profile.report_multiple_bugs is False
    )
    assert (profile.max_examples, profile.derandomize) == (
        default.max_examples,
        default.derandomize,
    )
    assert engine.MAX_SHRINKING_SECONDS == plugin.SHRINK_S


@pytest.mark.slow
def test_an_rloo_that_leaves_rounding_noise_in_an_equal_group_fails_its_check(tmp_path, capsys):
    noisy = """
    G = rewards.size(1)
    if G < 2:
        return torch.zeros_like(rewards)
    # [[0.1] * 3] -> -2.1e-17, not 0
    return G / (G - 1) * (rewards - rewards.mean(dim=1, keepdim=True))
"""
    plant(tmp_path, "rloo_advantages", with_body("rloo_advantages", noisy))
    assert grade.check(find("rloo_advantages"), tmp_path) is False
    out = capsys.readouterr().out
    assert (
        "x rloo gives exactly zero to every all equal group" in out
        and "leaves rounding noise" in out
    ), out


def test_cli_start_list_hint_and_bad_input(tmp_path, capsys):
    d = str(tmp_path / "ws")
    main(["start", "group_advantages", "--dir", d])
    assert (tmp_path / "ws" / "advantages.py").exists()
    main(["start", "1", "--dir", d])  # again: left as it is
    main(["list", "--dir", d])
    out = capsys.readouterr().out
    assert "already in" in out and "stub written" in out
    seen = []
    for _ in range(len(find("1").hints) + 1):
        main(["hint", "1", "--dir", d])
        seen.append(capsys.readouterr().out)
    n = len(find("1").hints)
    assert [s.split(":")[0] for s in seen[:2]] == [
        f"hint {k} of {n} for exercise 1 group_advantages" for k in (1, 2)
    ]
    assert seen[-1] == seen[-2], "after the last hint, the last one again"
    with pytest.raises(SystemExit) as e:
        main(["check", "1", "--dir", d])
    assert e.value.code == 1 and "still the stub" in capsys.readouterr().out
    (tmp_path / "ws" / "losses.py").write_text("def aggregate(:\n")  # a learner's syntax error
    main(["list", "--dir", d])
    assert "does not load" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["check", "aggregate", "--dir", d])
    assert e.value.code == 1 and "your file does not load" in capsys.readouterr().out
    inside = str(Path(minigrpo.__file__).parent)
    for argv in (["start", "99"], ["start"], ["hint", "nope"], ["start", "1", "--dir", inside]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and err.count("\n") == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("name,key", sorted(MUTANTS))
def test_each_planted_mistake_fails_its_check_with_its_message(tmp_path, capsys, name, key):
    plant(tmp_path, name, mutant_source(name, key))
    assert grade.check(find(name), tmp_path) is False
    (m,) = [m for m in mistakes.CATALOGUE if (m.exercise, m.key) == (name, key)]
    assert m.message in capsys.readouterr().out


@pytest.mark.slow
def test_check_all_on_the_reference_passes_and_the_capstone_learns(tmp_path, capsys):
    for ex in PATH:
        plant(tmp_path, ex.name, workspace.reference_source(ex))
    main(["check", "--all", "--dir", str(tmp_path)])  # exits 1 (SystemExit) when anything fails
    out = capsys.readouterr().out
    assert (
        f"the path: {len(PATH) + 1} of {len(PATH) + 1} passing" in out and "capstone passed" in out
    ), out
    for name, n in grade.test_counts().items():  # a passing check runs every test
        assert (
            f"exercise {find(name).number} {name} ({tmp_path / find(name).file_stem}.py): {n} of "
            f"{n} tests pass" in out
        ), (name, out)


@pytest.mark.slow
def test_a_capstone_with_a_sign_error_in_the_surrogate_does_not_learn_and_points_at_it(
    tmp_path, capsys, tiny_pretrained
):
    # its own model: the test does not depend on the repository's runs/pretrain
    init, _, _ = tiny_pretrained
    plant(tmp_path, "clipped_surrogate", mutant_source("clipped_surrogate", "sign"))
    plant(tmp_path, "grpo_loss", workspace.reference_source(find("grpo_loss")))
    ok, rate = grade.capstone(tmp_path, init=init)
    assert not ok and rate is not None and rate < grade.GOAL
    assert "revisit exercise 3 clipped_surrogate" in capsys.readouterr().out


def test_a_capstone_without_a_pretrained_model_says_pretrain_first_and_trains_nothing(
    tmp_path, capsys, monkeypatch
):
    plant(tmp_path, "grpo_loss", workspace.reference_source(find("grpo_loss")))
    assert grade.capstone(tmp_path, init=tmp_path / "missing.pt") == (False, None)
    out = capsys.readouterr().out
    assert "pretrain first: python -m minigrpo.pretrain" in out and "missing.pt" in out, out
    assert (
        "did not learn" not in out and "revisit" not in out and not (tmp_path / "capstone").exists()
    ), out
    # a repository without runs/pretrain: the default --init is missing too
    bare = tmp_path / "bare"
    (bare / "tests").mkdir(parents=True)
    monkeypatch.setattr("minigrpo.learn.capstone_run.repo_root", lambda: bare)
    assert grade.capstone(tmp_path) == (False, None)
    out = capsys.readouterr().out
    assert (
        f"no pretrained model at {bare / 'runs' / 'pretrain' / 'model.pt'}: pretrain first" in out
    ), out


def test_a_learner_file_whose_top_level_loops_forever_does_not_load_and_says_so(
    tmp_path, monkeypatch
):
    from minigrpo.learn import workspace

    monkeypatch.setattr(workspace, "LOAD_LIMIT_S", 0.5)
    (tmp_path / "kl.py").write_text("while True:\n    pass\n")
    with pytest.raises(
        workspace.LearnerError, match=r"kl.py ran past 0.5 s while loading: does a loop at its top"
    ):
        workspace.load_module(tmp_path, "kl")


def test_a_learner_file_that_failed_to_load_is_not_run_again_until_it_changes(tmp_path):
    from minigrpo.learn.workspace import LearnerError, load_module

    runs = tmp_path / "runs.txt"
    (tmp_path / "kl.py").write_text(
        f"open({str(runs)!r}, 'a').write('x')\nraise ValueError('broken')\n"
    )
    for _ in range(2):
        with pytest.raises(LearnerError, match="ValueError: broken"):
            load_module(tmp_path, "kl")
    assert runs.read_text() == "x"
    (tmp_path / "kl.py").write_text(f"open({str(runs)!r}, 'a').write('y')\n")
    assert load_module(tmp_path, "kl") is not None and runs.read_text() == "xy"


def test_a_learner_file_that_exits_on_import_does_not_load_and_says_so(tmp_path):
    from minigrpo.learn.workspace import LearnerError, load_module

    (tmp_path / "kl.py").write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(LearnerError, match="SystemExit"):
        load_module(tmp_path, "kl")
