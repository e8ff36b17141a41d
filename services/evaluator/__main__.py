from spreeze.common.service import run_service
from spreeze.services.evaluator.main import Evaluator

run_service(Evaluator)
