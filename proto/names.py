"""Names proto/SPEC.md fixes: the roles a service registers as (§4.9) and the sockets of a run (§3)."""

from __future__ import annotations

SAMPLER, REPLAY, EVALUATOR, VISUALIZER = "sampler", "replay", "evaluator", "visualizer"
LEARNER, ACTOR_LEARNER, CRITIC_LEARNER = "learner", "actor_learner", "critic_learner"
ROLES = (SAMPLER, REPLAY, LEARNER, ACTOR_LEARNER, CRITIC_LEARNER, EVALUATOR, VISUALIZER)
LEARNER_ROLES = (LEARNER, CRITIC_LEARNER, ACTOR_LEARNER)  # the roles that train networks and report `updates`

# the endpoints a Welcome names (socket name -> endpoint), one per socket of the run
SOCKETS = ("control", "metrics_in", "metrics_out", "experience", "sample", "actor_weights", "actor_sync",
           "critic_sync")
