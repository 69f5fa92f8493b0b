"""Analysis: an fx joint graph lowered to facts (values, op facts, bytes, the
schedule the simulator replays, recompute costs)."""
