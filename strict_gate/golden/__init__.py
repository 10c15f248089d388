"""The golden (docs/golden.md), a feature in one folder: a third engine, typically transformers in
float64, that votes at each first divergence of a gate for the side whose token is its argmax
(`vote.py`, the one `vote` every caller shares), and checks the reference's own tokens against
it (`strict-gate golden`, `command.py`); the `[golden]` table (`config.py`), its result and the
exit code rule (`result.py`), its loader (`load.py`), its phase (`feature.py`) and its rendering
(`render.py`)."""
