"""Reward machinery of the tasks: the built-in reward functions (``builtin``), answer checking with math-verify
(``verify``), the timed reward-process pool both run in (``processes``) and users' reward functions (``user``)."""
