"""The River application, apart from the method: the `river` command (main.py), calibration
without training (calibrate.py) and the profiles it saves (profile.py), prompt files and the
bundled GSM8K slices (prompts.py, data/)."""
