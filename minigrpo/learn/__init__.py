"""Learn by implementing (python -m minigrpo.learn): a numbered path of exercises, each one function
of the library that the learner writes in a workspace of theirs; the library's own property tests
grade it, and the capstone trains the model with the learner's pieces.

    path.py       the exercises in order
    exercise.py   what an exercise holds: function, lesson, tests, graded words, stub imports, hints
    objective_exercises.py, model_exercises.py   the exercises: 1-9, the objectives; 10-12, the
                  model's log-probs and attention, then the capstone grpo_loss
    workspace.py  stubs from the library's functions; the learner's functions plugged into a process
    plugin.py     the pytest plugin that plugs them in and reports each test's outcome
    mistakes.py   the typical mistakes, recognised by behaviour, each with its message
    grade.py      check one exercise (and the face of runner, progress and capstone_run)
    runner.py     an exercise's graded tests in a fresh pytest, with their time limits
    progress.py   each exercise's last check, its status, and what the learner does next
    capstone_run.py  the capstone's real training run with the learner's pieces
    child.py      a time limit on a learner's code; child processes that end with the command
    __main__.py   the command line
"""
