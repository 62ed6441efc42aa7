"""Inside the sandbox, trusted: the judge server, the coordinator of one evaluation and its secretless spawner,
the static check and the CUDA build. It holds the secret and the hidden cases, measures and verifies, and never
runs candidate code. It reaches the processes that do through one interface (`rank_group.RankGroup`), with one
implementation per way of running ranks: torch ranks (a process each) and the CUDA device host."""
