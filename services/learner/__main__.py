from common.service import run_service
from services.learner.main import Learner

run_service(Learner)
