from spreeze.common.service import run_service
from spreeze.services.learner.main import Learner

run_service(Learner)
