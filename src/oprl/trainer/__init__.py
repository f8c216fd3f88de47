"""The trainer role: one batch of groups in, an optimizer step out; its ranks (FSDP2/DDP) and the warm start."""
