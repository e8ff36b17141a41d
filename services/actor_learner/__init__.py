"""Actor-learner: owns the actor (and SAC's temperature); follows the critic-learner's critics."""
