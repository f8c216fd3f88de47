"""BFCL function calling: the single-turn task (``single_turn``), the multi-turn task (``multi_turn``) over
oprl's simulated APIs (``apis``), and the tool-call parsing and reward both score with (``toolcall``)."""
