"""The README, followed as a newcomer follows it: its commands run in order in a fresh folder, each block
succeeds, and every line of the ```text block after it (what it says the commands print) is in their
output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """The README's fenced blocks in order: (language, body)."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def _normal(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text)


def test_readme_blocks_are_found():
    """The parser sees the quick start, the runnable commands and the quoted output."""
    found = blocks(README.read_text())
    assert found[0] == ("", "make demo\nmake test\n")
    assert sum(lang == "sh" for lang, _ in found) >= 4 and sum(lang == "text" for lang, _ in found) >= 4


@pytest.mark.slow
def test_readme_commands_in_order(tmp_path):
    """`make demo` (its recipe is `tosakit demo`), then each ```sh block in a fresh folder with the venv on
    PATH; a ```text block lists lines the block before it prints."""
    assert re.search(r"^demo: .*\n\t\$\(VENV\)/bin/tosakit demo$", (ROOT / "Makefile").read_text(), re.M)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("TOSAKIT_DEBUG", None)
    output = None
    for k, (lang, body) in enumerate(blocks(README.read_text())):
        if lang == "" and body.startswith("make demo\n"):
            body = "tosakit demo"
        elif lang != "sh" and lang != "text":
            continue
        if lang == "text":
            assert output is not None, f"block {k}: quoted output with no command before it"
            missing = [line for line in body.splitlines() if line.strip() and _normal(line.strip()) not in output]
            assert not missing, f"block {k}: not printed: {missing}\n--- output:\n{output[-3000:]}"
            continue
        done = subprocess.run(["bash", "-e", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)
        output = _normal(done.stdout + done.stderr)
        assert done.returncode == 0, f"block {k} failed ({done.returncode}):\n{body}\n--- output:\n{output[-3000:]}"
        assert "Traceback" not in output, output[-3000:]


def test_readme_names_every_builtin_model():
    """The option table's `-m` row and the `tosakit models` line count the zoo as it is."""
    from tosakit.zoo import MODELS

    text = README.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `-m/--model_name`"))
    assert all(f"`{name}`" in row for name in MODELS), [n for n in MODELS if f"`{n}`" not in row]
    assert f"# the {len(MODELS)} built-in models" in text
