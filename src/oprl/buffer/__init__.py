"""The experience buffer (fresh batches, the replay pool) and the experience store on disk (parquet)."""
