"""`tune`'s pure parts: the knobs a tune tries and how a value is written into a spec (knobs), and the decision over
the trials (decide: noise from the repeated baseline, samples per hour or time to a target reward, what is kept)."""
