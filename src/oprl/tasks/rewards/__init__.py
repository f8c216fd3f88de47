"""Reward machinery of the tasks: the built-in reward functions (``builtin``), answer checking with math-verify
(``verify``), the timed worker-process pool both run in (``workers``) and users' reward functions (``user``)."""
