from common.service import run_service
from services.replay.main import Replay

run_service(Replay)
