"""Critic-learner: owns the twin critics and their targets; follows the actor-learner's actor."""
