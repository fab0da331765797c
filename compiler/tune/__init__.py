"""Auto-tuning: schedule spaces that templates declare (space.py) and the tasks a model's groups make (task.py).
Schedules import space.py alone; the rest of tune/ sits beside the drivers and may see every stage before codegen."""
