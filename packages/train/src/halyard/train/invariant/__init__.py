"""The invariant step's arithmetic: the same bits on any split of the batch over the data-like mesh axes.

A sum whose operands are split over devices is, by default, a local partial sum per device followed by an
all-reduce, so its rounding depends on how many devices there are. Here every reduction that crosses
rows of the batch has a fixed shape and a fixed order that the config alone decides:

- the batch is cut into ``slices`` canonical slices of equal rows (a power of two); each slice's loss and
  gradient is one iteration of the same scanned computation, on a device that holds the whole slice and
  the weights it runs with (so no contraction is split over devices): FSDP's weights are gathered as FSDP
  gathers them, each layer stack one layer at a time inside its scan (`view`, `gathers`);
- slice results are added in one pairwise tree over the slice index (adjacent pairs, level by level;
  `trees`). With FSDP the batch devices run adjacent slices side by side, so the tree's lower levels add
  them across the devices as each layer's gradient is produced, onto its shards (the traffic of a
  reduce-scatter), and its upper levels add a device's steps; with whole weights a device runs a contiguous
  block of slices, adds them itself, and the blocks are added once (`slices`). The same tree on 1 device or 64;
- norms (the gradient norm for clipping and the logs, the parameter and update norms) add fixed chunks of
  each leaf in fixed trees (`canonical_norm`), each device the chunks of its shard;
- the optimizer's update runs where the weights are (each FSDP device its shard) between barriers
  (`isolated`): an elementwise optimizer (AdamW, Lion) rounds the same on a shard as on the whole leaf.

Its modules (`slices`, `trees`, `norms`, `update`, `view`, `gathers`) are the step's internals: import from them;
halyard-train's public names are `halyard.train`'s.
"""
