"""The fine-tune command on a tiny byte-vocabulary llama: its model and text files, and one
run of ``ggopt finetune`` with its exit status and output (shared by the CLI tests)."""

from __future__ import annotations

from pathlib import Path

from ggopt.cli.finetune import main
from ggopt.models import llama
from tests.support.llama_files import write

TEXT = ("GNU GENERAL PUBLIC LICENSE. Everyone is permitted to copy and distribute verbatim "
        "copies of this license document, but changing it is not allowed. ") * 12


def model_and_text(tmp_path: Path, cfg: llama.Config,
                   name: str = "tiny.gguf") -> tuple[Path, Path]:
    """``cfg``'s random model and a licence text of ~1.7 KB in ``tmp_path``."""
    model = tmp_path / name
    write(model, cfg)
    text = tmp_path / "data.txt"
    text.write_text(TEXT)
    return model, text


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    """``ggopt finetune ARGV``: (exit status, stdout, stderr)."""
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err
