from spreeze.common.service import run_service
from spreeze.services.visualizer.main import Visualizer

run_service(Visualizer)
