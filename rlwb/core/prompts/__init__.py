"""The prompts engines are measured on: `generated` (the task's, or open-ended text from the chat model's
held-out corpus) and `from_file` (an RL team's own training prompts)."""
