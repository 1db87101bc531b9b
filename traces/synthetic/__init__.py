"""Synthetic sparse-attention selections: a sampled model of a lightning indexer's top-k, fast and stateless.

Model (what a drifting query scored against clustered keys looks like from the cache's side):
- **sink**: the first `num_sink` positions are always selected; **recency**: the newest `num_recent` positions are
  always selected (so freshly decoded tokens are read at once).
- The rest of the history is cut into k' = top_k - sink - recent **strata** (runs of ~history/k' positions) and each
  stratum contributes exactly one position, so a set never holds a duplicate and needs no sort or dedupe. A stratum
  is one of three kinds (per group, drawn from a hash):
  * **stable** (heavy hitters): one salient key, the same every step; it drifts to another key every `drift_steps`.
  * **recurring** (a key cluster): 2..6 salient keys; each step the query picks one of them at random, so the
    position recurs often but not every step (the cluster's keys drift too).
  * **fresh** (noise): any position of the stratum, drawn anew each step.
  The mixture weights are solved per group from the target step-to-step overlap (docs/architecture.md: ~44% in deep groups,
  spread 35-50%; ~1.5% in the first two, below the ~3% of random sets: there, fresh picks alternate position
  parity from step to step, a positional/RoPE-like pattern that makes consecutive sets nearly disjoint).
- **Adjacent groups** share each stratum's whole random process unless a band boundary (every `band_groups` groups,
  staggered per stratum) separates them: high similarity between neighbouring indexer groups.
- **Speculative query tokens** of one step reuse query 0's draw for a stratum with probability `spec_share`, else draw
  independently: high overlap between the query tokens of one step.
Strata live on a fixed power-of-two domain (chosen from the history length with slack) so that a growing history
does not move them; strata beyond the history fold onto the upper half of their mirror stratum. The result is a
pure function of (seed, request_id, step, group, query index, history_len): nothing depends on call order.
Spatial clustering of selected positions is not modeled: the caches that replay these traces are token-granular.

Modules: `spec` (SelectionSpec, the parameters), `plan` (a group's solved mixture and per-stratum constants),
`geometry` (strata on a domain, the history-length terms), `draws` (per-step hashing kernels), `source`
(SyntheticSelections: select / select_groups and their caches), `device` (DeviceSelections: the same draws on a
CUDA device, kernel `draw.cu`; imported on use, cupy only then).
"""
from traces.synthetic.plan import GroupPlan
from traces.synthetic.source import SyntheticSelections, check_select_args
from traces.synthetic.spec import GENERATOR, MAX_HISTORY_TOKENS, MODEL_GROUPS, SelectionSpec

__all__ = ["GENERATOR", "MAX_HISTORY_TOKENS", "MODEL_GROUPS", "GroupPlan", "SelectionSpec", "SyntheticSelections",
           "check_select_args"]
