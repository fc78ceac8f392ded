"""python -m minigrpo.bench: see minigrpo/bench/suite.py."""

import sys

from minigrpo.bench.suite import main

main(sys.argv[1:])
