"""The property tests at ten times their default budget. The default suite gives each hypothesis
property 20 examples (conftest.EXAMPLES) to stay within its minute; this slow test reruns every
file that uses that budget with 200, so CI's slow run searches each property harder."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def property_files():
    """The test files whose properties take conftest's SET budget."""
    return sorted(
        p.name
        for p in HERE.glob("test_*.py")
        if "from conftest import" in (text := p.read_text()) and "SET" in text and "@SET" in text
    )


def test_the_property_files_are_found():
    files = property_files()
    assert "test_advantages.py" in files and "test_losses.py" in files and len(files) >= 8, files


@pytest.mark.slow
def test_every_property_holds_over_200_examples():
    env = dict(os.environ, MINIGRPO_EXAMPLES="200")
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + [f"tests/{name}" for name in property_files()],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
