"""The explorer role: sampling groups of responses (single-turn or episodes), scoring them, and evaluation."""
