"""Optional parts of Forge (the `ray` and `benchmarks` extras): without them installed, the feature that needs
them says which extra to install, and nothing else imports them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from forge import ForgeError
from forge.config import load_config


def test_the_ray_executor_without_ray_names_the_extra(monkeypatch):
    from pretrain.data import ray_executor

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees when Ray is not installed
    with (
        pytest.raises(ForgeError, match=r"forge-slm\[ray\].*data.executor=local"),
        ray_executor.session(load_config(None).data, workers=1),
    ):
        pass


def test_benchmarks_without_lm_eval_name_the_extra(monkeypatch, tmp_path):
    from evaluation.benchmarks import run_benchmarks

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ForgeError, match=r"forge-slm\[benchmarks\]"):
        run_benchmarks(tmp_path, ["arc_easy"], [], tmp_path / "out", load_config(None).eval, seed=0)


@pytest.mark.integration
def test_no_stage_imports_an_extra_until_it_is_asked_for():
    code = (
        "import sys, forge.cli, pretrain.data.stage, evaluation.stage, finetune.sft, serve.stage\n"
        "print(sorted(m for m in ('ray', 'lm_eval') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
