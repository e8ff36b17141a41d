from spreeze.common.service import run_service
from spreeze.services.actor_learner.main import ActorLearner

run_service(ActorLearner)
