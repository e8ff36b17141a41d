from spreeze.common.service import run_service
from spreeze.services.replay.main import Replay

run_service(Replay)
