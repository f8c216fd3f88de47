"""Data of the dataset-backed tasks: rows from local files or ``datasets`` (``files``), the user's own dataset
task (``dataset``) and the plumbing of the math-verify-scored tasks gsm8k and math (``verified``)."""
