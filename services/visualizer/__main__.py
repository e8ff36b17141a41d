from common.service import run_service
from services.visualizer.main import Visualizer

run_service(Visualizer)
