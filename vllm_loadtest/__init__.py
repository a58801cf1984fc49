"""The distribution's one namespace: `vllm_loadtest.analysis`, `.locustfiles` and `.embedded_vllm`.

Installed (`pip install .`), setuptools puts the three folders inside this package, so nothing of the suite lands in
site-packages under a generic top-level name. In a checkout they stay where the project's layout documents them,
beside this folder: the package's search path then includes the checkout's root, so the same imports work from
both without installing.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
if not (_HERE / "analysis").is_dir() and (_HERE.parent / "analysis" / "__init__.py").is_file():
    __path__.append(str(_HERE.parent))
