from common.service import run_service
from services.evaluator.main import Evaluator

run_service(Evaluator)
