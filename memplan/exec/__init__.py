"""memplan.exec: run a step program in real PyTorch training (see memplan.workflows.optimize)."""
