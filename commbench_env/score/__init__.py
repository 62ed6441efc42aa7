"""The score stage: a judge result becomes a reward (`reward`), against reference figures measured once per
hardware and cached (`reference`)."""
