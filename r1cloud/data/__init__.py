"""The prompt sets: data files read into rows (loader) and rendered through the Jinja format prompt
and the chat template (prompts)."""
