"""Where and when: experiences, the off-policy schedule, explorer, trainer, warm start and the run loop."""
