from spreeze.common.service import run_service
from spreeze.services.critic_learner.main import CriticLearner

run_service(CriticLearner)
