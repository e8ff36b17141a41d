"""Visualizer: live dashboard in the browser and TensorBoard event files from the metrics bus."""
