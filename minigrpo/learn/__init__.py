"""Learn by implementing (python -m minigrpo.learn): a numbered path of exercises, each one function
of the library that the learner writes in a workspace of theirs; the library's own property tests
grade it, and the capstone trains the model with the learner's pieces.

    path.py       the exercises in order: function, lesson, tests, hints
    workspace.py  stubs from the library's functions; the learner's functions plugged into a process
    plugin.py     the pytest plugin that plugs them in and reports each test's outcome
    mistakes.py   the typical mistakes, recognised by behaviour, each with its message
    grade.py      check one exercise; the capstone's real training run
    child.py      a time limit on a learner's code; child processes that end with the command
    __main__.py   the command line
"""
