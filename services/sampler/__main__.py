from common.service import run_service
from services.sampler.main import Sampler

run_service(Sampler)
