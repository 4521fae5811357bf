"""The planning kit: every rule that more than one planner applies, defined once, named for what it decides.

| module | what it decides |
| --- | --- |
| `saved` | which storages are saved activations, and the gap each can leave memory for |
| `candidates` | every gap a storage can leave memory for (AutoSwap's candidates, milp's units) |
| `gaps` | whether the trace holds a storage at an op, whether an op is inside a gap; the load with a set of gaps away |
| `replayable` | whether a recomputation can be replayed (an input overwritten before it, inputs gone) |
| `rebuild` | what a recomputation relies on while gaps are decided one at a time |
| `prefetch` | when a swapped storage is prefetched (layer lead; paper 002 §4.5); the order decisions are listed in |
| `cover` | a plan of few swaps: the largest storage away at the op most over the budget, again until none is |
| `fitting` | the smallest budget a plan fits; the plans of other planners that fit |
| `featuremaps` | feature maps and how a keep/swap/recompute policy over them becomes decisions |
| `policy` | a policy's simulated score |
| `refine` | the local search over policies |
| `ledger` | saved-activation gaps decided one at a time and the load they leave |
| `ops` | an op's aten name, which ops are convolutions, unconstrained op start times |
| `blocks` | the model's blocks (the module calls torch.utils.checkpoint users wrap) |
| `plan_search` | the local search on a plan's own decisions (auto's refinement) |
| `searched` | what a search reports of itself: plans evaluated, and how fast |
| `linear` | the columns and sparse rows of a linear program (milp's MILP, the bound's LP) |

The proven lower bound of every plan is a package of its own, `memplan.planners.bound`.

The kit imports no planner family (only `memplan.planners.base` of this package), and
`tests/planners/test_kit.py` fails when a module outside it defines one of `RULES` (or a
former name of one) again.
"""

# Every rule of the kit by name, with the module that defines it.
RULES = {
    "SavedGap": "saved", "saved_activations": "saved", "saved_gaps": "saved", "first_backward_access": "saved",
    "last_access_before": "saved", "first_backward_op": "saved",
    "Candidates": "candidates", "find_candidates": "candidates",
    "alive_at": "gaps", "gap_covers": "gaps", "away_mask": "gaps", "load_without": "gaps",
    "input_overwritten": "replayable", "can_replay": "replayable", "replayable": "replayable",
    "Rebuilder": "rebuild",
    "lead_trigger": "prefetch", "backward_layer_starts": "prefetch", "prefetch_triggers": "prefetch",
    "gap_decisions": "prefetch", "in_issue_order": "prefetch", "issue_key": "prefetch",
    "largest_first": "cover",
    "smallest_fitting_budget": "fitting", "fitting_plans": "fitting",
    "FeatureMaps": "featuremaps", "feature_maps": "featuremaps", "Decoder": "featuremaps",
    "PolicyEvaluator": "policy",
    "Refiner": "refine", "policy_of": "refine",
    "Ledger": "ledger",
    "aten_name": "ops", "is_convolution": "ops", "CONV_OPS": "ops", "op_starts": "ops",
    "block_calls": "blocks",
}
