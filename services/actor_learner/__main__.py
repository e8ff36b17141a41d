from common.service import run_service
from services.actor_learner.main import ActorLearner

run_service(ActorLearner)
