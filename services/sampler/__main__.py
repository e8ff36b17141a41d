from spreeze.common.service import run_service
from spreeze.services.sampler.main import Sampler

run_service(Sampler)
