"""compare's algorithm names and their variants (minigrpo/tools/algorithms.py): NAME@flag=value ->
trainer flags."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.compare import module_of
from minigrpo.tools.algorithms import ALGOS, FIXED, base_of, run_of, variant_flags
from minigrpo.util.cli import UsageError


@pytest.mark.parametrize(
    "name, flags",
    [
        ("default", []),
        ("default@lr=0.003", ["--lr", "0.003"]),
        ("grpo@beta=0.1@group_size=4", ["--beta", "0.1", "--group-size", "4"]),
        ("default@no_preserve", ["--no-preserve"]),
        ("ppo@critic=head", ["--critic", "head"]),
        ("dapo@clip-high=0.3", ["--clip-high", "0.3"]),
    ],
)
def test_a_variant_names_its_trainer_flags(name, flags):
    assert variant_flags(name) == flags


def test_a_variant_runs_its_base_algorithms_trainer():
    assert (
        base_of("ppo_oracle@lr=1e-3") == "ppo_oracle"
        and module_of("ppo_oracle@lr=1e-3") == "minigrpo.ppo"
    )
    assert (
        module_of("online_dpo@beta=0.2") == "minigrpo.dpo"
        and module_of("gspo@lr=1e-3") == "minigrpo.grpo"
    )


@pytest.mark.parametrize(
    "name, message",
    [
        ("sac@lr=1", "unknown algorithm 'sac'"),
        ("default@lr=1/2", "letters, digits"),
        ("default@lr 1", "letters, digits"),
        ("default@lr=", "is not flag=value"),
        ("default@", "is not flag=value"),
        ("default@lr=1@lr=2", "each flag once"),
        ("default@seed=1", "may not set --seed"),
        ("default@group_size=4@person=anna", "may not set --person"),
        ("ppo_oracle@critic=head", "--critic only in a variant of ppo"),
    ],
)
def test_a_bad_variant_is_one_line_naming_what_is_wrong(name, message):
    with pytest.raises(UsageError) as e:
        variant_flags(name)
    assert message in str(e.value) and "\n" not in str(e.value)


@given(
    base=st.sampled_from(ALGOS),
    flags=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9]{0,6}(_[a-z0-9]{1,5})?", fullmatch=True).filter(
            lambda k: k not in FIXED
        ),
        st.from_regex(r"[A-Za-z0-9.+-]{1,8}", fullmatch=True),
        max_size=4,
    ),
)
def test_every_flag_of_a_variant_comes_back_in_order(base, flags):
    flags.pop("critic", None)  # only ppo's
    name = "@".join([base, *(f"{k}={v}" for k, v in flags.items())])
    assert variant_flags(name) == [
        x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", v)
    ]


def test_run_of_reads_a_run_folders_algorithm_and_seed():
    assert run_of("dapo-s3") == ("dapo", 3) and run_of("grpo@beta=0.1-s12") == ("grpo@beta=0.1", 12)
    # not a run folder of compare's
    assert run_of("my-sweep") is run_of("-s3") is run_of("table.md") is None
