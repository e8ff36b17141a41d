from common.service import run_service
from services.critic_learner.main import CriticLearner

run_service(CriticLearner)
